"""What the running daemon imports, and its RSS, as configured on an NVIDIA-only host.

    python bench/imports.py [--real] [--list] [--repeat 3] [-- extra daemon flags]
    python bench/imports.py --costs      # what each optional feature's imports cost
    python bench/imports.py --machines   # the daemon's RSS on no-GPU and fixture machines

Runs ``exporter.app.cli.main`` exactly as ``python -m exporter.app.cli`` does (main thread,
uvicorn serving, every collector at its default: amd, intel, fdinfo and pmu find no
card and retry), with the fake NVML on the nvidia-h100x2 fixture machine (``--real``:
the machine's NVML and /sys). A watcher thread in the same process waits for
``/-/ready``, scrapes ``/metrics`` once, lets a few cycles run, then records
``sorted(sys.modules)`` and VmRSS and stops the daemon with SIGTERM.

Prints the median RSS over ``--repeat`` runs, the module count, the top-level
packages and the exporter's own modules (``--list``: every module). The same probe
backs tests/test_imports.py, which asserts what must not be imported.

``--costs``: in a fresh interpreter per feature, imports what every daemon imports
(DAEMON_BASE), reads VmRSS, imports the feature's modules (FEATURES: what the exporter
imports when the feature is configured) and prints the RSS and module count they add.
``--machines``: the probe's RSS on a machine without GPUs (the fake NVML answering
"driver not loaded", empty /sys and /proc), the NVIDIA fixture machine and the mixed
NVIDIA + AMD + Intel fixture machine.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MACHINE = REPO / "tests" / "fixtures" / "nvidia-h100x2"
SHIM = REPO / "tests" / "fakes" / "pynvml_shim"

# argv: port, output file, then the daemon's flags. Only reads and signals the daemon.
PROBE = """
import http.client, json, os, signal, sys, threading, time
port, out = int(sys.argv[1]), sys.argv[2]
def get(path, headers={}):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()
def watch():
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if get("/-/ready") == 200:
                    break
            except OSError:
                pass
            time.sleep(0.05)
        status = get("/metrics", {"Accept-Encoding": "gzip"})
        time.sleep(2.5)  # more fast cycles, and the card-less backends' retries
        rss = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS:")]
        with open(out, "w") as f:
            json.dump({"status": status, "rss_kib": rss[0], "modules": sorted(sys.modules),
                       "threads": sorted(t.name for t in threading.enumerate())}, f)
    finally:  # no file written: probe() shows the daemon's log
        os.kill(os.getpid(), signal.SIGTERM)
