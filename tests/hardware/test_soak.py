"""The daemon under a real CUDA load for a long while, checked against nvidia-smi throughout.

Runs only when ``SOAK_SECONDS`` gives the duration in seconds (``bash bench/h100.sh
soak`` sets it to 600); skipped otherwise and without a GPU (conftest.py). The daemon runs
with no collector flags but a 5 s slow tier (NVLink throughput every 15 s) while every
GPU runs a matmul loop (``SOAK_SKIP_LOAD=0,1`` leaves those GPUs to another workload);
where NVLink links are up, the last two GPUs copy to each other (peer-to-peer) in the
middle third of the soak. Every ``CHECK_EVERY`` seconds it scrapes
``/metrics`` and reads nvidia-smi at the same moment. It asserts:

- the daemon never exits, and logs no ``error`` line;
- per GPU, memory used, power and utilisation agree with nvidia-smi (tolerances below; at
  most a tenth of the checks may miss, since both sides sample a moving load);
- per GPU, the NVLink links up equal the active links of ``nvidia-smi nvlink -s``;
- NVLink throughput during the copies is above its value before them;
- RSS and open descriptors are flat from the end of the warm-up to the end (bounded).

The last line it prints is one ``SOAK`` row for the hardware matrix (bench/h100.sh).
Nothing here changes a GPU setting.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hardware.harness import REPO, Samples, free_port, scrape, smi
from tests.hardware.test_nvidia_nvlink_health import per_gpu, smi_text

SOAK_S = float(os.environ.get("SOAK_SECONDS", "0"))
SKIP_LOAD = {int(i) for i in os.environ.get("SOAK_SKIP_LOAD", "").split(",") if i.strip()}
CHECK_EVERY = 15.0
WARMUP_S = 60.0
MIB = 1 << 20
RSS_GROWTH_MAX_MIB = 16.0
FD_GROWTH_MAX = 4
# Agreement with nvidia-smi read within the same second (both sample a moving load).
MEM_TOL_MIB = 256.0
POWER_TOL = (0.25, 40.0)  # 25 % or 40 W, whichever is larger
UTIL_TOL_POINTS = 30.0
MISS_SHARE = 0.1

MATMUL = """
import sys, time, torch
dev = torch.device("cuda", int(sys.argv[1]))
a = torch.randn(8192, 8192, device=dev, dtype=torch.float16)
end = time.time() + float(sys.argv[2])
while time.time() < end:
    for _ in range(20):
        a @ a
    torch.cuda.synchronize(dev)
    time.sleep(0.02)
"""

P2P = """
import sys, time, torch
a, b = int(sys.argv[2]), int(sys.argv[3])
x = torch.empty(1 << 28, dtype=torch.float32, device=f"cuda:{a}")  # 1 GiB
y = torch.empty_like(x, device=f"cuda:{b}")
end = time.time() + float(sys.argv[1])
print("p2p", torch.cuda.can_device_access_peer(a, b), flush=True)
while time.time() < end:
    y.copy_(x, non_blocking=True)
    x.copy_(y, non_blocking=True)
    torch.cuda.synchronize(a)
    torch.cuda.synchronize(b)
