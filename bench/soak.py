"""Soak: the real daemon for a long run under churn; RSS, fds, threads and CPU at start and end.

    python bench/soak.py [--duration 3600] [--warmup 60] [--report 60]

Runs ``python -m exporter.app.cli`` on a copy of the ``mixed`` fixture machine (NVIDIA through
the fake NVML, an AMD and an Intel card through their sysfs trees, fdinfo clients in a
procfs tree) with, for ``--duration`` seconds:

- process churn: a client process (a copy of the fixture's pid 3310, its fdinfo naming the
  AMD card) appears every ``--churn`` seconds under a new pid and the oldest goes once
  more than 16 are alive: the fdinfo scan and every per-process map see pids come and go;
- hotplug: every ``--hotplug`` seconds one card's DRM links (card, render node, connector)
  are taken out of ``sys/class/drm`` or put back, as tests/test_hotplug.py does (no udev
  on a copied tree: discovery notices on its own);
- scrapes: ``/metrics`` every second, ``/``, ``/api/v1/history`` and ``/snapshot`` every 5 s;
- reloads: a SIGHUP every ``--sighup`` seconds, the ``--config.file`` flipping
  ``collector.metrics.exclude`` and ``log.level`` between two values each time.

After ``--warmup`` seconds (imports, first collections, history filling) it reads the
daemon's VmRSS, open fds, threads and CPU seconds (utime + stime) from /proc, prints a line
every ``--report`` seconds, and at the end the start and end figures with the growth, and
the growth over the second half alone (the landing page's history, ``--web.history``
15m by default, fills during the first quarter of an hour and then holds still). A
failed scrape or a daemon that exits is counted and printed; exit status 1 if the daemon
died or any scrape failed.
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from scrape_latency import stop  # noqa: E402

FIXTURE = REPO / "tests" / "fixtures" / "mixed"
SHIM = REPO / "tests" / "fakes" / "pynvml_shim"
PERF_SHIM = REPO / "tests" / "fakes" / "perf_shim"
TEMPLATE_PID = "3310"  # a fixture client of the AMD card (renderD128, drm-pdev 0000:03:00.0)
MAX_CLIENTS = 16
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
CONFIGS = ("log:\n  level: info\n", "log:\n  level: warning\n"
           "collector:\n  metrics:\n    exclude: gpu_process_.*\n")


@dataclass
class Figures:
    at: float
    rss_mib: float
    fds: int
    threads: int
    cpu_s: float


def figures(pid: int) -> Figures:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    rss_kib = int(fields["VmRSS"].split()[0])
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(stat[11]) + int(stat[12])) / CLK_TCK  # utime, stime (fields 14, 15)
    return Figures(time.monotonic(), rss_kib / 1024, len(os.listdir(f"/proc/{pid}/fd")),
                   int(fields["Threads"]), cpu)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Machine:
    """The copied fixture tree, with its process churn and hotplug."""

    def __init__(self, root: Path) -> None:
        self.root = root
        shutil.copytree(FIXTURE, root, symlinks=True)
        self.proc = root / "proc"
        self.drm = root / "sys" / "class" / "drm"
        self.parked = root / "parked"
        self.parked.mkdir()
        self.template = self.proc / TEMPLATE_PID
        self.clients: list[Path] = []
        self.next_pid = 20000
        # One group of DRM links per card, by the PCI address its link goes through.
        self.cards: dict[str, list[str]] = {}
        for link in sorted(self.drm.iterdir()):
            target = os.readlink(link)
            bus = target.split("/drm/")[0].rsplit("/", 1)[-1]
            self.cards.setdefault(bus, []).append(link.name)
        self.turn = 0
        self.hotplugs = 0

    def churn(self) -> None:
        pid = str(self.next_pid)
        self.next_pid += 1
        new = self.proc / pid
        shutil.copytree(self.template, new, symlinks=True)
        status = new / "status"
        status.write_text(status.read_text().replace(f"\t{TEMPLATE_PID}\n", f"\t{pid}\n"))
        for info in (new / "fdinfo").iterdir():
            text = info.read_text()
            info.write_text(text.replace("drm-client-id:\t57", f"drm-client-id:\t{pid}"))
        self.clients.append(new)
        while len(self.clients) > MAX_CLIENTS:
            shutil.rmtree(self.clients.pop(0), ignore_errors=True)

    def hotplug(self) -> None:
        """Take one card out, or put back the one that is out; cards in turn."""
        parked = sorted(self.parked.iterdir())
        if parked:
            for link in parked:
                link.rename(self.drm / link.name)
        else:
            buses = sorted(self.cards)
            bus = buses[self.turn % len(buses)]
            self.turn += 1
            for name in self.cards[bus]:
                (self.drm / name).rename(self.parked / name)
        self.hotplugs += 1


class Client:
    def __init__(self, port: int) -> None:
        self.port = port
        self.ok = 0
        self.failed: dict[str, int] = {}
        self.gpus_seen: set[int] = set()  # GPUs with gpu_up 1: hotplug is followed
        self.reload_ok = ""  # the last gpu_exporter_config_last_reload_successful

    def get(self, path: str) -> None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
            conn.close()
            if resp.status == 200:
                self.ok += 1
                if path == "/metrics":
                    text = body.decode(errors="replace")
                    rows = text.splitlines()
                    self.gpus_seen.add(sum(1 for row in rows if row.startswith("gpu_up{")
                                           and float(row.split()[-1]) == 1))
                    for row in rows:
                        if row.startswith("gpu_exporter_config_last_reload_successful"):
                            self.reload_ok = row.split()[-1]
                return
            why = f"{path} {resp.status}"
        except (OSError, http.client.HTTPException) as e:
            why = f"{path} {type(e).__name__}"
        self.failed[why] = self.failed.get(why, 0) + 1


def line(label: str, f: Figures, t0: float) -> str:
    return (f"{label:<6} t={f.at - t0:7.0f}s  rss={f.rss_mib:7.1f} MiB  fds={f.fds:4d}  "
            f"threads={f.threads:3d}  cpu={f.cpu_s:8.1f}s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=3600.0, help="seconds (default 3600)")
    ap.add_argument("--warmup", type=float, default=60.0,
                    help="seconds before the start figures (default 60)")
    ap.add_argument("--report", type=float, default=60.0, help="seconds between lines")
    ap.add_argument("--churn", type=float, default=0.5, help="seconds between new processes")
    ap.add_argument("--hotplug", type=float, default=20.0, help="seconds between hotplugs")
    ap.add_argument("--sighup", type=float, default=10.0, help="seconds between SIGHUPs")
    ap.add_argument("--interval", default="1s", help="--collector.interval (default 1s)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="soak-") as tmpdir:
        tmp = Path(tmpdir)
        machine = Machine(tmp / "machine")
        config = tmp / "config.yml"
        config.write_text(CONFIGS[0])
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_EXPORTER_")}
        env.update(PYTHONPATH=os.pathsep.join([str(SHIM), str(PERF_SHIM), str(REPO)]),
                   PYTHONUNBUFFERED="1", FAKE_NVML_JSON=str(machine.root / "nvml.json"),
                   FAKE_PERF_JSON=str(machine.root / "perf.json"))
        argv = [sys.executable, "-m", "exporter.app.cli",
                "--web.listen-address", f"127.0.0.1:{port}", "--log.format", "json",
                "--path.sysfs", str(machine.root / "sys"),
                "--path.procfs", str(machine.proc),
                "--path.amdgpu-ids", str(machine.root / "usr/share/libdrm/amdgpu.ids"),
                "--collector.interval", args.interval,
                "--collector.processes.interval", "1s", "--collector.slow-interval", "2s",
                "--config.file", str(config)]
        log_path = tmp / "daemon.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log,
                                    stderr=subprocess.STDOUT)
        client = Client(port)
        sighups = 0
        try:
            deadline = time.monotonic() + 60
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    print(log_path.read_text(errors="replace")[-3000:])
                    raise SystemExit("daemon did not become ready")
                probe = Client(port)
                probe.get("/-/ready")
                if probe.ok:
                    break
                time.sleep(0.1)
            t0 = time.monotonic()
            print(f"soak: pid {proc.pid} on 127.0.0.1:{port}, {args.duration:.0f}s "
                  f"(warm-up {args.warmup:.0f}s), fixture {FIXTURE.name}; churn every "
                  f"{args.churn}s, hotplug every {args.hotplug}s, SIGHUP every "
                  f"{args.sighup}s", flush=True)
            start: Figures | None = None
            mid: Figures | None = None  # halfway: the history (--web.history) is full by then
            last: Figures | None = None
            nexts = dict.fromkeys(("churn", "hotplug", "sighup", "scrape", "page", "report"),
                                  t0)
            while (now := time.monotonic()) < t0 + args.duration:
                if proc.poll() is not None:
                    break
                if now >= nexts["churn"]:
                    machine.churn()
                    nexts["churn"] = now + args.churn
                if now >= nexts["hotplug"] and now > t0:
                    machine.hotplug()
                    nexts["hotplug"] = now + args.hotplug
                if now >= nexts["sighup"] and now > t0:
                    config.write_text(CONFIGS[sighups % 2])
                    proc.send_signal(signal.SIGHUP)
                    sighups += 1
                    nexts["sighup"] = now + args.sighup
                if now >= nexts["scrape"]:
                    client.get("/metrics")
                    nexts["scrape"] = now + 1.0
                if now >= nexts["page"]:
                    for path in ("/", "/api/v1/history", "/snapshot"):
                        client.get(path)
                    nexts["page"] = now + 5.0
                if start is None and now >= t0 + args.warmup:
                    start = figures(proc.pid)
                    print(line("start", start, t0), flush=True)
                    nexts["report"] = now + args.report
                elif mid is None and now >= t0 + args.duration / 2 and start is not None:
                    mid = last = figures(proc.pid)
                    print(line("half", mid, t0), flush=True)
                elif start is not None and now >= nexts["report"]:
                    last = figures(proc.pid)
                    print(line("", last, t0), flush=True)
                    nexts["report"] = now + args.report
                time.sleep(0.05)
            alive = proc.poll() is None
            end = figures(proc.pid) if alive else last
        finally:
            stop(proc)
        if not alive:
            print(f"daemon exited {proc.returncode} before the end:")
            print(log_path.read_text(errors="replace")[-3000:])
        if start is not None and end is not None:
            print(line("end", end, t0))
            span = end.at - start.at
            print(f"growth over {span:.0f}s: rss {end.rss_mib - start.rss_mib:+.1f} MiB, "
                  f"fds {end.fds - start.fds:+d}, threads {end.threads - start.threads:+d}, "
                  f"cpu {end.cpu_s - start.cpu_s:.1f}s "
                  f"({100 * (end.cpu_s - start.cpu_s) / max(span, 1e-9):.1f}% of a core)")
        if mid is not None and end is not None and end.at > mid.at:
            span = end.at - mid.at
            print(f"growth over the second half ({span:.0f}s): rss "
                  f"{end.rss_mib - mid.rss_mib:+.1f} MiB, fds {end.fds - mid.fds:+d}, threads "
                  f"{end.threads - mid.threads:+d}")
        print(f"processes started {machine.next_pid - 20000}, hotplugs {machine.hotplugs}, "
              f"SIGHUPs {sighups}, requests ok {client.ok}, failed "
              f"{sum(client.failed.values())} {client.failed or ''}")
        print(f"GPUs up per scrape seen: {sorted(client.gpus_seen)}; last "
              f"gpu_exporter_config_last_reload_successful {client.reload_ok or '-'}")
        return 0 if alive and not client.failed else 1


if __name__ == "__main__":
    sys.exit(main())