threading.Thread(target=watch, name="probe", daemon=True).start()
from exporter.app.cli import main
sys.argv = ["gpu-exporter", *sys.argv[3:]]
sys.exit(main())
"""


# What every running daemon imports before any optional feature.
DAEMON_BASE = ("exporter.app.cli", "exporter.app.daemon", "exporter.serve.server",
               "exporter.pipeline.hub",
               "exporter.output.render.exposition", "uvicorn.server", "starlette.applications",
               "prometheus_client", "structlog", "pynvml")
# feature -> the modules the exporter imports when it is configured.
FEATURES = {
    "Kubernetes (gRPC, protobuf)": ("exporter.attribution.kubernetes.backend", "grpc",
                                    "exporter.attribution.kubernetes.proto.podresources_pb2_grpc"),
    "config file / web config (PyYAML)": ("yaml",),
    "basic auth (bcrypt)": ("bcrypt",),
    "OTLP push (OpenTelemetry SDK, HTTP exporter)": ("exporter.output.otlp",),
    "rich (the top command only)": ("rich.console", "rich.live", "rich.table"),
}
COST_PROBE = """
import importlib, json, sys
def rss():
    return [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS:")][0]
base, feature = sys.argv[1].split(","), sys.argv[2].split(",")
sys.modules["rich"] = None  # as exporter.app.cli.main does: structlog would import it
for m in base:
    importlib.import_module(m)
del sys.modules["rich"]
before, n = rss(), len(sys.modules)
for m in feature:
    importlib.import_module(m)
print(json.dumps({"kib": rss() - before, "modules": len(sys.modules) - n}))
"""


def import_cost(modules: Sequence[str], env: Mapping[str, str]) -> tuple[float, int]:
    """(MiB, modules) that importing ``modules`` adds to a daemon's interpreter."""
    out = subprocess.run([sys.executable, "-c", COST_PROBE, ",".join(DAEMON_BASE),
                          ",".join(modules)], cwd=REPO, env=dict(env), capture_output=True,
                         text=True, timeout=60, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return int(got["kib"]) / 1024, int(got["modules"])


def print_costs(repeat: int, env: Mapping[str, str]) -> None:
    print(f"RSS each optional feature's imports add to a daemon (median of {repeat} fresh "
          f"interpreters, after {len(DAEMON_BASE)} base imports):")
    for feature, modules in FEATURES.items():
        try:
            runs = [import_cost(modules, env) for _ in range(repeat)]
        except subprocess.CalledProcessError as e:
            print(f"  {feature:<46} not installed ({e.stderr.strip().splitlines()[-1]})")
            continue
        mib = statistics.median(r[0] for r in runs)
        print(f"  {feature:<46} {mib:6.1f} MiB, {runs[-1][1]:4d} modules")


def print_machines(repeat: int) -> None:
    """The daemon's RSS on a machine with no GPU and on the fixture machines."""
    mixed = REPO / "tests" / "fixtures" / "mixed"
    with tempfile.TemporaryDirectory(prefix="imports-empty-") as tmp:
        for d in ("sys", "proc"):
            (Path(tmp) / d).mkdir()
        machines = {
            "no GPU (NVML: driver not loaded, empty /sys)": (
                ["--path.sysfs", f"{tmp}/sys", "--path.procfs", f"{tmp}/proc"],
                REPO / "tests" / "fixtures" / "no-nvidia.json"),
            "NVIDIA 2 x H100 fixture (fake NVML)": (nvidia_only_args(), MACHINE / "nvml.json"),
            "mixed NVIDIA + AMD + Intel fixture": (
                ["--path.sysfs", str(mixed / "sys"), "--path.procfs", str(mixed / "proc")],
                mixed / "nvml.json"),
        }
        print(f"daemon RSS after the first scrape, median of {repeat} runs:")
        for name, (args, nvml) in machines.items():
            env = nvidia_only_env()
            env["FAKE_NVML_JSON"] = str(nvml)
            runs = [probe(args, env) for _ in range(repeat)]
            rss = statistics.median(int(r["rss_kib"]) / 1024  # type: ignore[call-overload]
                                    for r in runs)
            modules: list[str] = runs[-1]["modules"]  # type: ignore[assignment]
            print(f"  {name:<46} {rss:6.1f} MiB, {len(modules)} modules")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nvidia_only_args(real: bool = False) -> list[str]:
    """Flags of an NVIDIA-only host: the fixture machine's trees, or the real ones."""
    if real:
        return []
    return ["--path.sysfs", str(MACHINE / "sys"), "--path.procfs", str(MACHINE / "proc")]


def nvidia_only_env(real: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_EXPORTER_")}
    paths = [*([] if real else [str(SHIM)]), str(REPO), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    if not real:
        env["FAKE_NVML_JSON"] = str(MACHINE / "nvml.json")
    return env


def probe(args: Sequence[str], env: Mapping[str, str], cwd: Path = REPO) -> dict[str, object]:
    """Run the daemon once under the probe: {"status", "rss_kib", "modules"}."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="imports-") as tmp:
        out = Path(tmp) / "probe.json"
        proc = subprocess.run(
            [sys.executable, "-c", PROBE, str(port), str(out), "--web.listen-address",
             f"127.0.0.1:{port}", "--log.format", "json", *args],
            cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=90)
        if not out.exists():
            raise RuntimeError(f"daemon exited {proc.returncode}: {proc.stdout[-3000:]}"
                               f"{proc.stderr[-3000:]}")
        result: dict[str, object] = json.loads(out.read_text())
        return result


def describe(modules: Sequence[str]) -> str:
    """The module count, the top-level packages and the exporter's own modules."""
    top = sorted({m.split(".")[0] for m in modules if not m.startswith("_")})
    ours = [m.removeprefix("exporter.") for m in modules if m.startswith("exporter.")]
    return (f"  modules in sys.modules: {len(modules)}\n"
            f"  top-level packages ({len(top)}): {' '.join(top)}\n"
            f"  exporter modules ({len(ours)}): {' '.join(ours)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", action="store_true", help="real NVML and /sys")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--list", action="store_true", help="print every module")
    ap.add_argument("--repo", type=Path, default=REPO, help="run another tree's exporter")
    ap.add_argument("--costs", action="store_true", help="RSS of each feature's imports")
    ap.add_argument("--machines", action="store_true", help="RSS on no-GPU / fixture machines")
    ap.add_argument("extra", nargs="*", help="more daemon flags (after --)")
    args = ap.parse_args()
    env = nvidia_only_env(args.real)
    if args.costs or args.machines:
        if args.costs:
            print_costs(args.repeat, env)
        if args.machines:
            print_machines(args.repeat)
        return
    if args.repo != REPO:
        env["PYTHONPATH"] = env["PYTHONPATH"].replace(str(REPO), str(args.repo.resolve()))
    runs = [probe([*nvidia_only_args(args.real), *args.extra], env, args.repo)
            for _ in range(args.repeat)]
    modules: list[str] = runs[-1]["modules"]  # type: ignore[assignment]
    rss = [int(r["rss_kib"]) / 1024 for r in runs]  # type: ignore[call-overload]
    print(f"{args.repo}: NVIDIA-only daemon ({'real' if args.real else 'fake'} NVML), "
          f"{args.repeat} runs")
    print(f"  RSS after the first scrape, median {statistics.median(rss):.1f} MiB "
          f"(runs: {', '.join(f'{r:.1f}' for r in rss)})")
    print(describe(modules))
    print(f"  threads: {' '.join(runs[-1]['threads'])}")  # type: ignore[arg-type]
    if args.list:
        print("\n".join(modules))


if __name__ == "__main__":
    main()
