"""Soak test: a study of faulty trials whose driver is SIGKILLed and resumed; nothing may be lost.

Runs the real CLI (``autotune run``) on the fake engine with 4 trial slots (4 fake GPUs, so
GPU leases are taken), ``--trials`` configurations enqueued up front, about 30% of them
faulty: crash, hang past the trial timeout, OOM, NaN metrics, garbage output, a slow start
and a child process that ignores SIGTERM. The driver is stopped at random moments and
started again (the same command resumes the study): SIGKILLed ``--kills`` times, sent
SIGTERM ``--sigterms`` times (a clean stop, exit 143), Ctrl-C ``--sigints`` times (exit 130); in the first run one Ray worker is
SIGKILLed mid-trial; in the last, a second driver of the study (``--rivals``) must be refused.

At the end it reads Optuna's storage (the truth), the MLflow store and /proc, and prints:
trials requested / measured / lost (a requested configuration with no finished,
non-interrupted trial), duplicates, RUNNING or WAITING left in Optuna, MLflow child runs vs
Optuna trials, processes left behind (descendants of every driver, the trials' process
groups, anything naming the study's paths), GPU leases held, SIGTERM and Ctrl-C exit codes, the second
driver's answer, native stack dumps, wall time. Exit 0 when all hold: 0 lost, 0 RUNNING,
MLflow = Optuna, 0 processes and leases left, SIGTERM = 143, Ctrl-C = 130, rival refused, no stack dump.

Run: ``python bench/soak.py [--trials 200] [--kills 5] [--sigterms 2] [--sigints 1] [--json OUT.json]``
(about 5-8 minutes on 2 cores; ``--smoke`` is the test suite's short version).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
FAULTS = ("crash", "hang", "oom", "nan", "garbage", "slow", "stubborn")
CLEAN = {signal.SIGTERM: 143, signal.SIGINT: 130}  # the stops that export first, and their exit codes
GRACE_S = 60.0  # leftovers are polled this long (watchdogs notice a dead parent in 0.5 s; SIGTERM grace is 5 s)
SLOW_S = 3.0  # a slow start, still inside the trial timeout


def plan(n_trials: int, faulty: float, seed: int) -> list[dict]:
    """The enqueued configurations: unique ``x`` per item, about ``faulty`` of them faulty."""
    rng = random.Random(seed)
    n_bad = round((n_trials - 1) * faulty)
    kinds = [FAULTS[i % len(FAULTS)] for i in range(n_bad)] + ["none"] * (n_trials - 1 - n_bad)
    rng.shuffle(kinds)
    items = []
    for i, kind in enumerate(kinds):
        x = round((i + 1) / (n_trials + 1), 6)
        item = {"x": x if x != 0.5 else 0.500001, "y": round(rng.random(), 6)}  # 0.5: baseline
        if kind == "slow":
            item["duration_s"] = SLOW_S
        elif kind != "none":
            item[kind] = True
        items.append(item)
    return items


def write_preset(work: Path, args: argparse.Namespace, items: list[dict]) -> None:
    conf = {
        "defaults": ["base", {"engine": "fake"}, {"workload": "short"}, "_self_"],
        "study": {"name": "soak", "dir": str(work / "studies" / "soak"), "n_trials": args.trials,
                  "sampler": "random", "seed": args.seed, "trial_timeout_s": args.trial_timeout,
                  "enqueue": items},
        "engine": {"settings": {"gpus": [{"name": "fake", "memory_gb": 24}] * args.slots,
                                "record_dir": str(work / "records")}},
        "space": {"x": {"type": "float", "low": 0.0, "high": 1.0},
                  "y": {"type": "float", "low": 0.0, "high": 1.0},
                  "duration_s": {"type": "categorical", "choices": [0.0, SLOW_S]},
                  **{k: {"type": "bool"} for k in FAULTS if k != "slow"}},
        "objectives": ["decode_tps"], "constraints": [],
        "workload": {"max_tokens": 16, "warmup": 0, "repeats": 2},
        "quality": {"enabled": False},
        "select": {"top_k": 0},
        # report.html yes, its PNGs no: kaleido's headless Chromium hung once at a study's end under
        # CI's load (2026-11-27), and the soak is about kills and resumes, not image export
        "report": {"png": False},
        "tracking": {"uri": f"sqlite:///{work}/mlruns/mlflow.db",
                     "artifacts": str(work / "mlruns" / "artifacts")},
        "ray": {"num_cpus": args.slots, "num_gpus": args.slots, "max_concurrent": args.slots},
    }
    (work / "conf").mkdir(parents=True, exist_ok=True)
    (work / "conf" / "soak.yaml").write_text(yaml.safe_dump(conf, sort_keys=False))


# ---- /proc -----------------------------------------------------------------------------
def _stat(pid: int) -> tuple[int, int, str, int] | None:
    """(ppid, pgrp, state, start time) of a process, or None."""
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return int(rest[1]), int(rest[2]), rest[0], int(rest[19])


def all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def alive(proc: tuple[int, int]) -> bool:
    """``proc`` = (pid, start time): still running (not a zombie, not a reused pid)."""
    st = _stat(proc[0])
    return st is not None and st[2] != "Z" and st[3] == proc[1]


def descendants(root: int) -> set[tuple[int, int]]:
    """(pid, start time) of every live descendant of ``root``."""
    children: dict[int, list[int]] = {}
    for pid in all_pids():
        st = _stat(pid)
        if st:
            children.setdefault(st[0], []).append(pid)
    out, todo = set(), [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return {(p, st[3]) for p in out if (st := _stat(p))}


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace").replace("\0", " ")
    except OSError:
        return ""


def ray_trial_workers(driver: int) -> list[int]:
    return [p for p, _ in descendants(driver) if cmdline(p).startswith("ray::_run_remote")]


# ---- the run -----------------------------------------------------------------------------
def run_driver(work: Path, kill_after: float | None, kill_ray_worker: bool, seen: set,
               log, stop: int = signal.SIGKILL, rival: bool = False,
               kill_starts: int | None = None) -> tuple[int | None, bool, Any]:
    """One ``autotune run``; send it ``stop`` after ``kill_after`` s, or sooner once
    ``kill_starts`` trials have started (on a fast box the study could end before the clock);
    with ``rival``, start a second driver of the study once the first trial runs. (exit code or
    None when SIGKILLed, worker killed, the rival's (exit code, first stderr line, holder pid) or
    None)."""
    # TMPDIR: the GPU lease files (autotune.run.cluster.LEASE_DIR) of this soak's trials live in
    # the work dir, so leases held by other studies on the machine are not counted.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token",
           "TMPDIR": str(work / "tmp"), "RAY_TMPDIR": os.environ.get("RAY_TMPDIR", "/tmp/ray")}
    argv = [sys.executable, "-m", "autotune.cli", "run", "--config-dir", str(work / "conf"), "conf=soak"]
    proc = subprocess.Popen(argv, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    first = None  # when the first trial of this run started (the kill clock starts there)
    starts = _n_starts(work)
    worker_killed, second = False, None
    while proc.poll() is None:
        time.sleep(0.5)
        seen |= descendants(proc.pid)
        if rival and second is None and lock_holder(work) == proc.pid:  # even with no trial left
            second = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
            print("  started a second driver of the same study", flush=True)
        if first is None:
            if _n_starts(work) == starts:
                continue
            first = time.monotonic()
        elapsed = time.monotonic() - first
        new_starts = _n_starts(work) - starts
        halfway = elapsed > (kill_after or 20) / 2 or (kill_starts is not None and 2 * new_starts >= kill_starts)
        if kill_ray_worker and not worker_killed and halfway:
            workers = ray_trial_workers(proc.pid)
            if workers:
                os.kill(random.choice(workers), signal.SIGKILL)
                worker_killed = True
                print(f"  killed Ray worker at {elapsed:.1f} s", flush=True)
        due = kill_starts is not None and new_starts >= kill_starts
        if kill_after is not None and (elapsed > kill_after or due):
            seen |= descendants(proc.pid)
            if stop in CLEAN:  # a clean stop: trials interrupted, exports written
                proc.send_signal(stop)
                code = proc.wait(timeout=300)
                print(f"  sent {stop.name} to the driver at {elapsed:.1f} s: exit {code}", flush=True)
                return code, worker_killed, None
            proc.kill()
            proc.wait()
            print(f"  SIGKILLed the driver at {elapsed:.1f} s", flush=True)
            return None, worker_killed, None
    answer = None
    if second is not None:
        _, err = second.communicate(timeout=300)
        line = next((x for x in err.splitlines() if x.startswith("autotune")), err.strip()[-300:])
        answer = (second.returncode, line, proc.pid)
        print(f"  second driver: exit {second.returncode}: {line[:160]}", flush=True)
    return proc.returncode, worker_killed, answer


def lock_holder(work: Path) -> int | None:
    """The pid in the study's lock file (autotune.record.lock), None if empty or absent."""
    try:
        return int(json.loads((work / "studies" / "soak" / ".lock").read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _n_starts(work: Path) -> int:
    path = work / "records" / "records.jsonl"
    return path.read_bytes().count(b'"event": "start"') if path.exists() else 0


def _n_started_trials(work: Path) -> int:
    """How many distinct trials have started (re-runs of an interrupted one count once)."""
    from autotune.engines.fake import read_records

    return len({r["trial"] for r in read_records(work / "records") if r.get("event") == "start"})


def leases_held(work: Path) -> list[str]:
    """The soak's GPU lease lock files that someone still holds."""
    held = []
    for path in (work / "tmp").glob("autotune-gpu-leases/*/gpu*.lock"):
        fd = os.open(path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held.append(str(path))
        finally:
            os.close(fd)
    return held


def leftovers(work: Path, seen: set) -> dict[str, list[int]]:
    """Processes still alive: drivers' descendants, trials' process groups, the study's paths."""
    from autotune.engines.fake import read_records

    records = read_records(work / "records")
    pgids = {r["pgid"] for r in records}
    mine, pid = set(), os.getpid()  # this process and its ancestors (a `timeout` wrapper...)
    while pid > 1 and (st := _stat(pid)):
        mine.add(pid)
        pid = st[0]
    by_group, by_path = [], []
    for pid in all_pids():
        st = _stat(pid)
        if st is None or st[2] == "Z" or pid in mine:
            continue
        if st[1] in pgids:
            by_group.append(pid)
        if str(work) in cmdline(pid):
            by_path.append(pid)
    child_pids = {r["child_pid"] for r in records if r.get("event") == "child"}
    return {"descendants": sorted(p for p, start in seen if alive((p, start))),
            "process_groups": sorted(by_group), "study_paths": sorted(by_path),
            "sigterm_ignoring_children": sorted(p for p in child_pids if _stat(p) and _stat(p)[2] != "Z")}


def audit(work: Path, items: list[dict], n_trials: int) -> dict:
    """Compare Optuna (the truth) with the plan and with MLflow."""
    import optuna
    from mlflow.tracking import MlflowClient
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="soak", storage=f"sqlite:///{work}/studies/soak/optuna.db")
    trials = study.get_trials(deepcopy=False)
    done = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)]
    interrupted = [t for t in done if t.user_attrs.get("kind") == "interrupted"
                   or str(t.user_attrs.get("reason", "")).startswith("interrupted")]
    measured = [t for t in done if t not in interrupted]
    xs = [round(float(t.params.get("x", t.user_attrs.get("params", {}).get("x", -1))), 6) for t in measured]
    wanted = [round(i["x"], 6) for i in items]
    rerun_of = {t.number: t.user_attrs.get("rerun_of") for t in trials}

    def first_of(number: int) -> int:  # a re-run (of a re-run...) after a stop -> the first trial
        while rerun_of.get(number) is not None:
            number = rerun_of[number]
        return number

    # trial 0, or its re-run when a stop cut it (the driver's baseline is the same configuration)
    baseline = [t for t in measured if first_of(t.number) == 0 or t.user_attrs.get("role") == "baseline"]
    lost = [x for x in wanted if x not in xs]
    dupes = sorted({x for x in xs if xs.count(x) > 1 and x in wanted})
    client = MlflowClient(tracking_uri=f"sqlite:///{work}/mlruns/mlflow.db")
    exp = client.get_experiment_by_name("soak")
    runs = client.search_runs([exp.experiment_id], max_results=5000) if exp else []
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    child_numbers = sorted(int(r.data.tags.get("autotune.trial", -1)) for r in children)
    statuses: dict[str, int] = {}
    for t in measured:
        s = str(t.user_attrs.get("status", t.state.name.lower()))
        statuses[s] = statuses.get(s, 0) + 1
    return {
        "requested": n_trials, "measured": len(measured), "lost": len(lost) + (0 if baseline else 1),
        "duplicates": len(dupes), "interrupted": len(interrupted),
        "running": sum(t.state == TrialState.RUNNING for t in trials),
        "waiting": sum(t.state == TrialState.WAITING for t in trials),
        "optuna_finished": len(done), "mlflow_child_runs": len(children),
        "mlflow_missing": len(set(t.number for t in done) - set(child_numbers)),
        "mlflow_extra": len(set(child_numbers) - set(t.number for t in done)),
        "mlflow_parents": len(parents),
        "parent_status": parents[0].info.status if parents else None,
        "statuses": statuses,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--kills", type=int, default=5, help="driver SIGKILLs")
    ap.add_argument("--sigterms", type=int, default=2, help="driver SIGTERMs (each must exit 143)")
    ap.add_argument("--sigints", type=int, default=1, help="driver Ctrl-Cs, SIGINT (each must exit 130)")
    ap.add_argument("--rivals", type=int, default=1, choices=(0, 1),
                    help="start a second driver of the study during the last run (must be refused)")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--faulty", type=float, default=0.3, help="share of faulty trials")
    ap.add_argument("--trial-timeout", type=float, default=10.0, help="study.trial_timeout_s")
    ap.add_argument("--kill-window", type=float, nargs=2, default=(2.0, 30.0),
                    help="a kill comes this many seconds (uniform) after a run's first trial starts")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-runs", type=int, default=12, help="give up after this many driver runs")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--keep", help="work in this directory (kept) instead of a temporary one")
    ap.add_argument("--smoke", action="store_true",
                    help="16 trials, one of each fault, 1 driver kill then 1 SIGTERM (what the test suite runs)")
    args = ap.parse_args(argv)
    if args.smoke:  # each stop lands mid-study (once a third of the trials left have started)
        args.trials, args.kills, args.kill_window = 16, 1, (2.0, 6.0)
        args.faulty = len(FAULTS) / (args.trials - 1)  # one trial of each fault
        args.sigterms, args.sigints = min(args.sigterms, 1), 0
    rng = random.Random(args.seed)
    random.seed(args.seed)
    t0 = time.time()
    tmp = None if args.keep else tempfile.TemporaryDirectory(prefix="soak")
    work = Path(args.keep or tmp.name).resolve()
    (work / "tmp").mkdir(parents=True, exist_ok=True)
    items = plan(args.trials, args.faulty, args.seed)
    write_preset(work, args, items)
    seen: set[tuple[int, int]] = set()
    kills, codes, worker_killed, rival = 0, [], False, None
    clean: dict[signal.Signals, list[int]] = {s: [] for s in CLEAN}  # exit codes of the clean stops
    stops = [signal.SIGKILL] * args.kills + [signal.SIGTERM] * args.sigterms + [signal.SIGINT] * args.sigints
    if args.smoke:  # the kill first: Ray's agents of a SIGKILLed driver's node exit on their
        stops.sort(key=lambda s: s != signal.SIGKILL)  # own after about 60 s, meanwhile the rest runs
    else:
        rng.shuffle(stops)
    with open(work / "driver.log", "ab") as log:
        for run in range(args.max_runs):
            stop = stops[run] if run < len(stops) else None
            kill_after = rng.uniform(*args.kill_window) if stop else None
            print(f"run {run + 1}: " + (f"{stop.name} after {kill_after:.1f} s" if stop else "to the end"),
                  flush=True)
            # the stop also comes once a third of the trials left have started, so it lands
            # mid-study however fast the box is
            kill_starts = max(1, (args.trials - _n_started_trials(work)) // 3) if stop else None
            code, wk, answer = run_driver(work, kill_after, not worker_killed, seen, log,
                                          stop or signal.SIGKILL, rival=stop is None and args.rivals > 0,
                                          kill_starts=kill_starts)
            worker_killed |= wk
            rival = answer or rival
            if code is None:
                kills += 1
                continue
            if stop in CLEAN and code != 0:  # 0: the study ended before the signal
                clean[stop].append(code)
                continue
            codes.append(code)
            break
        if args.rivals and rival is None:  # the study ended before its last run: one more, finished
            print("run to the end again, with a second driver", flush=True)
            code, _, rival = run_driver(work, None, False, seen, log, rival=True)
            codes.append(code)
    dumps = (work / "driver.log").read_bytes().count(b"*** SIG")  # Ray's native stack dump
    # Ray's node processes of a SIGKILLed driver notice its death and exit on their own, but
    # on a loaded box that can take longer than the grace: poll up to GRACE_S, then report
    deadline = time.monotonic() + GRACE_S
    left = leftovers(work, seen)
    while any(left.values()) and time.monotonic() < deadline:
        time.sleep(1.0)
        left = leftovers(work, seen)
    held = leases_held(work)
    res = audit(work, items, args.trials)
    wall = time.time() - t0
    res.update(kills=kills, ray_worker_killed=worker_killed, final_exit=codes[-1] if codes else None,
               processes_left={k: len(v) for k, v in left.items()}, leases_held=len(held),
               wall_s=round(wall, 1), faulty_planned=sum(len(i) > 2 or "duration_s" in i for i in items),
               sigterm_exits=clean[signal.SIGTERM], sigint_exits=clean[signal.SIGINT], stack_dumps=dumps,
               rival_exit=rival[0] if rival else None, rival_line=rival[1] if rival else None)
    rival_ok = args.rivals == 0 or (rival is not None and rival[0] == 2 and f"pid {rival[2]}" in rival[1])
    res["rival_refused"] = rival_ok
    ok = (res["lost"] == 0 and res["running"] == 0 and res["mlflow_missing"] == 0
          and res["mlflow_extra"] == 0 and not any(res["processes_left"].values())
          and res["leases_held"] == 0 and res["final_exit"] == 0
          and all((n == 0 or bool(clean[s])) and all(c == CLEAN[s] for c in clean[s])
                  for s, n in ((signal.SIGTERM, args.sigterms), (signal.SIGINT, args.sigints)))
          and dumps == 0 and rival_ok and kills == args.kills)
    res["ok"] = ok
    rows = [
        ("trials requested / measured / lost", f"{res['requested']} / {res['measured']} / {res['lost']}"),
        ("duplicates measured", res["duplicates"]),
        ("interrupted (re-run, not counted)", res["interrupted"]),
        ("faulty planned; outcomes", f"{res['faulty_planned']}; {res['statuses']}"),
        ("RUNNING / WAITING left in Optuna", f"{res['running']} / {res['waiting']}"),
        ("MLflow child runs vs Optuna trials",
         f"{res['mlflow_child_runs']} vs {res['optuna_finished']} (missing {res['mlflow_missing']}, "
         f"extra {res['mlflow_extra']})"),
        ("MLflow parent runs (status)", f"{res['mlflow_parents']} ({res['parent_status']})"),
        ("driver SIGKILLs / Ray worker killed", f"{kills} / {worker_killed}"),
        ("driver SIGTERMs (exit codes; 143 expected)", f"{len(clean[signal.SIGTERM])} ({clean[signal.SIGTERM]})"),
        ("driver Ctrl-Cs (exit codes; 130 expected)", f"{len(clean[signal.SIGINT])} ({clean[signal.SIGINT]})"),
        ("native stack dumps in the drivers' log", dumps),
        ("second driver beside the last run",
         "not started" if args.rivals == 0 else
         f"exit {res['rival_exit']}" + (" (refused, names the holder)" if rival_ok else
                                        f" NOT REFUSED: {res['rival_line']}")),
        ("processes left (descendants, groups, paths, SIGTERM-ignoring)",
         " / ".join(str(v) for v in res["processes_left"].values())),
        ("GPU leases held", res["leases_held"]),
        ("final exit code", res["final_exit"]),
        ("wall time", f"{wall:.0f} s"),
    ]
    width = max(len(r[0]) for r in rows)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))
    for kind, pids in left.items():
        for pid in pids[:3]:
            print(f"  left ({kind}): {pid} {cmdline(pid)[:150]}")
    print("PASS" if ok else "FAIL", f"(work dir {work})" if args.keep else "")
    for pids in left.values():  # never leave anything behind, even when the check failed
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    if tmp is not None:
        tmp.cleanup()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
