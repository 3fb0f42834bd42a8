"""What the AMD and Intel sysfs backends cost per card per fast cycle, and the idle daemon.

    python bench/sysfs_cost.py [--cycles 2000] [--profile 10] [--no-daemon]
    python bench/sysfs_cost.py --intervals 100ms,1s,10s --window 60 --windows 3
    python bench/sysfs_cost.py --before <previous tree>   # both trees, same minutes

Builds the three-GPU machine in a temporary directory from the committed fixture trees:
tests/fixtures/mixed with its NVIDIA card taken out (an AMD RX 7800 XT dGPU and an Intel
Arc B580 dGPU on xe), plus the Phoenix APU of tests/fixtures/amd-apu-phoenix. Its
i915/xe PMU is absent (no ``bus/event_source``), so the ``pmu`` backend is down, and
NVML is absent, so the ``nvidia`` backend is down: what such a machine runs. Then:

1. Per card (a copy of the machine with only that card), in process, the daemon's own
   objects (``Daemon`` from the flags, its Hub, renderer and history wired as the
   daemon wires them), thread CPU time (``time.thread_time_ns``), median over
   ``--cycles`` back-to-back fast cycles after a warm-up: the backend's
   ``sample(slow=False)`` split by cProfile into reads (``pread``, the descriptor
   table, listings), parsing (text and binary to numbers, units, ranges), building
   (the backend's own Python: which file feeds which field, the DeviceSample) and the
   card-list check; then the Hub recording the cycle (accept), the snapshot merge
   (``merged_view``) and the publish (the subscribers: renderer, history). Against
   it, a bare loop that ``os.pread``s exactly the files one fast cycle read (found
   with an audit hook on ``open`` and a wrapper of ``os.pread``) on kept descriptors.
   For an AMD card, each part of the cycle (AMD_PARTS) measured in the cycle as it
   runs: the cycle with that part replaced by the results it gave, the difference.
   Then ``--cold`` cycles half a second apart, as a daemon runs them: its caches gone
   cold between two cycles, the same work costs several times a warm loop's.
2. The idle daemon on the machine at each of ``--intervals``, no scrapes, its /proc an
   empty tree: each thread's CPU from /proc/<pid>/task/*/schedstat (nanoseconds) over
   ``--windows`` windows of ``--window`` seconds, the medians, % of one core; per
   thread, which is per backend (``collector-<backend>``, the name
   ``gpu_exporter_backend_cpu_seconds_total`` reads). ``--before TREE`` runs that
   tree's daemon beside this one's in the same windows (CPU time, not wall time, so
   both see the same load), and ``--repo TREE`` measures another tree in process.

Targets: each card at most 0.12 ms per fast cycle (sample alone); the idle daemon at
most 0.2 % of one core at 1 s (median of three 60 s windows), a backend that is down
at most 0.005 %.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from daemon_cost import schedstat  # noqa: E402
from scrape_latency import NAMED_THREADS_MAIN, free_port  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures"
PAGE = 4096
TARGET_MS_PER_CARD = 0.12
COLD_GAP = 0.5  # seconds between two cold cycles
TARGET_IDLE_PERCENT = 0.2
TARGET_DOWN_PERCENT = 0.005
# card -> (backend, PCI bus id)
CARDS = {"RX 7800 XT": ("amd", "0000:03:00.0"), "Arc B580": ("intel", "0000:09:00.0"),
         "Phoenix APU": ("amd", "0000:64:00.0")}
OTHERS = {"amd": ["--no-collector.intel"], "intel": ["--no-collector.amd"]}


def build_machine(dest: Path) -> Path:
    """AMD dGPU + Intel dGPU + AMD APU under ``dest``; returns the sysfs root."""
    root = dest / "sys"
    shutil.copytree(FIXTURES / "mixed" / "sys", root, symlinks=True)
    drm = root / "class" / "drm"
    for name in os.listdir(drm):  # the NVIDIA function's nodes: not read by amd/intel
        if "0000:05:00.0" in os.readlink(drm / name):
            (drm / name).unlink()
    apu = FIXTURES / "amd-apu-phoenix" / "sys"
    src = (apu / "class" / "drm" / "card1" / "device").resolve()
    dst = root / "devices" / "pci0000:00" / "0000:00:08.1" / "0000:64:00.0"
    shutil.copytree(src, dst, symlinks=True)  # same depth: its driver link still resolves
    os.symlink(os.path.relpath(dst / "drm" / "card1", drm), drm / "card3")
    return root


def one_card(machine: Path, bus: str, dest: Path) -> Path:
    """A copy of ``machine`` whose class/drm lists only the card at ``bus``."""
    root = dest / "sys"
    shutil.copytree(machine, root, symlinks=True)
    drm = root / "class" / "drm"
    for name in os.listdir(drm):
        if bus not in os.readlink(drm / name):
            (drm / name).unlink()
    return root


def files_read(cycle: Callable[[], Any]) -> list[str]:
    """The regular files one ``cycle()`` reads: those it opens (an audit hook sees
    ``open()`` and ``os.open``) and those it ``os.pread``s on descriptors kept open."""
    seen: dict[str, None] = {}
    active = [True]

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if active[0] and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.fsdecode(args[0])
            if os.path.isfile(path):
                seen.setdefault(path, None)

    real_pread = os.pread

    def pread(fd: int, size: int, offset: int) -> bytes:
        seen.setdefault(os.readlink(f"/proc/self/fd/{fd}"), None)
        return real_pread(fd, size, offset)

    sys.addaudithook(hook)  # cannot be removed: switched off below
    os.pread = pread
    try:
        cycle()
    finally:
        active[0] = False
        os.pread = real_pread
    return list(seen)


def cpu_us(cycle: Callable[[], Any], cycles: int, warmup: int = 50) -> float:
    """Median thread CPU time of ``cycle()``, µs."""
    for _ in range(warmup):
        cycle()
    times = []
    for _ in range(cycles):
        t0 = time.thread_time_ns()
        cycle()
        times.append(time.thread_time_ns() - t0)
    return statistics.median(times) / 1e3


def cold_us(cycle: Callable[[], Any], cycles: int, gap: float) -> float:
    """Median thread CPU time of ``cycle()`` run ``gap`` seconds apart, µs: what a daemon
    pays, its caches gone cold between two cycles (a warm loop reads lower)."""
    times = []
    for _ in range(cycles):
        time.sleep(gap)
        t0 = time.thread_time_ns()
        cycle()
        times.append(time.thread_time_ns() - t0)
    return statistics.median(times) / 1e3


def bare_loop(paths: list[str]) -> tuple[Callable[[], None], Callable[[], None]]:
    """(one cycle of pread on kept descriptors, close them)."""
    fds = [os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC) for p in paths]
    pread = os.pread

    def cycle() -> None:
        for fd in fds:
            try:
                pread(fd, PAGE, 0)
            except OSError:
                pass

    def close() -> None:
        for fd in fds:
            os.close(fd)

    return cycle, close


# -- where a sample's time goes (cProfile's own time per function, by kind) --------------
PARTS = ("reads", "parsing", "building", "card list")
_READS = {"pread", "open", "close", "listdir", "readlink", "stat", "lstat", "scandir",
          "isdir", "exists", "isfile", "fspath", "__fspath__", "raw", "names", "memo"}
_PARSING = {"decode", "strip", "split", "rstrip", "lstrip", "partition", "isdigit",
            "isascii", "startswith", "endswith", "unpack_from", "unpack", "isfinite",
            "number", "text", "clean_text", "link_speed", "link_width", "int", "float"}


def part_of(file: str, func: str) -> str:
    """Which of PARTS a function's own time counts to."""
    name = func.rsplit(".", 1)[-1].strip("<>'").split(" ")[-1].rstrip("'>")
    if "discovery.py" in file:
        return "card list"
    if "/sources/kernel/" in file or file.endswith("core/units.py"):
        return "parsing"
    if file.endswith("core/fs.py"):
        return "parsing" if name in _PARSING else "reads"
    if file in ("~", "") or "genericpath" in file or "posixpath" in file or \
            "pathlib" in file:
        if name in _READS:
            return "reads"
        if name in _PARSING:
            return "parsing"
    return "building"


