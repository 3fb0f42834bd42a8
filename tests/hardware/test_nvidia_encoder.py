"""gpu_encoder_sessions on a real NVIDIA GPU, against nvidia-smi read at the same moment.

The served value is NVML's nvmlDeviceGetEncoderStats sessionCount (a row of
exporter.sources.nvidia.scalars, read on the slow tier); nvidia-smi's
``encoder.stats.sessionCount`` is the same count. A datacenter GPU without NVENC (H100,
H200) answers 0 in both; the test prints each GPU's pair so it can be quoted. Skipped
without a GPU (see conftest.py).
"""

from __future__ import annotations

import time

from tests.hardware.harness import scrape, smi, value
from tests.hardware.test_nvidia_h100 import SLOW_INTERVAL, daemon

__all__ = ["daemon"]  # the fixture, imported for the test below


def test_encoder_sessions_agree_with_nvidia_smi(daemon: int) -> None:
    time.sleep(SLOW_INTERVAL + 1)  # a slow cycle after the first
    samples = scrape(daemon)
    counts = {r[0]: float(r[1]) for r in smi("--query-gpu=uuid,encoder.stats.sessionCount")}
    assert counts, "nvidia-smi lists no GPU"
    for uuid, smi_sessions in counts.items():
        served = value(samples, "gpu_encoder_sessions", uuid=uuid)
        print(f"{uuid}: gpu_encoder_sessions {served:g}, nvidia-smi sessionCount "
              f"{smi_sessions:g}")
        assert served == smi_sessions
