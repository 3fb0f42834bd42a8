"""Cost of the dcgm-exporter families (``--metric-names dcgm|both``) per render.

    python bench/dcgm_render.py [--gpus 8] [--pods 0] [--n 2000]

Builds ``--gpus`` H100 samples with every field dcgm.py maps filled (and ``--pods``
Kubernetes allocations each, one series per container), then times ``dcgm_families`` plus
the text exposition of its families: what ``--metric-names dcgm`` adds to one render.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.core.model import Allocation, DeviceInfo, DeviceSample, PodRef  # noqa: E402
from exporter.output.dcgm import dcgm_families  # noqa: E402

MIB = 1 << 20


def sample(i: int, pods: int) -> DeviceSample:
    info = DeviceInfo(vendor="nvidia", pci_bus_id=f"0000:{0x18 + i:02x}:00.0",
                      uuid=f"GPU-{i:08x}", name="NVIDIA H100 80GB HBM3",
                      driver_version="550.127.05", device_node=f"nvidia{i}")
    return DeviceSample(
        info=info, source="nvml", utilization_ratio=0.5, memory_utilization_ratio=0.2,
        memory_used_bytes=1000 * MIB, memory_free_bytes=80000 * MIB,
        memory_reserved_bytes=479 * MIB, temperatures_celsius={"gpu": 60.0, "memory": 55.0},
        power_watts=500.0, energy_joules=1e6, clocks_hertz={"sm": 1.98e9, "memory": 2.619e9},
        pcie_throughput_bytes_per_second={"tx": 1e7, "rx": 2e7}, pcie_replay_errors=0,
        engine_utilization_ratio={"encoder": 0.0, "decoder": 0.0},
        remapped_rows={"correctable": 0, "uncorrectable": 0}, remap_failed=False,
        ecc_errors={"corrected": 0, "uncorrected": 0}, xid_last=0,
        profiling_ratio={k: 0.5 for k in ("graphics_engine_active", "sm_active", "sm_occupancy",
                                          "tensor_active", "dram_active", "fp64_active",
                                          "fp32_active", "fp16_active")},
        nvlink_throughput_bytes_per_second={(str(link), d): 1e9 for link in range(18)
                                            for d in ("tx", "rx")},
        nvlink_errors={(str(link), t): 0 for link in range(18)
                       for t in ("crc_flit", "crc_data", "replay", "recovery")},
        clock_event_seconds={"sw_power_cap": 1.0, "sw_thermal": 0.0, "hw_thermal": 0.0},
        allocations=tuple(Allocation(PodRef("ns", f"pod-{p}", "main"), "nvidia.com/gpu")
                          for p in range(pods)))


class _Once:
    def __init__(self, devices: list[tuple[str, DeviceSample]]) -> None:
        self.devices = devices

    def collect(self):  # type: ignore[no-untyped-def]
        return dcgm_families(self.devices, "bench-node")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--pods", type=int, default=0, help="allocations per GPU")
    ap.add_argument("--n", type=int, default=2000)
    args = ap.parse_args()
    devices = [(str(i), sample(i, args.pods)) for i in range(args.gpus)]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Once(devices))  # type: ignore[arg-type]
    body = generate_latest(registry)
    families_only, with_text = [], []
    for _ in range(args.n):
        t0 = time.perf_counter()
        for _family in dcgm_families(devices, "bench-node"):
            pass
        t1 = time.perf_counter()
        generate_latest(registry)
        t2 = time.perf_counter()
        families_only.append((t1 - t0) * 1e6)
        with_text.append((t2 - t1) * 1e6)
    series = body.count(b"\nDCGM_")
    print(f"{args.gpus} GPUs x {max(args.pods, 1)} series sets: {series} DCGM series, "
          f"{len(body)} bytes of text")
    for name, times in (("dcgm_families", families_only),
                        ("dcgm_families + text exposition", with_text)):
        q = statistics.quantiles(times, n=100)
        print(f"{name:32s} p50 {q[49]:8.0f} us   p99 {q[98]:8.0f} us")


if __name__ == "__main__":
    main()
