"""CUDA MPS clients on a real GPU: the NVIDIA backend's processes against nvidia-smi.

Starts a private MPS control daemon (``nvidia-cuda-mps-control -d``, its pipe and log
directories under a temporary directory, so no other MPS user of the machine is
touched), two CUDA clients (the machine's ``python3`` with torch) that each hold a
known amount of memory and keep a small kernel busy, and reads the exporter's NVIDIA
backend (real nvidia-ml-py) and nvidia-smi (``--query-compute-apps`` and ``-q -d PIDS``)
while they run. Every compared number is printed. The clients are stopped and the
daemon told ``quit`` whatever happens; no GPU setting is changed (the compute mode is
only read: MPS runs in Default and Exclusive_Process mode). Skipped without a GPU (see
conftest.py), without ``nvidia-cuda-mps-control`` or without torch.

    python3 -m pytest -v -s -p no:cacheprovider tests/hardware/test_nvidia_mps.py
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

MIB = 1 << 20
HOLD_MIB = (1024, 1536)  # what each client holds besides its CUDA context
RUN_S = 150  # how long a client keeps its kernel busy at most (stopped before that)
CONTROL = "nvidia-cuda-mps-control"

CLIENT = """
import os, sys, time, torch
hold = torch.empty(int(sys.argv[1]) << 20, dtype=torch.uint8, device="cuda")
a = torch.randn(1024, 1024, device="cuda")
torch.cuda.synchronize()
print("ready", os.getpid(), flush=True)
end = time.time() + float(sys.argv[2])
while time.time() < end:
    b = a @ a
    torch.cuda.synchronize()
    time.sleep(0.005)
