"""autotune.hardware on CPU: mapping CUDA_VISIBLE_DEVICES to NVML devices through PCI bus ids, and
the sampler's idle baseline (with a reader function in place of NVML, which needs a GPU).
"""

from __future__ import annotations

import pytest

from autotune.hardware import GIB
from autotune.hardware import GPU
from autotune.hardware import VramSampler
from autotune.hardware import list_gpus
from autotune.hardware import pci_bus_order_env
from autotune.hardware import visible_nvml_indices

# NVML indices in NVML order; bus ids deliberately not in index order, as after a re-plug
NODE = [
    GPU(0, "RTX 4090", 24.0, "00000000:65:00.0", "GPU-aaaa-1111"),
    GPU(1, "RTX 5090", 32.0, "00000000:17:00.0", "GPU-bbbb-2222"),
    GPU(2, "RTX 4090", 24.0, "00000000:B3:00.0", "GPU-cccc-3333"),
]


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        (None, [1, 0, 2]),  # every device, in CUDA (PCI bus) order
        ("0", [1]),  # CUDA 0 = lowest bus id = NVML 1
        ("2,1", [2, 0]),
        ("1, 2", [0, 2]),
        ("GPU-cccc", [2]),  # UUID prefix
        ("GPU-bbbb-2222,0", [1]),
        ("0,7,2", [1]),  # CUDA stops at the first invalid entry
        ("", []),
        ("MIG-xyz", []),
    ],
)
def test_visible_devices_map_to_nvml_indices_by_pci_bus_id(visible, expected) -> None:
    assert visible_nvml_indices(visible, NODE) == expected


def test_workers_number_gpus_in_pci_bus_order() -> None:
    assert pci_bus_order_env() == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_sampler_reports_the_peak_above_the_idle_baseline() -> None:
    used = {1: [3.0, 3.5, 9.0, 4.0], 2: [0.5, 0.5, 2.5, 0.5]}  # GiB per reading
    calls = {1: 0, 2: 0}

    def reader(i: int) -> float:
        k = min(calls[i], len(used[i]) - 1)
        calls[i] += 1
        return used[i][k] * GIB

    s = VramSampler([1, 2], interval_s=3600, reader=reader)
    for _ in range(4):
        s.sample()
    assert s.baseline == {1: 3.0, 2: 0.5}
    assert s.per_gpu == {1: 6.0, 2: 2.0} and s.peak_gb == 8.0


def test_sampler_reports_what_was_free_at_the_start() -> None:
    used = {0: [1.5, 20.0, 23.0], 1: [0.5, 6.0, 2.0]}  # GiB per reading
    calls = {0: 0, 1: 0}

    def reader(i: int) -> float:
        k = min(calls[i], len(used[i]) - 1)
        calls[i] += 1
        return used[i][k] * GIB

    s = VramSampler([0, 1], interval_s=3600, reader=reader, capacity=lambda i: 24.0 * GIB)
    for _ in range(3):
        s.sample()
    assert s.free == {0: 22.5, 1: 23.5} and s.free_gb == 46.0
    assert s.metrics() == {"vram_peak_gb": 21.5 + 5.5, "vram_free_gb": 46.0}
    no_total = VramSampler([0], interval_s=3600, reader=lambda i: 1.0 * GIB)
    no_total.sample()
    assert no_total.free_gb is None and no_total.metrics() == {"vram_peak_gb": 0.0}


def test_sampler_thread_samples_only_the_given_gpus() -> None:
    seen: set[int] = set()

    def reader(i: int) -> float:
        seen.add(i)
        return 1.0 * GIB

    with VramSampler([2], interval_s=0.01, reader=reader) as s:
        pass
    assert seen == {2} and s.peak_gb == 0.0


def test_no_nvml_means_no_gpus_and_no_samples() -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("NVML works here")
    except Exception:  # noqa: BLE001
        pass
    assert list_gpus() == []
    with VramSampler() as s:
        pass
    assert s.peak_gb == 0.0 and s.per_gpu == {}
