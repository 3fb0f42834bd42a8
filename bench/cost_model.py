"""The cost model of the NVIDIA path: CPU per cycle tier, per GPU, per NVLink, per process.

    python bench/cost_model.py [--gpus 1,2,4,8,16] [--procs 0,8,64] [--links 0,18]
                               [--nvml stub|fake] [--gap 0.02] [--calls-json FILE]
                               [--json OUT]
    python bench/cost_model.py --daemon [--gpus 1,4] [--intervals 100ms,1s,10s]
                               [--window 30] [--links 18] [--repo OTHER_TREE]
    python bench/cost_model.py --daemon --nvml real --gpus 1,4   # on a 4-GPU machine

1. In process (one fresh interpreter per machine shape): the NVIDIA backend and the
   Hub, wired as the daemon wires them (the renderer and the live page's history
   subscribed), on ``--gpus`` x ``--links`` active NVLinks x ``--procs`` processes per
   GPU. For each cycle tier it measures the calling thread's CPU time
   (``time.thread_time_ns``), median over the cycles, ``--gap`` seconds apart (a daemon
   runs its cycles cold; back to back they are 2-5x cheaper):

   - fast: ``sample(slow=False)``, every ``--collector.interval``;
   - slow: a slow cycle on which no rarer read is due (``--collector.slow-interval``);
   - rare: a slow cycle on which the rare tier is due (every RARE_EVERY-th slow cycle:
     the power limit, ECC, the spinning counters, NVLink throughput and errors);
   - publish: the Hub's publish of one cycle (merge, cap, attribution, energy split,
     health, the history's sample, the renderer's hand-over);

   and counts the NVML calls each tier makes (by function, and the entries of every
   ``nvmlDeviceGetFieldValues`` batch) in a second, untimed pass. A least-squares fit
   of ``cost = fixed + a*GPUs + b*GPUs*links + c*GPUs*processes`` over the grid gives
   the CPU per GPU, per NVLink and per process of each tier.

   ``--nvml stub`` (default) binds nvidia-ml-py to bench/nvml_stub.py's C library,
   whose every call returns at once: the driver's own time is absent, so what is
   measured is nvidia-ml-py's ctypes marshalling and the exporter's own Python, the
   part that scales per GPU in our code. ``--nvml fake`` uses tests/fakes' FakeNVML
   (its own Python is then counted too). The driver's share is estimated from the
   call counts times a per-call CPU cost: ``--calls-json`` (bench/nvml_calls.py
   ``--json`` on the GPU machine), else DRIVER_US below (the device measurements of
   docs/performance.md). ``--nvml real`` (on the GPU machine) measures this machine's
   GPUs as they are, our Python and the driver's time together.

2. ``--daemon``: the daemon itself on the stub library (``--gpus`` GPUs, ``--links``
   NVLinks each, no processes, no scrapes), at each ``--intervals``, each thread's CPU
   from /proc/<pid>/task/*/schedstat over ``--window`` seconds (a 10 s interval gets at
   least 6 cycles): the local analogue of the device's "alone, idle" table, without the
   driver's time. With ``--nvml real`` (on a machine with at least max(``--gpus``)
   GPUs): the daemon on the real driver, shown only the first N GPUs (its
   ``nvmlDeviceGetCount`` answers min(GPUs, N); NVML has no device mask of its own),
   so 1 and 4 GPUs are measured on one machine, in the same minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

TIERS = ("fast", "slow", "rare", "publish")
# Driver CPU per call, microseconds, where no --calls-json is given: one H200 (driver
# 580.159.04, bench/nvml_calls.py, docs/performance.md's table: wall time, an upper
# bound of CPU) and, for NVLink, two NVLinked H100s (nvlink.py's docstring). A call not
# listed is taken as 2 us (the plain getters' cost).
DRIVER_US: dict[str, float] = {
    "nvmlDeviceGetUtilizationRates": 1.3, "nvmlDeviceGetMemoryInfo": 6.6,
    "nvmlDeviceGetTemperature": 1.5, "nvmlDeviceGetPowerUsage": 1.4,
    "nvmlDeviceGetClockInfo": 1.6, "nvmlDeviceGetCurrPcieLinkWidth": 31.8,
    "nvmlDeviceGetComputeRunningProcesses": 7.1, "nvmlDeviceGetGraphicsRunningProcesses": 7.1,
    "nvmlEventSetWait_v2": 2.6, "nvmlDeviceGetPcieReplayCounter": 176.0,
    "nvmlGpmSampleGet": 760.0, "nvmlGpmMetricsGet": 760.0,
    "nvmlDeviceGetProcessUtilization": 2447.0, "nvmlDeviceGetTotalEnergyConsumption": 3195.0,
    "nvmlDeviceGetPcieThroughput": 520.0,  # CPU per direction (H100); 21 ms of wall time
    "nvmlDeviceGetViolationStatus": 470.0, "nvmlDeviceGetNvLinkErrorCounter": 790.0,
    "nvmlDeviceGetNvLinkState": 200.0,  # inferred: 35 ms per two-GPU slow cycle, less the rest
    "nvmlDeviceGetFieldValues": 4.3,
    "field:nvlink_throughput": 361.0,  # per field in a batch: 36 fields 13 ms (H100)
}
DEFAULT_DRIVER_US = 2.0


# -- one machine shape, in a fresh interpreter ---------------------------------------------
def _nvml(kind: str, gpus: int, links: int, procs: int) -> Any:
    if kind == "real":  # the machine's GPUs, links and processes
        import pynvml

        return pynvml
    if kind == "stub":
        from nvml_stub import load

        return load(gpus, links, procs)
    from tests.fakes.fake_nvml import FakeGPU, FakeNvLink, FakeNVML, FakeProcess

    return FakeNVML(gpus=[FakeGPU(index=i, nvlinks=[FakeNvLink(state=1) for _ in range(links)],
                                  processes=[FakeProcess(pid=100_000 + 1000 * i + p,
                                                         used_memory_bytes=(p + 1) << 26)
                                             for p in range(procs)])
                          for i in range(gpus)])


class Counting:
    """Counts the NVML calls made through ``nvml`` while on: every ``nvml*`` function by
    name, and the field ids of each field-values batch (the exporter calls the C function
    through ``_nvmlGetFunctionPointer``, see exporter.sources.nvidia.fields)."""

    def __init__(self, nvml: Any) -> None:
        self.on = False
        self._depth = 0  # nvidia-ml-py's own nested calls (_v3 variants, helpers) not counted
        self.calls: Counter[str] = Counter()
        self.fields: Counter[str] = Counter()
        self._nvml = nvml
        for name in dir(nvml):
            fn = getattr(nvml, name, None)
            if name.startswith("nvml") and callable(fn) and not isinstance(fn, type):
                setattr(nvml, name, self._wrap(name, fn))
        lookup = nvml._nvmlGetFunctionPointer

        def pointer(name: str) -> Any:
            fn = lookup(name)
            if name != "nvmlDeviceGetFieldValues":
                return fn
            return self._batch(fn)

        nvml._nvmlGetFunctionPointer = pointer

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self.on and not self._depth:
                self.calls[name] += 1
            self._depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1
        return counted

    def _batch(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        nvlink = {getattr(self._nvml, f"NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{d}", -1)
                  for d in ("TX", "RX")}

        def counted(handle: Any, count: Any, ref: Any) -> Any:
            if self.on:
                self.calls["nvmlDeviceGetFieldValues"] += 1
                for i in range(int(count.value)):
                    fid = int(ref._obj[i].fieldId)
                    self.fields["nvlink_throughput" if fid in nvlink else str(fid)] += 1
            return fn(handle, count, ref)
        return counted


def child(kind: str, gpus: int, links: int, procs: int, cycles: int, gap: float,
          unread: bool = False) -> dict[str, Any]:
    """The costs of one machine shape (run in a fresh interpreter: ``--child``)."""
    if kind == "fake":
        sys.path.insert(0, str(REPO / "tests" / "fakes" / "pynvml_shim"))
    nvml = _nvml(kind, gpus, links, procs)
    counting = Counting(nvml)
    from exporter.app.flags import load_config
    from exporter.output.render import Renderer, RenderOptions
    from exporter.pipeline.hub import Hub
    from exporter.serve.history import History
    from exporter.sources.nvidia.backend import NvidiaBackend
    from exporter.sources.nvidia.device import RARE_EVERY
    from exporter.sources.readers import Readers

    with tempfile.TemporaryDirectory(prefix="cost-model-") as empty:  # an empty /proc
        proc = "/proc" if kind == "real" else empty
        config = load_config(["--path.procfs", proc, "--collector.interval", "1s"], {})
        # unread: nobody scrapes (the readings only a reader sees are taken once);
        # else every one is wanted, as under a scraper (exporter.sources.readers).
        backend = NvidiaBackend(config, nvml, readers=Readers(always=not unread))
        hub = Hub(config, [backend])
        renderer = Renderer(lead=config.interval, options=RenderOptions())
        history = History(config.web_history, config.interval)
        hub.subscribe(renderer.submit)
        hub.subscribe(history.add)
        hub.collect_once()  # opened, the first (slow) cycle, the GPUs numbered
        gpu0 = backend._gpus[0].dev  # its slow-cycle count says which tier is due
        if kind == "real":
            gpus, links, procs = len(backend._gpus), len(gpu0.nvlink.remote), 0

        def tier_of_next_slow() -> str:
            return "rare" if gpu0._slow_cycles % RARE_EVERY == 0 else "slow"

        times: dict[str, list[int]] = {t: [] for t in TIERS}
        calls: dict[str, Counter[str]] = {t: Counter() for t in TIERS}
        fields: dict[str, Counter[str]] = {t: Counter() for t in TIERS}
        seen: Counter[str] = Counter()

        def run(tier: str, fn: Callable[[], Any], count: bool) -> Any:
            counting.on = count
            t0 = time.thread_time_ns()
            result = fn()
            spent = time.thread_time_ns() - t0
            counting.on = False
            if count:
                seen[tier] += 1
                calls[tier].update(counting.calls)
                fields[tier].update(counting.fields)
                counting.calls.clear()
                counting.fields.clear()
            else:
                times[tier].append(spent)
            if gap:
                time.sleep(gap)
            return result

        def accept(cycle: Any) -> None:
            hub._accept(backend.name, cycle, 0.0)

        # Slow cycles until each of slow and rare has been timed enough; fast cycles and
        # publishes between them, as the daemon runs them. Then an untimed counting pass.
        want = max(3, cycles // 4)
        for count in (False, True):
            target = 2 * RARE_EVERY if count else want * RARE_EVERY
            for _ in range(target):
                tier = tier_of_next_slow()
                accept(run(tier, lambda: backend.sample(True), count))
                run("publish", hub.publish, count)
                for _ in range(max(1, cycles // want) if not count else 1):
                    accept(run("fast", lambda: backend.sample(False), count))
                    run("publish", hub.publish, count)
        renderer.stop()
        hub.stop(timeout=0)
    out: dict[str, Any] = {"gpus": gpus, "links": links, "procs": procs}
    for tier in TIERS:
        out[tier] = {"cpu_us": statistics.median(times[tier]) / 1e3 if times[tier] else None,
                     "n": len(times[tier]),
                     "calls": {k: v / max(1, seen[tier]) for k, v in calls[tier].items()},
                     "fields": {k: v / max(1, seen[tier]) for k, v in fields[tier].items()}}
    return out


# -- the grid, the fit, the table --------------------------------------------------------------
def shape(args: argparse.Namespace, gpus: int, links: int, procs: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", f"{gpus},{links},{procs}", "--nvml", args.nvml,
           "--cycles", str(args.cycles), "--gap", str(args.gap),
           *(["--unread"] if args.unread else [])]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_EXPORTER_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"{gpus} GPUs x {links} links x {procs} processes failed:\n"
                         f"{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def driver_us(tier: Mapping[str, Any], per_call: Mapping[str, float]) -> float:
    """The driver's CPU for one cycle of a tier: its calls times their measured cost; the
    NVLink throughput fields of a batch at their per-field cost."""
    total = 0.0
    for name, n in tier["calls"].items():
        total += n * per_call.get(name, DEFAULT_DRIVER_US)
    total += tier["fields"].get("nvlink_throughput", 0) * per_call.get("field:nvlink_throughput",
                                                                        0.0)
    return total


def fit(rows: Sequence[Mapping[str, Any]], value: Callable[[Mapping[str, Any]], float]
        ) -> tuple[float, float, float, float]:
    """Least squares of value = fixed + a*G + b*G*L + c*G*P (normal equations, 4x4)."""
    xs = [(1.0, r["gpus"], r["gpus"] * r["links"], r["gpus"] * r["procs"]) for r in rows]
    ys = [value(r) for r in rows]
    used = [j for j in range(4) if any(x[j] for x in xs)]
    n = len(used)
    a = [[sum(x[used[i]] * x[used[j]] for x in xs) for j in range(n)] for i in range(n)]
    b = [sum(x[used[i]] * y for x, y in zip(xs, ys, strict=True)) for i in range(n)]
    for col in range(n):  # Gauss-Jordan
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        a[col], a[pivot], b[col], b[pivot] = a[pivot], a[col], b[pivot], b[col]
        if abs(a[col][col]) < 1e-12:
            continue
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [v - f * w for v, w in zip(a[r], a[col], strict=True)]
                b[r] -= f * b[col]
    coef = [0.0] * 4
    for i, j in enumerate(used):
        coef[j] = b[i] / a[i][i] if abs(a[i][i]) > 1e-12 else 0.0
    return coef[0], coef[1], coef[2], coef[3]


def load_calls_json(path: Path | None) -> dict[str, float]:
    per_call = dict(DRIVER_US)
    if path is None:
        return per_call
    got = json.loads(path.read_text())
    for row in got.get("rows", []):
        name = str(row["call"]).split("(")[0].split(" ")[0]
        if row.get("cpu_us") is not None and name.startswith("nvml"):
            per_call[name] = float(row["cpu_us"])
    return per_call


def real(args: argparse.Namespace) -> None:
    """One machine shape: this machine's GPUs through the real NVML (our Python and the
    driver's time together, on the calling thread)."""
    r = shape(args, 0, 0, 0)
    per_call = load_calls_json(args.calls_json)
    print(f"\nNVIDIA path on this machine's NVML ({r['gpus']} GPUs, {r['links']} active NVLinks "
          f"on GPU 0), in process, cycles {args.gap:g} s apart; CPU of the calling thread "
          f"(ours and the driver's), median:\n")
    print("| tier | CPU us | NVML calls | field entries | driver estimate us (calls x per-call) |")
    print("|---|---:|---:|---:|---:|")
    for tier in TIERS:
        t = r[tier]
        print(f"| {tier} | {t['cpu_us']:,.0f} | {sum(t['calls'].values()):g} | "
              f"{sum(t['fields'].values()):g} | {driver_us(t, per_call):,.0f} |")
    print("\nPer second at each --collector.interval, % of one core (the NVIDIA thread and "
          "the publish):")
    for interval in (0.1, 1.0, 10.0):
        ours, _ = per_second(r, interval, per_call)
        print(f"  {interval:g} s: {ours:.3f} %")
    if args.json:
        args.json.write_text(json.dumps({"rows": [r], "per_call_us": per_call}, indent=1))


