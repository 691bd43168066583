"""The lease's TabbyAPI steps: a real TabbyAPI started with the config autotune exported.

``main`` (TabbyAPI's main branch, ExLlamaV3): with the tiny EXL3 model the ``models`` stage
made (variant ``e4``), the exllamav3 engine's baseline is exported by the engine's own
``export`` (what ``autotune export`` writes: ``tabbyapi.yml``), copied as ``config.yml`` into a
fresh folder with only the network block changed for the check (a free port,
``disable_auth: true``), and TabbyAPI's ``main.py`` (``bench/gpu/tabbyAPI``, prepared here:
``prepare.sh``) is started there. One chat completion is asked; the row records TabbyAPI's load
line, the completion, the TabbyAPI commit and the GPU memory it holds (NVML, idle subtracted,
as the trials measure) against the trial's baseline row. ``exl2`` does the same with the
exllamav2 export of the 4 bpw EXL2 model on the ``exl2-checkpoint`` branch
(``bench/gpu/tabbyAPI-exl2``). Without a GPU the export is still written and the row says
skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from autotune._files import write_atomic
from autotune.registry import get_engine_class
from bench.gpu.kit.stages import RowLog

KIT = Path(__file__).resolve().parents[3] / "bench" / "gpu"
BASE = {"max_seq_len": 2048, "cache_mode": "FP16", "chunk_size": 512}
# branch -> its case, source folder, backend engine, parameters, model variant, trial row
BRANCHES = {
    "main": {"case": "tabby main exl3 chat", "dir": "tabbyAPI", "engine": "exllamav3",
             "params": {**BASE, "model": "e4"}, "model": "e4", "trial": "exl3 4bpw base"},
    "exl2": {"case": "tabby exl2-checkpoint exl2 chat", "dir": "tabbyAPI-exl2", "engine": "exllamav2",
             "params": {**BASE, "gpu_split": "auto", "model": "t4"}, "model": "t4", "trial": "exl2 4bpw base"},
}
CASE = BRANCHES["main"]["case"]
LOADED = ("successfully loaded", "model loaded", "uvicorn running")


def export(branch: str, variants: dict, out: Path) -> tuple[dict, Path]:
    """The engine's own export of the baseline (``tabbyapi.yml``); (its document, its path)."""
    import yaml

    b = BRANCHES[branch]
    files = get_engine_class(b["engine"]).export(dict(b["params"]), {}, variants, out / f"export-{branch}")
    path = next(f for f in files if f.name == "tabbyapi.yml")
    return yaml.safe_load(path.read_text()), path


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict, timeout_s: float) -> dict:
    import httpx

    r = httpx.post(url, json=body, timeout=timeout_s)
    r.raise_for_status()
    return r.json()