"""


def run(cmd: list[str], env: dict[str, str] | None = None, stdin: str | None = None,
        timeout: float = 30) -> str:
    done = subprocess.run(cmd, env=env, input=stdin, capture_output=True, text=True,
                          timeout=timeout)
    return done.stdout + done.stderr


def client_python() -> str | None:
    """The machine's python3, where torch with CUDA is installed (the exporter's own
    interpreter need not have torch)."""
    py = shutil.which("python3")
    if py is None:
        return None
    check = subprocess.run([py, "-c", "import torch; assert torch.cuda.is_available()"],
                           capture_output=True, timeout=120)
    return py if check.returncode == 0 else None


@dataclass
class Mps:
    env: dict[str, str]  # what a client needs to find this daemon
    gpu_index: str
    gpu_uuid: str
    clients: list[subprocess.Popen[str]]
    pids: list[int]


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:  # each client is the leader of its own session
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 15
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)
        if p.stdout is not None:  # the pipe each client wrote its readiness to
            p.stdout.close()


def _quit_daemon(env: dict[str, str], pipe: Path) -> None:
    """``quit`` to our control daemon (it stops its server); then, if it is still there,
    SIGTERM to the pid it wrote in our pipe directory (ours alone)."""
    print("mps quit:", run([CONTROL], env=env, stdin="quit\n").strip())
    pid_file = pipe / "nvidia-cuda-mps-control.pid"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and pid_file.exists():
        time.sleep(0.5)
    if pid_file.exists():
        try:
            pid = int(pid_file.read_text().strip())
            os.kill(pid, signal.SIGTERM)
            print(f"mps control daemon {pid} still up after quit: SIGTERM")
        except (ValueError, ProcessLookupError, PermissionError):
            pass


def _ready(p: subprocess.Popen[str], mib: int) -> int:
    """The client's pid once it says "ready" (other lines, warnings, are shown on failure).
    A thread reads its output, so a line buffered behind another is never waited for."""
    assert p.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    stream = p.stdout
    threading.Thread(target=lambda: [lines.put(line) for line in stream], daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and (p.poll() is None or not lines.empty()):
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        if line.startswith("ready"):
            return int(line.split()[1])
        seen.append(line)
    raise AssertionError(f"client holding {mib} MiB did not start: {''.join(seen)}")


@pytest.fixture
def mps(tmp_path: Path) -> Iterator[Mps]:
    if shutil.which(CONTROL) is None:
        pytest.skip(f"{CONTROL} not on PATH")
    py = client_python()
    if py is None:
        pytest.skip("no python3 with torch and CUDA for the clients")
    index, uuid, mode, mig = [c.strip() for c in run(
        ["nvidia-smi", "--query-gpu=index,uuid,compute_mode,mig.mode.current",
         "--format=csv,noheader", "-i", "0"]).strip().split(",")]
    print(f"GPU {index} {uuid}, compute mode {mode}, MIG {mig}")
    if mode.replace(" ", "_").lower() == "prohibited":
        pytest.skip("compute mode Prohibited: no CUDA context can be made (left as it is)")
    if mig.lower() == "enabled":
        pytest.skip("MIG is on: MPS would need a MIG instance (left as it is)")
    if "nvidia-cuda-mps-server" in run(["nvidia-smi", "--query-compute-apps=process_name",
                                        "--format=csv,noheader"]):
        pytest.skip("an MPS server of someone else already runs on this machine")
    pipe, log = tmp_path / "pipe", tmp_path / "log"
    pipe.mkdir()
    log.mkdir()
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
           "CUDA_MPS_LOG_DIRECTORY": str(log), "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
           "CUDA_VISIBLE_DEVICES": index}
    clients: list[subprocess.Popen[str]] = []
    started = False
    try:
        # Its output to a file: the forked daemon may keep a pipe open for its whole life.
        with open(tmp_path / "control.out", "w") as sink:
            rc = subprocess.run([CONTROL, "-d"], env=env, stdin=subprocess.DEVNULL,
                                stdout=sink, stderr=subprocess.STDOUT, timeout=30).returncode
        print("mps control -d:", rc, (tmp_path / "control.out").read_text().strip())
        assert rc == 0
        started = True
        pids = []
        for mib in HOLD_MIB:
            p = subprocess.Popen([py, "-c", CLIENT, str(mib), str(RUN_S)], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 start_new_session=True)
            clients.append(p)
            pids.append(_ready(p, mib))
        print("mps servers:", run([CONTROL], env=env, stdin="get_server_list\n").strip())
        yield Mps(env, index, uuid, clients, pids)
    finally:
        _stop(clients)
        if started:
            _quit_daemon(env, pipe)
        for f in sorted(log.glob("*.log")):
            print(f"--- {f.name} (tail)\n" + "\n".join(f.read_text(errors="replace")
                                                     .splitlines()[-15:]))


def smi_apps() -> dict[int, float]:
    """pid -> MiB from ``nvidia-smi --query-compute-apps``."""
    out = run(["nvidia-smi", "--query-compute-apps=pid,used_memory,gpu_uuid",
               "--format=csv,noheader,nounits"])
    print("nvidia-smi --query-compute-apps:\n" + out.strip())
    apps = {}
    for line in out.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) >= 2 and cells[0].isdigit() and cells[1].isdigit():
            apps[int(cells[0])] = float(cells[1])
    return apps


def smi_pids(index: str) -> dict[int, tuple[str, float | None]]:
    """pid -> (Type, MiB) from ``nvidia-smi -q -d PIDS``."""
    out = run(["nvidia-smi", "-q", "-d", "PIDS", "-i", index])
    print("nvidia-smi -q -d PIDS:\n" + out.strip())
    found: dict[int, tuple[str, float | None]] = {}
    for block in re.split(r"\n\s*GPU instance ID", out):
        pid = re.search(r"Process ID\s*:\s*(\d+)", block)
        kind = re.search(r"Type\s*:\s*(\S+)", block)
        mem = re.search(r"Used GPU Memory\s*:\s*(\d+)\s*MiB", block)
        if pid:
            found[int(pid.group(1))] = (kind.group(1) if kind else "?",
                                        float(mem.group(1)) if mem else None)
    return found


def test_mps_clients_are_processes_with_the_memory_nvidia_smi_shows(mps: Mps) -> None:
    import pynvml

    from exporter.core.config import Config
    from exporter.sources.nvidia.backend import NvidiaBackend

    backend = NvidiaBackend(Config(procfs="/proc"), nvml=pynvml)
    backend.open()
    try:
        backend.sample(slow=True)
        time.sleep(3)  # a slow cycle later, so that per-process utilisation has samples
        cycle = backend.sample(slow=True)
        apps, table = smi_apps(), smi_pids(mps.gpu_index)
    finally:
        backend.close()
    (gpu,) = [d for d in cycle.devices if d.info.uuid == mps.gpu_uuid]
    procs = {p.pid: p for p in gpu.processes}
    for p in gpu.processes:
        print(f"exporter pid {p.pid} {p.process!r}: contexts {sorted(p.contexts)}, "
              f"{(p.memory_used_bytes or 0) / MIB:.0f} MiB, util {dict(p.utilization_ratio)}"
              f"; nvidia-smi {apps.get(p.pid)} MiB, -q {table.get(p.pid)}")
    servers = [p for p in gpu.processes if p.process.startswith("nvidia-cuda-mps")]
    print("server(s):", [(p.pid, sorted(p.contexts)) for p in servers])
    for pid, hold in zip(mps.pids, HOLD_MIB, strict=True):
        assert pid in procs, f"MPS client {pid} is not among the exporter's processes"
        p = procs[pid]
        assert "mps_client" in p.contexts, (pid, dict(p.contexts))
        assert p.memory_used_bytes is not None
        smi_mib = apps.get(pid) if pid in apps else table.get(pid, ("", None))[1]
        assert smi_mib is not None, f"nvidia-smi shows no memory for {pid}"
        # nvidia-smi prints MiB, rounded: equal within one MiB
        assert abs(p.memory_used_bytes / MIB - smi_mib) <= 1, (pid, p.memory_used_bytes,
                                                                 smi_mib)
        assert p.memory_used_bytes >= hold * MIB  # what it holds, plus its context