def grid(args: argparse.Namespace) -> None:
    if args.nvml == "real":
        real(args)
        return
    per_call = load_calls_json(args.calls_json)
    rows = []
    for links in args.links:
        for procs in args.procs:
            for gpus in args.gpus:
                r = shape(args, gpus, links, procs)
                rows.append(r)
                print(f"{gpus:>2} GPUs x {links:>2} links x {procs:>2} processes: " + ", ".join(
                    f"{t} {r[t]['cpu_us']:.0f} us" for t in TIERS), file=sys.stderr, flush=True)
    source = "bench/nvml_stub.py (the driver's time is absent)" if args.nvml == "stub" else \
        "tests/fakes FakeNVML (its own Python counted too)"
    print(f"\nNVIDIA path, in process, NVML: {source}; CPU of the calling thread, median, "
          f"cycles {args.gap:g} s apart; Python {sys.version.split()[0]}; "
          f"{'nobody scrapes' if args.unread else 'scraped (every reading wanted)'}\n")
    print("Our Python per cycle, microseconds (G GPUs x processes per GPU; L NVLinks per GPU):\n")
    head = [f"{g} GPU{'s' if g > 1 else ''}" for g in args.gpus]
    print("| tier | L | processes | " + " | ".join(head) + " | 4 GPUs / 1 |")
    print("|---|---:|---:|" + "---:|" * len(head) + "---:|")
    by = {(r["gpus"], r["links"], r["procs"]): r for r in rows}
    for tier in TIERS:
        for links in args.links:
            for procs in args.procs:
                cells = [by[(g, links, procs)][tier]["cpu_us"] for g in args.gpus]
                ratio = ""
                if 1 in args.gpus and 4 in args.gpus:
                    one, four = by[(1, links, procs)][tier]["cpu_us"], \
                        by[(4, links, procs)][tier]["cpu_us"]
                    ratio = f"{four / one:.2f}x" if one else ""
                print(f"| {tier} | {links} | {procs} | " + " | ".join(f"{c:,.0f}" for c in cells)
                      + f" | {ratio} |")
    print("\nNVML calls per cycle (1 GPU; per added GPU the same again), "
          "and the entries of its field-values batches:\n")
    print("| tier | L | calls, 1 GPU, 0 processes | field entries | calls by function |")
    print("|---|---:|---:|---:|---|")
    for tier in TIERS:
        for links in args.links:
            r = by.get((1, links, args.procs[0]))
            if r is None:
                continue
            t = r[tier]
            calls = sum(t["calls"].values())
            entries = sum(t["fields"].values())
            named = ", ".join(f"{k.removeprefix('nvmlDevice').removeprefix('nvml')} {v:g}"
                              for k, v in sorted(t["calls"].items(), key=lambda kv: -kv[1]))
            print(f"| {tier} | {links} | {calls:g} | {entries:g} | {named} |")
    print("\nThe model, per cycle (least squares over the grid): fixed + per GPU + per NVLink "
          "+ per process, microseconds of CPU; driver: calls x per-call CPU "
          f"({'--calls-json ' + str(args.calls_json) if args.calls_json else 'DRIVER_US'}):\n")
    print("| tier | ours: fixed | per GPU | per NVLink | per process | driver: per GPU | "
          "per NVLink | per process |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    model: dict[str, dict[str, float]] = {}
    for tier in TIERS:
        py = fit(rows, lambda r, t=tier: r[t]["cpu_us"] or 0.0)  # type: ignore[misc]
        drv = fit(rows, lambda r, t=tier: driver_us(r[t], per_call))  # type: ignore[misc]
        model[tier] = {"fixed": py[0], "gpu": py[1], "link": py[2], "process": py[3],
                       "driver_gpu": drv[1], "driver_link": drv[2], "driver_process": drv[3]}
        print(f"| {tier} | {py[0]:,.0f} | {py[1]:,.1f} | {py[2]:,.2f} | {py[3]:,.2f} | "
              f"{drv[1]:,.0f} | {drv[2]:,.1f} | {drv[3]:,.2f} |")
    print("\nPer second of the daemon at each --collector.interval (slow tier every 10 s, "
          "rare every 3rd slow cycle), % of one core, our Python + the driver's estimate:\n")
    print("| interval | shape | ours | driver (est.) | total | 4 GPUs / 1 |")
    print("|---|---|---:|---:|---:|---:|")
    for interval in (0.1, 1.0, 10.0):
        for links in args.links:
            costs = {}
            for g in (1, 4):
                if (g, links, 0) not in by:
                    continue
                ours, drv = per_second(by[(g, links, 0)], interval, per_call)
                costs[g] = (ours, drv)
            for g, (ours, drv) in costs.items():
                ratio = ""
                if g == 4 and 1 in costs:
                    ratio = f"{(ours + drv) / sum(costs[1]):.2f}x"
                print(f"| {interval:g} s | {g} GPU x {links} NVLinks | {ours:.3f} | {drv:.3f} | "
                      f"{ours + drv:.3f} | {ratio} |")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "model": model,
                                         "per_call_us": per_call}, indent=1))


