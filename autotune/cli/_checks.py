"""The checks of ``autotune doctor`` that belong to no engine: the machine (CPU, RAM, GPUs) and
the tools around a study (Ray, the MLflow store, Chromium for the report's PNGs).

Each returns :class:`~autotune.engines.doctor.Check` records (name, verdict, detail, the one
command that fixes it, the engines that need it); the engines' own checks are theirs
(:meth:`autotune.engines.base.Engine.doctor_checks`).
"""

from __future__ import annotations

import os
from pathlib import Path

from autotune.engines.doctor import Check
from autotune.engines.doctor import version_of
from autotune.hardware import cpu_count
from autotune.hardware import list_gpus
from autotune.registry import ENGINES
from autotune.registry import get_engine_class

ALL = tuple(ENGINES)


def gpu_engines() -> tuple[str, ...]:
    """The engines that cannot run without a GPU (their ``Engine.needs_gpu``)."""
    return tuple(kind for kind in ENGINES if get_engine_class(kind).needs_gpu)


def physical_cores(cpuinfo: str | None = None) -> int:
    """Physical cores this process may use: (physical id, core id) pairs, capped by affinity."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return cpu_count()
    cores, phys = set(), "0"
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "physical id":
            phys = value.strip()
        elif key.strip() == "core id":
            cores.add((phys, value.strip()))
    return max(1, min(len(cores) or cpu_count(), cpu_count()))


def check_cpu() -> list[Check]:
    from autotune.engines.predict import ram_available_gb
    from autotune.engines.predict import ram_bandwidth_gbps

    cores = Check("CPU cores", "ok", f"{physical_cores()} physical cores, {cpu_count()} usable CPUs",
                  "", ALL)
    bw = ram_bandwidth_gbps({})
    free = ram_available_gb()
    ram = Check("RAM", "ok", f"{free:.1f} GiB available, {bw:.1f} GB/s (read probe, cached)"
                if free is not None else f"{bw:.1f} GB/s (read probe, cached)", "", ALL)
    return [cores, ram, check_load()]


BUSY_SHARE = 0.5  # a 1-minute load average over this share of the usable CPUs (and >= 1) is busy


def check_load(load: float | None = None, cpus: int | None = None) -> Check:
    """Whether something else already keeps this machine's CPUs busy (the 1-minute load average,
    read before autotune starts anything). Busy, every trial runs slower and noisier, and a
    latency bound can fail for every configuration (measured: the default ``local_cpu`` study
    beside two benchmark jobs, load 4.6 on 2 cores, found no trial within TTFT p95 <= 300 ms)."""
    if load is None:
        try:
            load = os.getloadavg()[0]
        except OSError:
            return Check("CPU load", "skip", "no load average on this platform", "", ALL)
    cpus = cpus or cpu_count()
    detail = f"load average {load:.1f} over {cpus} usable CPUs (1 min)"
    if load >= max(1.0, BUSY_SHARE * cpus):
        return Check("CPU load", "warn", f"{detail}: busy, so timings are slower and noisier, and latency "
                     "bounds may fail for every configuration", "run when the machine is idle", ALL)
    return Check("CPU load", "ok", detail, "", ALL)


def _driver() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver
        return "?"


def check_gpus() -> list[Check]:
    from autotune.engines.predict import gpu_table

    gpus = list_gpus()
    if not gpus:
        return [Check("GPUs", "skip", "no NVIDIA GPU (NVML found no driver); CPU engines only",
                      "install the NVIDIA driver (nvidia-smi must list the GPU)", gpu_engines())]
    driver = _driver()
    out = []
    for g, row in zip(gpus, gpu_table({})):
        bw = row.get("bandwidth_gbps")
        bw_text = f"{bw:g} GB/s (published)" if bw else "bandwidth unknown: set engine.settings.gpus[].bandwidth_gbps"
        out.append(Check(f"GPU {g.index}", "ok" if bw else "warn",
                         f"{g.name}, {g.memory_gb:.1f} GiB, driver {driver}, {bw_text}", "",
                         gpu_engines()))
    return out


def check_ray() -> list[Check]:
    v = version_of("ray")
    return [Check("Ray", "ok" if v else "fail", f"ray {v}" if v else "not installed",
                  "" if v else "pip install 'ray[default]'", ALL)]


def writable_dir(path: Path) -> Path | None:
    """The nearest existing folder of ``path`` if this user may write there, else None."""
    p = path.resolve()
    while not p.exists():
        p = p.parent
    return p if p.is_dir() and os.access(p, os.W_OK | os.X_OK) else None


def check_mlflow(uri: str = "sqlite:///mlruns/mlflow.db") -> list[Check]:
    if uri.startswith("sqlite:///"):
        path = Path(uri[len("sqlite:///"):])
    elif "://" not in uri or uri.startswith("file://"):
        path = Path(uri.removeprefix("file://")) / "x"
    else:
        return [Check("MLflow store", "skip", f"{uri}: a remote store, not checked", "", ALL)]
    if writable_dir(path.parent) is None:
        return [Check("MLflow store", "fail", f"{path.parent} is not writable ({uri})",
                      f"autotune run tracking.uri=sqlite:///{Path.home()}/mlruns/mlflow.db", ALL)]
    return [Check("MLflow store", "ok", f"{uri} writable", "", ALL)]


def check_chromium() -> list[Check]:
    try:
        from choreographer.browsers.chromium import Chromium

        path = Chromium.find_browser(skip_local=False)
    except Exception:  # noqa: BLE001 - kaleido/choreographer absent or changed
        path = None
    if path:
        return [Check("Chromium", "ok", f"{path} (report PNGs)", "", ())]
    return [Check("Chromium", "warn", "none found: report.html is written, its PNGs are skipped",
                  "apt-get install chromium (or plotly_get_chrome)", ())]
