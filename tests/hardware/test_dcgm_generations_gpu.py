"""``--metric-names both-dcgm4.9`` on a real NVIDIA GPU: every dcgm-exporter 4.9 name is the
exporter's own value of the same scrape in the new unit, and the labels carry nvidia-smi's
driver version and the host name. Prints each compared pair. Skipped without a GPU
(see conftest.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.hardware.harness import exporter, scrape, smi, value

# dcgm4.9 name -> (our family, its labels, factor from ours to the dcgm4.9 unit)
PAIRS = {
    "DCGM_FI_DEV_GPU_TEMP_CELSIUS": ("gpu_temperature_celsius", {"sensor": "gpu"}, 1.0),
    "DCGM_FI_DEV_BOARD_POWER_WATTS": ("gpu_power_watts", {}, 1.0),
    "DCGM_FI_DEV_SM_CLOCK_HERTZ": ("gpu_clock_hertz", {"clock": "sm"}, 1.0),
    "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ": ("gpu_clock_hertz", {"clock": "memory"}, 1.0),
    "DCGM_FI_DEV_GPU_UTIL_RATIO": ("gpu_utilization_ratio", {}, 1.0),
    "DCGM_FI_DEV_FB_USED_BYTES": ("gpu_memory_used_bytes", {}, 1.0),
    "DCGM_FI_DEV_FB_FREE_BYTES": ("gpu_memory_free_bytes", {}, 1.0),
    "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL": ("gpu_energy_joules_total", {}, 1.0),
}


@pytest.fixture
def daemon() -> Iterator[int]:
    with exporter("--metric-names", "both-dcgm4.9", env={"NODE_NAME": "hw-node"}) as port:
        yield port


def test_the_4_9_names_are_the_exporters_values_in_the_new_units(daemon: int) -> None:
    time.sleep(3)
    samples = scrape(daemon)
    driver = smi("--query-gpu=driver_version")[0][0]
    for (uuid,) in smi("--query-gpu=uuid"):
        labels = {"UUID": uuid, "hostname": "hw-node", "DCGM_FI_SYSTEM_DRIVER_VERSION": driver}
        for name, (ours, extra, factor) in PAIRS.items():
            if not [1 for (n, ls), _ in samples.items() if n == ours and ("uuid", uuid) in ls]:
                print(f"{uuid} {name}: not read on this GPU")
                continue
            got = value(samples, name, **labels)
            want = value(samples, ours, uuid=uuid, **extra) * factor
            print(f"{uuid} {name} = {got} ({ours} = {want})")
            assert got == pytest.approx(want, rel=1e-9)
        assert not [n for (n, ls), _ in samples.items()
                    if n.startswith("DCGM_") and ("Hostname", "hw-node") in ls]