def per_second(r: Mapping[str, Any], interval: float, per_call: Mapping[str, float],
               slow_interval: float = 10.0) -> tuple[float, float]:
    """(% of one core for our Python, for the driver) of the backend thread and the
    publish at ``interval``: every cycle publishes; one in slow/interval is slow, a third
    of those rare (the cycle is a slow one instead of a fast one)."""
    from exporter.sources.nvidia.device import RARE_EVERY

    cycles = 1.0 / interval
    slow = 1.0 / max(slow_interval, interval)
    rare = slow / RARE_EVERY
    plain, fast = slow - rare, cycles - slow

    def mix(f: Callable[[Mapping[str, Any]], float]) -> float:
        return (fast * f(r["fast"]) + plain * f(r["slow"]) + rare * f(r["rare"])
                + cycles * f(r["publish"])) / 1e6 * 100

    return mix(lambda t: float(t["cpu_us"] or 0.0)), mix(lambda t: driver_us(t, per_call))


# -- the daemon on the stub library ------------------------------------------------------------
STUB_MAIN = """
import sys
sys.path.insert(0, sys.argv.pop(1))
from nvml_stub import load
load(int(sys.argv.pop(1)), int(sys.argv.pop(1)), 0)
exec(sys.argv.pop(1))
"""


# The daemon on the real driver, shown its first N GPUs (argv: N, then the daemon's main).
FIRST_GPUS_MAIN = """
import sys
import pynvml
_count, _limit = pynvml.nvmlDeviceGetCount, int(sys.argv.pop(1))
pynvml.nvmlDeviceGetCount = lambda: min(_count(), _limit)
exec(sys.argv.pop(1))
"""