def profile_parts(cycle: Callable[[], Any], cycles: int, top: int) -> dict[str, float]:
    """Share of each of PARTS in ``cycle()``'s own time under cProfile."""
    prof = cProfile.Profile(time.thread_time)  # CPU time: other work on the machine is not counted
    prof.enable()
    for _ in range(cycles):
        cycle()
    prof.disable()
    stats = pstats.Stats(prof)
    parts: Counter[str] = Counter()
    rows = []
    for (file, _line, func), (_cc, _nc, tottime, _ct, _callers) in \
            stats.stats.items():  # type: ignore[attr-defined]
        parts[part_of(file, func)] += tottime
        rows.append((tottime, part_of(file, func), f"{Path(file).name}:{func}"))
    total = sum(parts.values()) or 1.0
    for tottime, part, where in sorted(rows, reverse=True)[:top]:
        print(f"      {tottime / cycles * 1e6:7.1f} us  {part:<9} {where}")
    return {p: parts[p] / total for p in PARTS}


def card_cost(name: str, machine: Path, cycles: int, top: int, cold: int) -> float:
    """Print one card's fast cycle, split; returns the sample's median µs."""
    from exporter.app.daemon import Daemon
    from exporter.app.flags import load_config
    from exporter.output.render import Renderer

    kind, bus = CARDS[name]
    with tempfile.TemporaryDirectory(prefix="sysfs-card-") as tmp:
        root = one_card(machine, bus, Path(tmp))
        proc = Path(tmp) / "proc"
        proc.mkdir()
        config = load_config(["--path.sysfs", str(root), "--path.procfs", str(proc),
                              "--no-collector.nvidia", "--no-collector.processes",
                              "--no-collector.pmu", *OTHERS[kind]], {})
        daemon = Daemon(config)
        hub = daemon.hub
        daemon.renderer = Renderer(lead=config.interval, options=daemon.render_options())
        hub.subscribe(daemon.renderer.submit)
        hub.subscribe(daemon.history.add)
        backend = next(b for b in daemon.backends if b.name == kind)
        hub.collect_once()  # opened, the first (slow) cycle read, the GPU numbered
        try:
            files = files_read(lambda: backend.sample(False))
            sample = cpu_us(lambda: backend.sample(False), cycles)
            # The Hub's recording alone: with a publishing thread (any will do) set, a
            # cycle wakes it instead of publishing on the calling thread.
            hub._publisher = threading.current_thread()
            cycle = cpu_us(lambda: hub._sample(backend, False), cycles)
            hub._publisher = None

            def merge() -> None:
                with hub._publish_lock:
                    hub._build()

            merged = cpu_us(merge, cycles)
            publish = cpu_us(hub.publish, cycles)
            bare, close = bare_loop(files)
            floor = cpu_us(bare, cycles)
            close()
            print(f"  {name} ({kind}, {len(files)} files): sample {sample:.1f} us "
                  f"({sample / 1e3:.3f} ms, target <= {TARGET_MS_PER_CARD} ms: "
                  f"{_met(sample / 1e3 <= TARGET_MS_PER_CARD)}); accept "
                  f"{max(cycle - sample, 0):.1f}; merge {merged:.1f}; publish "
                  f"(subscribers) {max(publish - merged, 0):.1f}; bare pread loop "
                  f"{floor:.1f} us ({sample / floor:.0f}x)")
            if cold:
                print(f"    cold, {cold} cycles {COLD_GAP:g} s apart: sample "
                      f"{cold_us(lambda: backend.sample(False), cold, COLD_GAP):.1f} us")
            if kind == "amd":
                whole = cpu_us(lambda: backend.sample(False), cycles)
                print(f"    in the cycle (median {whole:.1f} us; each part replaced by the "
                      "results it gave, the difference): " + ", ".join(
                          f"{label} {whole - rest:.1f} us"
                          for label, rest in amd_parts(backend, cycles)))
            shares = profile_parts(lambda: backend.sample(False), max(cycles // 4, 100), top)
            print("    sample by part (cProfile shares x the median): " + ", ".join(
                f"{p} {shares[p] * sample:.1f} us" for p in PARTS))
            return sample
        finally:
            daemon.stop(timeout=0)


# What an amdgpu fast cycle is made of: (label, module, owner of the function, its name).
AMD_PARTS = (
    ("card (read_card)", "exporter.sources.amd.card", None, "read_card"),
    ("gpu_metrics decode and values", "exporter.sources.amd.card", None, "parse_gpu_metrics"),
    ("files' sample", "exporter.sources.amd.card", None, "_from_files"),
    ("planned reads", "exporter.core.fs", "AttrReader", "numbers"),
    ("fans", "exporter.sources.kernel.hwmon", None, "fan_ratios"),
    ("table's sample", "exporter.sources.amd.card", None, "_from_gpu_metrics"),
    ("fill", "exporter.sources.amd.card", None, "fill"),
    ("card list", "exporter.sources.discovery", "DrmDiscovery", "cards"),
)


def amd_parts(backend: Any, cycles: int) -> Iterator[tuple[str, float]]:
    """(part, median µs of the fast cycle with that part replaced by the results it gave
    in one real cycle, in call order): the part's cost in the cycle as it runs, caches
    and all, which a part timed alone in a loop understates. Parts this tree does not
    have are left out."""
    import importlib

    for label, module, owner, name in AMD_PARTS:
        holder = importlib.import_module(module)
        if owner is not None:
            holder = getattr(holder, owner, None)
        real = getattr(holder, name, None)
        if real is None:
            continue
        results: list[Any] = []

        def record(*args: Any, _real: Any = real, _results: list[Any] = results,
                   **kwargs: Any) -> Any:
            _results.append(_real(*args, **kwargs))
            return _results[-1]

        setattr(holder, name, record)
        try:
            backend.sample(False)
        finally:
            setattr(holder, name, real)
        given = iter(results * (cycles + 200))  # the cycle's results, in order, each cycle

        def replay(*args: Any, _given: Iterator[Any] = given, **kwargs: Any) -> Any:
            return next(_given)

        setattr(holder, name, replay)
        try:
            yield label, cpu_us(lambda: backend.sample(False), cycles)
        finally:
            setattr(holder, name, real)


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


# -- the idle daemon ----------------------------------------------------------------------
@contextmanager
def daemon(repo: Path, root: Path, proc: Path, interval: str) -> Iterator[subprocess.Popen[bytes]]:
    """That tree's daemon on the machine, every default collector, no scrapes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_EXPORTER_")}
    env["PYTHONPATH"] = str(repo.resolve())
    cmd = [sys.executable, "-c", NAMED_THREADS_MAIN, "--web.listen-address",
           f"127.0.0.1:{free_port()}", "--collector.interval", interval,
           "--path.sysfs", str(root), "--path.procfs", str(proc), "--log.format", "json"]
    p = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        yield p
    finally:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def per_thread(before: dict[str, tuple[str, int, int]], after: dict[str, tuple[str, int, int]],
               elapsed: float) -> Counter[str]:
    """% of one core per thread name over the window."""
    out: Counter[str] = Counter()
    for tid, (name, ns, _) in after.items():
        out[name] += (ns - before.get(tid, (name, 0, 0))[1]) / 1e9 / elapsed * 100
    return out


def idle(trees: dict[str, Path], root: Path, proc: Path, intervals: Sequence[str],
         window: float, windows: int, warmup: float) -> None:
    print(f"\nThe idle daemon, no scrapes, % of one core (schedstat), median of {windows} "
          f"window(s) of {window:g} s; load average {os.getloadavg()[0]:.1f} at the start")
    for interval in intervals:
        with ExitStack() as stack:
            procs = {label: stack.enter_context(daemon(repo, root, proc, interval))
                     for label, repo in trees.items()}
            time.sleep(warmup)
            runs: dict[str, list[Counter[str]]] = {label: [] for label in trees}
            loads = []
            for _ in range(windows):
                t0 = {label: schedstat(p.pid) for label, p in procs.items()}
                start = time.monotonic()
                time.sleep(window)
                elapsed = time.monotonic() - start
                for label, p in procs.items():
                    if p.poll() is not None:
                        raise SystemExit(f"the {label} daemon exited ({p.returncode})")
                    runs[label].append(per_thread(t0[label], schedstat(p.pid), elapsed))
                loads.append(os.getloadavg()[0])
        print(f"\n{interval} (load average over the windows {min(loads):.1f}-{max(loads):.1f}):")
        for label, counts in runs.items():
            wholes = [sum(c.values()) for c in counts]
            names = sorted({n for c in counts for n in c}, key=lambda n: -counts[0][n])
            split = ", ".join(f"{n} {statistics.median(c[n] for c in counts):.4f}"
                              for n in names)
            verdict = ""
            if interval == "1s":
                verdict = (f" (target <= {TARGET_IDLE_PERCENT}: "
                           f"{_met(statistics.median(wholes) <= TARGET_IDLE_PERCENT)})")
            print(f"  {label}: whole {statistics.median(wholes):.4f} % "
                  f"(windows {', '.join(f'{w:.4f}' for w in wholes)}){verdict}")
            print(f"    per thread: {split}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=2000, help="measured cycles per card")
    ap.add_argument("--cold", type=int, default=20, metavar="N",
                    help="also the median of N cycles 0.5 s apart, caches cold (0: not)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also print each card's N costliest functions (cProfile)")
    ap.add_argument("--repo", type=Path, default=REPO, help="in process: this tree's exporter")
    ap.add_argument("--before", type=Path, help="the idle daemon of this tree too, beside")
    ap.add_argument("--intervals", default="1s", help="idle daemon cadences (100ms,1s,10s)")
    ap.add_argument("--window", type=float, default=60.0, help="seconds (default 60)")
    ap.add_argument("--windows", type=int, default=3, help="windows per cadence (default 3)")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds (default 10)")
    ap.add_argument("--no-cards", action="store_true", help="skip the per-card cycles")
    ap.add_argument("--no-daemon", action="store_true", help="skip the idle daemon")
    args = ap.parse_args()
    sys.path.insert(0, str(args.repo.resolve()))
    with tempfile.TemporaryDirectory(prefix="sysfs-cost-") as tmp:
        machine = build_machine(Path(tmp))
        print(f"machine: AMD RX 7800 XT + Intel Arc B580 (xe) + AMD Phoenix APU, no PMU, "
              f"no NVML, under {machine}")
        if not args.no_cards:
            print(f"per card, {args.repo}: thread CPU per fast cycle, median of "
                  f"{args.cycles} back-to-back cycles")
            for name in CARDS:
                card_cost(name, machine, args.cycles, args.profile, args.cold)
        if args.no_daemon:
            return
        proc = Path(tmp) / "proc"
        proc.mkdir()
        trees = {"now": REPO, **({"before": args.before} if args.before else {})}
        idle(trees, machine, proc, args.intervals.split(","), args.window, args.windows,
             args.warmup)


if __name__ == "__main__":
    main()