"""

pytestmark = pytest.mark.skipif(SOAK_S <= 0, reason="SOAK_SECONDS not set")


def proc_stats(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024  # type: ignore[union-attr]
    threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(stat[11]) + int(stat[12])) / ticks
    return {"rss_mib": rss, "fds": len(os.listdir(f"/proc/{pid}/fd")), "threads": threads,
            "cpu_s": cpu}


def series(samples: Samples, name: str) -> list[tuple[dict[str, str], float]]:
    return [(dict(ls), v) for (n, ls), v in samples.items() if n == name]


def per_uuid(samples: Samples, name: str, **want: str) -> dict[str, float]:
    return {ls["uuid"]: v for ls, v in series(samples, name)
            if all(ls.get(k) == w for k, w in want.items()) and "uuid" in ls}


def nvlink_active() -> dict[int, set[int]]:
    """GPU index -> the links ``nvidia-smi nvlink -s`` shows active."""
    found = per_gpu(smi_text("nvlink", "-s"), r"Link (\d+): ([\d.]+) GB/s")
    return {gpu: {int(m[0]) for m in matches} for gpu, matches in found.items()}


@pytest.fixture
def soak_daemon(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    port = free_port()
    log = tmp_path / "daemon.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-X", "faulthandler", "-m", "exporter.app.cli",
             "--web.listen-address", f"127.0.0.1:{port}", "--collector.slow-interval", "5s"],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])})
    try:
        yield proc, port, log
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(15)


@pytest.mark.slow
def test_soak_under_cuda_load(soak_daemon: tuple[subprocess.Popen[bytes], int, Path]) -> None:
    proc, port, log = soak_daemon
    uuids = [r[0] for r in smi("--query-gpu=uuid")]
    active = nvlink_active()
    pair = (len(uuids) - 2, len(uuids) - 1)
    nvlinked = len(uuids) >= 2 and bool(active.get(pair[0])) and bool(active.get(pair[1]))
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    load = [subprocess.Popen([sys.executable, "-c", MATMUL, str(i), str(SOAK_S + 30)], env=env)
            for i in range(len(uuids)) if i not in SKIP_LOAD]
    p2p: subprocess.Popen[str] | None = None
    p2p_window = (SOAK_S / 3, 2 * SOAK_S / 3)
    misses = {"memory": 0, "power": 0, "util": 0}
    worst = {"memory": 0.0, "power": 0.0, "util": 0.0}
    checks = 0
    nvlink_before: list[float] = []
    nvlink_during: list[float] = []
    links_ok: dict[int, tuple[int, int]] = {}
    first: dict[str, float] | None = None
    start = time.monotonic()
    try:
        while (elapsed := time.monotonic() - start) < SOAK_S:
            assert proc.poll() is None, f"the daemon died: exit {proc.returncode}\n" \
                + log.read_text()[-4000:]
            if nvlinked and p2p is None and elapsed >= p2p_window[0]:
                p2p = subprocess.Popen([sys.executable, "-c", P2P,
                                        str(p2p_window[1] - p2p_window[0]), *map(str, pair)],
                                       env=env, stdout=subprocess.PIPE, text=True)
            if elapsed >= WARMUP_S:
                if first is None:
                    first = proc_stats(proc.pid)
                try:
                    samples = scrape(port)
                except OSError:
                    time.sleep(1)
                    continue
                rows = {r[0]: [float(x) for x in r[1:]] for r in smi(
                    "--query-gpu=uuid,memory.used,power.draw,utilization.gpu")}
                checks += 1
                mem = per_uuid(samples, "gpu_memory_used_bytes")
                power = per_uuid(samples, "gpu_power_watts")
                util = per_uuid(samples, "gpu_utilization_ratio")
                for uuid, (s_mem, s_power, s_util) in rows.items():
                    d_mem = abs(mem.get(uuid, -1e9) / MIB - s_mem)
                    d_power = abs(power.get(uuid, -1e9) - s_power)
                    d_util = abs(util.get(uuid, -1e9) * 100 - s_util)
                    worst = {"memory": max(worst["memory"], d_mem),
                             "power": max(worst["power"], d_power),
                             "util": max(worst["util"], d_util)}
                    misses["memory"] += d_mem > MEM_TOL_MIB
                    misses["power"] += d_power > max(POWER_TOL[0] * s_power, POWER_TOL[1])
                    misses["util"] += d_util > UTIL_TOL_POINTS
                up = series(samples, "gpu_nvlink_up")
                for index, uuid in enumerate(uuids):
                    ours = {int(ls["link"]) for ls, v in up if ls.get("uuid") == uuid and v == 1}
                    links_ok[index] = (len(ours), len(active.get(index, set())))
                    assert ours == active.get(index, set()), (index, ours, active.get(index))
                rates = series(samples, "gpu_nvlink_throughput_bytes_per_second")
                total = sum(v for _ls, v in rates)
                if nvlinked and elapsed < p2p_window[0]:
                    nvlink_before.append(total)
                elif nvlinked and p2p_window[0] + 25 <= elapsed <= p2p_window[1]:
                    nvlink_during.append(total)
            time.sleep(CHECK_EVERY)
        last = proc_stats(proc.pid)
    finally:
        for p in [*load, *([p2p] if p2p else [])]:
            p.kill()
            p.wait(30)
        if p2p is not None and p2p.stdout is not None:
            p2p.stdout.close()
    proc.terminate()
    code = proc.wait(30)
    text = log.read_text()
    errors = [line for line in text.splitlines()
              if _level(line) in ("error", "critical", "fatal")]
    assert first is not None
    rss_growth = last["rss_mib"] - first["rss_mib"]
    fd_growth = last["fds"] - first["fds"]
    cpu_share = (last["cpu_s"] - first["cpu_s"]) / max(SOAK_S - WARMUP_S, 1) * 100
    n = checks * len(uuids)
    print(f"\nsoak {SOAK_S:.0f} s, {len(uuids)} GPU(s), {checks} checks; worst |exported - "
          f"nvidia-smi|: memory {worst['memory']:.0f} MiB, power {worst['power']:.1f} W, "
          f"util {worst['util']:.0f} points; misses {misses} of {n}")
    print(f"NVLink links up (ours, nvidia-smi) per GPU: {links_ok}; throughput B/s before "
          f"P2P max {max(nvlink_before, default=0):.3g}, during P2P max "
          f"{max(nvlink_during, default=0):.3g}")
    print(f"daemon: RSS {first['rss_mib']:.1f} -> {last['rss_mib']:.1f} MiB ({rss_growth:+.1f}),"
          f" fds {first['fds']:.0f} -> {last['fds']:.0f}, threads {first['threads']:.0f} -> "
          f"{last['threads']:.0f}, CPU {cpu_share:.2f} % of a core, exit {code}, "
          f"error lines {len(errors)}")
    row = {"gpus": len(uuids), "seconds": SOAK_S, "checks": checks, "died": False,
           "misses": misses, "worst": {k: round(v, 1) for k, v in worst.items()},
           "links": {str(k): list(v) for k, v in links_ok.items()},
           "nvlink_before": max(nvlink_before, default=0),
           "nvlink_during": max(nvlink_during, default=0),
           "rss_mib": [round(first["rss_mib"], 1), round(last["rss_mib"], 1)],
           "fds": [first["fds"], last["fds"]], "cpu_pct": round(cpu_share, 3),
           "error_lines": len(errors), "exit": code}
    print("SOAK " + json.dumps(row))
    assert code == 0
    assert errors == [], errors[:5]
    assert checks >= 3
    for what, missed in misses.items():
        assert missed <= MISS_SHARE * n, (what, missed, n)
    if nvlinked:
        assert nvlink_during and max(nvlink_during) > max(nvlink_before, default=0)
    assert rss_growth <= RSS_GROWTH_MAX_MIB
    assert fd_growth <= FD_GROWTH_MAX


def _level(line: str) -> str:
    try:
        record: Any = json.loads(line)
    except ValueError:
        return "fatal" if "Fatal Python error" in line else ""
    return str(record.get("level", "")) if isinstance(record, dict) else ""