def daemon(args: argparse.Namespace) -> None:
    from daemon_cost import schedstat
    from scrape_latency import NAMED_THREADS_MAIN, free_port

    real = args.nvml == "real"
    if real:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        print(f"{count} NVIDIA GPU(s) on this machine" + (
            f": a row of more GPUs shows {count}" if count < max(args.gpus) else ""))
    where = "the real driver" if real else "bench/nvml_stub.py (driver time absent)"
    print(f"The daemon on {where}, idle, no scrapes, % of one core per thread over "
          f"{args.window:g} s (10 s: at least 60 s)\n")
    print("| interval | GPUs x NVLinks | collector-nvidia | collector-publish | other threads | "
          "whole process | 4 GPUs / 1 |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for interval in args.intervals.split(","):
        totals: dict[int, float] = {}
        for gpus in args.gpus:
            port = free_port()
            env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_EXPORTER_")}
            env["PYTHONPATH"] = str(args.repo.resolve())
            with tempfile.TemporaryDirectory(prefix="cost-daemon-") as tmp:
                launcher = [FIRST_GPUS_MAIN, str(gpus)] if real else \
                    [STUB_MAIN, str(HERE), str(gpus), str(args.links[-1])]
                cmd = [sys.executable, "-c", *launcher,
                       NAMED_THREADS_MAIN, "--web.listen-address", f"127.0.0.1:{port}",
                       "--collector.interval", interval, "--path.procfs", tmp,
                       "--log.format", "json"]
                proc = subprocess.Popen(cmd, cwd=args.repo, env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
                try:
                    window = max(args.window, 60.0) if interval.endswith("10s") else args.window
                    time.sleep(args.warmup)
                    before = schedstat(proc.pid)
                    t0 = time.monotonic()
                    time.sleep(window)
                    after = schedstat(proc.pid)
                    elapsed = time.monotonic() - t0
                finally:
                    proc.terminate()
                    proc.wait(10)
            per: Counter[str] = Counter()
            for tid, (name, ns, _) in after.items():
                per[name] += (ns - before.get(tid, (name, 0, 0))[1]) / 1e9 / elapsed * 100
            whole = sum(per.values())
            totals[gpus] = whole
            nvidia, publish = per.get("collector-nvidi", 0.0), per.get("collector-publi", 0.0)
            ratio = ""
            if gpus != 1 and totals.get(1):
                ratio = (f"{whole / totals[1]:.2f}x (<= 3x: "
                         f"{'met' if whole <= 3 * totals[1] else 'NOT met'})")
            links = "real" if real else args.links[-1]
            print(f"| {interval} | {gpus} x {links} | {nvidia:.3f} | {publish:.3f} | "
                  f"{whole - nvidia - publish:.3f} | {whole:.3f} | {ratio} |", flush=True)


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=ints, default=[1, 2, 4, 8, 16])
    ap.add_argument("--procs", type=ints, default=[0, 8, 64])
    ap.add_argument("--links", type=ints, default=[0, 18])
    ap.add_argument("--nvml", choices=("stub", "fake", "real"), default="stub",
                    help="real: this machine's GPUs, one shape (on the GPU machine)")
    ap.add_argument("--cycles", type=int, default=60, help="fast cycles timed per shape")
    ap.add_argument("--gap", type=float, default=0.02, help="seconds between timed cycles")
    ap.add_argument("--calls-json", type=Path, help="bench/nvml_calls.py --json output")
    ap.add_argument("--json", type=Path, help="write the rows and the model here")
    ap.add_argument("--unread", action="store_true",
                    help="nobody scrapes: the readings only a reader sees are taken once")
    ap.add_argument("--daemon", action="store_true", help="the daemon per thread instead")
    ap.add_argument("--intervals", default="100ms,1s,10s")
    ap.add_argument("--window", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--repo", type=Path, default=REPO, help="--daemon: another tree's exporter")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        g, links, p = ints(args.child)
        print(json.dumps(child(args.nvml, g, links, p, args.cycles, args.gap, args.unread)))
    elif args.daemon:
        daemon(args)
    else:
        grid(args)


if __name__ == "__main__":
    main()