def serve_and_ask(tabby: Path, doc: dict, work: Path, timeout_s: float) -> dict:
    """Start TabbyAPI with ``doc`` as its config.yml, ask one chat completion, stop it."""
    import httpx
    import yaml

    from autotune.engines.cuda_ext import end_group
    from autotune.hardware import VramSampler

    port = _free_port()
    run_doc = {**doc, "network": {**doc["network"], "port": port, "disable_auth": True}}
    work.mkdir(parents=True, exist_ok=True)
    (work / "config.yml").write_text(yaml.safe_dump(run_doc, sort_keys=False))
    log = work / "tabbyapi.log"
    out: dict = {"port": port, "log": str(log)}
    t0 = time.monotonic()
    with VramSampler() as vram, open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, str(tabby / "main.py")], cwd=work, stdout=f,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            while time.monotonic() - t0 < timeout_s and proc.poll() is None:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(1)
            out["startup_s"] = time.monotonic() - t0
            if proc.poll() is not None:
                out["error"] = f"TabbyAPI exited with {proc.returncode} before /health answered"
            else:
                model = doc["model"]["model_name"]
                answer = _post(f"http://127.0.0.1:{port}/v1/chat/completions",
                               {"model": model, "max_tokens": 16,
                                "messages": [{"role": "user", "content": "Say hello."}]},
                               max(10.0, timeout_s - (time.monotonic() - t0)))
                out["completion"] = answer["choices"][0]["message"]["content"]
                out["usage"] = answer.get("usage")
                time.sleep(0.5)  # one more VRAM sample with the model loaded and served
        except Exception as e:  # noqa: BLE001 - the row says what broke
            out["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        finally:
            end_group(proc)
        out["vram_gb"] = vram.peak_gb if vram.per_gpu else None
    text = log.read_text(errors="replace").splitlines()
    out["load_line"] = next((x.strip() for x in text if any(m in x.lower() for m in LOADED)), "")
    out["log_tail"] = text[-6:]
    return out


def chat_template_files(hf: Path, model: Path) -> list[str]:
    """Copy the tiny model's chat template files the converter left out (TabbyAPI reads
    ``chat_template.jinja`` or ``tokenizer_config.json`` from the model folder); their names."""
    import shutil

    copied = []
    for name in ("chat_template.jinja", "tokenizer_config.json"):
        if (hf / name).is_file() and not (model / name).exists():
            shutil.copy2(hf / name, model / name)
            copied.append(name)
    return copied


def refused_here(branch: str, torch: str | None = None) -> str:
    """Why this machine's TabbyAPI ``branch`` will not run its backend, or ''.

    exl2-checkpoint turns exllamav2 off under a CUDA 13 torch (``common/optional_dependencies.py``:
    ``is_torch_cuda_13``), which the lent machines have (torch 2.11.0+cu130). ``torch``: its
    version (default: the installed one; '' when there is none).
    """
    if torch is None:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version

        try:
            torch = version("torch")
        except PackageNotFoundError:
            torch = ""
    if branch == "exl2" and torch.partition("+")[2].startswith("cu13"):
        return (f"TabbyAPI exl2-checkpoint turns exllamav2 off under a CUDA 13 torch ({torch}; "
                "common/optional_dependencies.py is_torch_cuda_13)")
    return ""


def trial_vram(log: RowLog, case: str) -> float | None:
    """The baseline trial's VRAM (``case``), for the comparison."""
    row = log.latest().get(case)
    return row["row"].get("vram_gb") if row else None


def run(branch: str, work: Path, out: Path, log: RowLog, cuda: bool, timeout_s: float,
        kit: Path = KIT) -> dict:
    """One branch's step: export, then (with a GPU and the model) serve and ask; one row."""
    b = BRANCHES[branch]
    tabby = kit / b["dir"]
    variants = json.loads((work / "variants.json").read_text()) if (work / "variants.json").exists() else {}
    commit = (tabby / "TABBY_COMMIT").read_text().strip() if (tabby / "TABBY_COMMIT").exists() else ""
    row = {"case": b["case"], "engine": "tabbyapi", "status": "skipped", "decode_tps": None, "ttft_ms": None,
           "vram_gb": None, "accept_rate": None, "reason": ""}
    raw: dict = {"branch": branch, "tabby_commit": commit}
    if b["model"] not in variants:
        model_dir = {"e4": "exl3-t4", "t4": "exl2-t4"}[b["model"]]
        variants = {**variants, b["model"]: {"path": str(work / model_dir), "bpw": 4.0}}
        row["reason"] = "no model yet (stage models); the export is written"
    doc, path = export(branch, variants, out)
    raw["export"] = str(path)
    if not (tabby / "main.py").is_file():
        row["reason"] = f"no TabbyAPI source at {tabby} (bash bench/gpu/prepare.sh here, then carry it)"
    elif not cuda:
        row["reason"] = "no CUDA GPU: tabbyapi.yml exported, TabbyAPI not started"
    elif refused_here(branch):  # TabbyAPI's own refusal, known before a start: no time spent
        row.update(status="infeasible", reason=refused_here(branch))
    elif not row["reason"]:
        raw["copied"] = chat_template_files(work / "hf-target", Path(variants[b["model"]]["path"]))
        raw.update(serve_and_ask(tabby, doc, work / f"tabby-{branch}", timeout_s))
        ok = "completion" in raw and "error" not in raw
        row.update(status="ok" if ok else "failed", vram_gb=raw.get("vram_gb"),
                   reason=(f"commit {commit[:10]}; trial VRAM {trial_vram(log, b['trial'])} GiB; "
                           f"completion {raw.get('completion', '')!r}") if ok else raw.get("error", "")[:160])
    log.append({"row": row, "raw": raw, "at": time.time()})
    write_atomic(out / f"tabby-{branch}.json", json.dumps(raw, indent=1, default=str))
    print(f"row: {b['case']}: {row['status']} {row['reason']}", flush=True)
    return raw
