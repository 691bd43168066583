"""The GPU check's ``ext`` and ``models`` stages: extension builds, tiny models, conversions.

``ext`` builds exllamav2's CUDA extension and exllamav3's kernels
(:func:`autotune.engines.cuda_ext.build_extension`) into ``TORCH_EXTENSIONS_DIR``, which
the check points into its state folder so the next command on the machine reuses them; ninja
resumes a build a killed command left half done. ``models`` makes the target and the draft
(:mod:`autotune.tools.make_tiny_llama`) and converts them with each library's own converter:
EXL2 at two bpw (``exllamav2.conversion.convert_exl2``), EXL3 at 4 bpw
(``exllamav3.conversion.convert_model``); the GGUF is made before the lease
(:mod:`bench.gpu.kit.sources`). Each
product gets a ``.done`` marker and its variant is written to ``variants.json`` at once, so a
re-run makes only what is missing. A failure is kept as ``variants["_why"][engine]``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from autotune._files import write_atomic
from autotune.engines.cuda_ext import EXLLAMAV2
from autotune.engines.cuda_ext import EXLLAMAV3
from autotune.engines.cuda_ext import build_extension
from autotune.engines.cuda_ext import end_group
from autotune.tools.make_tiny_llama import make_tiny_llama
from bench.gpu.kit.stages import Deadline
from bench.gpu.kit.stages import is_done
from bench.gpu.kit.stages import load_json
from bench.gpu.kit.stages import mark_done

# target: 4 layers, hidden 256 (4 heads of 64); draft: 2 layers, hidden 128; same tokenizer
TARGET = {"num_layers": 4, "hidden_size": 256, "intermediate_size": 768, "num_heads": 4}
DRAFT = {"num_layers": 2, "hidden_size": 128, "intermediate_size": 384, "num_heads": 2}
EXL3_CONVERT = ("import sys; from exllamav3.conversion.convert_model import parser, prepare, main; "
                "a, s, ok, err = prepare(parser.parse_args(sys.argv[1:])); "
                "sys.exit(err) if not ok else main(a, s)")


def make_models(work: Path) -> dict[str, Path]:
    """The target and the draft (same vocabulary) as HF folders, fp16."""
    out = {}
    for key, seed, shape in (("target", 1, TARGET), ("draft", 2, DRAFT)):
        folder = work / f"hf-{key}"
        if not is_done(folder):
            make_tiny_llama(folder, seed=seed, dtype="float16", **shape)
            mark_done(folder)
        out[key] = folder
    return out


def run_step(argv: list[str], timeout_s: float, log: Path) -> str:
    """Run a step in its own process group; '' if it worked, else the reason."""
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return f"timed out after {timeout_s:g} s ({log}); run the stage again to go on"
        finally:
            end_group(proc)
    if code:
        return " | ".join(log.read_text(errors="replace").strip().splitlines()[-2:])[:300]
    return ""


def convert_exl2(src: Path, dst: Path, bpw: float, work: Path, timeout_s: float) -> str:
    """exllamav2's converter with its shipped calibration data (no -c); '' or the reason."""
    tmp = work / f"exl2-work-{dst.name}"
    tmp.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "exllamav2.conversion.convert_exl2", "-i", str(src), "-o", str(tmp),
            "-cf", str(dst), "-b", str(bpw), "-hb", "8", "-r", "16", "-mr", "8", "-l", "512", "-ml", "512", "-nr"]
    return run_step(argv, timeout_s, work / f"convert-{dst.name}.log")


def convert_exl3(src: Path, dst: Path, bpw: float, work: Path, timeout_s: float) -> str:
    """exllamav3's converter (its default calibration data, trimmed for a tiny model)."""
    tmp = work / f"exl3-work-{dst.name}"
    argv = [sys.executable, "-c", EXL3_CONVERT, "-i", str(src), "-o", str(dst), "-w", str(tmp),
            "-b", str(bpw), "-hb", "6", "-cr", "16", "-cc", "512"]
    return run_step(argv, timeout_s, work / f"convert-{dst.name}.log")


def stage_ext(env: dict, work: Path, deadline: Deadline) -> dict[str, str]:
    """Build the CUDA extensions here; returns engine -> '' (ready) or the reason."""
    out: dict[str, str] = {}
    for ext in (EXLLAMAV2, EXLLAMAV3):
        if env.get(ext.package) and not deadline.expired():
            missing = build_extension(ext, deadline.timeout(1800))  # says how long it took
            out[ext.package] = missing[0] if missing else ""
    write_atomic(work / "ext.json", json.dumps({**load_json(work / "ext.json", {}), **out}))
    print("extensions:", json.dumps(out), flush=True)
    return out


def stage_models(work: Path, bpws: list[float], env: dict, deadline: Deadline) -> dict:
    """Make what is missing of the models and conversions; returns the variants."""
    path = work / "variants.json"
    variants = load_json(path, {})
    why = variants.setdefault("_why", {})

    def save() -> None:
        write_atomic(path, json.dumps(variants, indent=1))

    models = make_models(work)
    steps: list[tuple[str, str, Path, Path, float]] = []
    if env.get("exllamav2"):
        steps += [("exllamav2", f"t{b:g}", models["target"], work / f"exl2-t{b:g}", b) for b in bpws]
        steps.append(("exllamav2", "d", models["draft"], work / "exl2-d", bpws[0]))
    if env.get("exllamav3"):
        steps += [("exllamav3", "e4", models["target"], work / "exl3-t4", 4.0),
                  ("exllamav3", "ed", models["draft"], work / "exl3-d4", 4.0)]
    for engine, name, src, dst, bpw in steps:
        if is_done(dst):
            variants[name] = json.loads((dst / ".done").read_text())
            continue
        if deadline.expired():  # still register what is done further on
            print(f"budget spent before {name}: run stage models again", flush=True)
            continue
        timeout = deadline.timeout(1800)
        if engine == "exllamav2":
            failed = convert_exl2(src, dst, float(bpw), work, timeout)
        else:
            failed = convert_exl3(src, dst, float(bpw), work, timeout)
        if failed:
            why[engine] = f"{name}: conversion failed: {failed}"
            save()
            continue
        variant = {"path": str(dst)}
        if engine == "exllamav2":
            variant["bpw"] = bpw
        mark_done(dst, variant)
        variants[name] = variant
        why.pop(engine, None)
        save()
        print(f"made {name}: {variant['path']}", flush=True)
    save()
    return variants
