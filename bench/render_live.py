"""Render cost of the live views for 8 GPUs: the page ``/``, the ``/api/v1/history`` body
and one ``gpu-exporter top`` frame.

    python bench/render_live.py [--gpus 8] [--processes 64] [--window 900] [--interval 1]
                                [--n 50] [--width 200] [--height 60]

A snapshot of ``--gpus`` H100 samples (bench/dcgm_render.py's, with a power limit, fans,
PCIe link and thresholds added) with ``--processes`` processes each in pods, and a
History full to its capacity (``--window`` / ``--interval`` samples per GPU, values that
change from sample to sample). CPU times of this thread, as medians of ``--n`` runs:
- the page: ``exporter.serve.landing.page`` (what ``/`` renders on the renderer's thread);
- the history JSON, full (a first poll) and incremental (``?since=``, every poll after;
  top asks for every process row, the page for the five it shows), ``History.as_json``
  plus ``json.dumps`` as ``/api/v1/history`` does;
- one top frame: decoding and merging a history reply (``?since=``: the tables and
  every process row, the newest samples) and drawing the screen with rich, at
  ``--width`` x ``--height`` and at 80 x 24 (needs the top extra: pip install
  '.[top]' in the checkout);
- ``History.add``, the one cost on the publishing thread (once per interval).
The seed's target is a dashboard render under 10 ms.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from exporter.core.model import ProcessSample  # noqa: E402
from exporter.pipeline import health  # noqa: E402
from exporter.pipeline.state import BackendState  # noqa: E402
from exporter.serve import landing  # noqa: E402
from exporter.serve.history import History  # noqa: E402
from exporter.serve.tables import TOP_PROCESSES  # noqa: E402
from exporter.serve.view import MAX_ROWS  # noqa: E402

MINIMA: dict[str, float] = {}


def median_ms(fn: Callable[[], object], n: int, name: str = "") -> float:
    """The median CPU time of ``fn`` on this thread (time.thread_time: on a shared
    machine, the time another process had the core is not counted), in ms; the minimum
    goes to MINIMA[name] (the figure least disturbed by other load)."""
    times = []
    for _ in range(n):
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    MINIMA[name] = min(times) * 1e3
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--processes", type=int, default=64, help="per GPU")
    ap.add_argument("--window", type=float, default=900.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--width", type=int, default=200, help="top's terminal columns")
    ap.add_argument("--height", type=int, default=60, help="top's terminal lines")
    args = ap.parse_args()
    from dcgm_render import sample  # type: ignore[import-not-found]

    processes = tuple(ProcessSample(pid=1000 + p, process=f"python3-{p}",
                                    memory_used_bytes=float((p + 1) << 28),
                                    utilization_ratio={"sm": p % 10 / 10},
                                    namespace="ml", pod=f"trainer-{p}", container="main",
                                    user="alice", command=f"python3 train.py --rank {p}")
                      for p in range(args.processes))

    def devices(step: int) -> tuple[tuple[str, Any], ...]:
        return tuple((str(i), dataclasses.replace(
            sample(i, 0), processes=processes, utilization_ratio=(step * 7 + i) % 100 / 100,
            power_watts=300.0 + (step * 13 + i) % 400, power_limit_watts=700.0,
            temperatures_celsius={"gpu": 40.0 + (step + i) % 40, "memory": 50.0},
            temperature_limits_celsius={("gpu", "shutdown"): 92.0, ("gpu", "slowdown"): 89.0},
            fan_speed_ratio={"0": 0.3}, pcie_link_generation=5, pcie_link_width=16,
            pcie_link_max_generation=5, pcie_link_max_width=16,
            clocks_hertz={"graphics": 1.98e9, "sm": 1.98e9, "memory": 2.619e9}))
            for i in range(args.gpus))

    class Snap:
        ready = True
        created = 1e9

        def __init__(self, step: int) -> None:
            self.devices = devices(step)
            self.health = health.verdicts(self.devices, 1e9)
            self.backends = (BackendState(name="nvidia", up=True, reason=""),)

    history = History(args.window, args.interval)
    snaps = [Snap(step) for step in range(10)]
    adds = []
    for i in range(history.capacity):
        t0 = time.thread_time()
        history.add(snaps[i % 10], now=1e9 + i * args.interval)  # type: ignore[arg-type]
        adds.append(time.thread_time() - t0)
    now = 1e9 + history.capacity * args.interval
    snap = snaps[0]

    def body(since: float = 0.0, rows: int = MAX_ROWS) -> bytes:
        return json.dumps(history.as_json(since, now=now, rows=rows),
                          separators=(",", ":")).encode()

    page_ms = median_ms(lambda: landing.page(snap, history, "/metrics", now=now),  # type: ignore[arg-type]
                        args.n, "page")
    page_kib = len(landing.page(snap, history, "/metrics", now=now).encode()) / 1024  # type: ignore[arg-type]
    full_ms, full_kib = median_ms(body, args.n, "full"), len(body()) / 1024
    last = now - args.interval * 1.5  # the page's next poll: the newest sample only
    inc_ms, inc_kib = median_ms(lambda: body(last), args.n, "since"), len(body(last)) / 1024
    poll_ms = median_ms(lambda: body(last, TOP_PROCESSES), args.n, "poll")
    poll_kib = len(body(last, TOP_PROCESSES)) / 1024
    print(f"{args.gpus} GPUs, {args.processes} processes each, {history.capacity} samples "
          f"per GPU; median CPU time of {args.n}")
    print(f"page /                    {page_ms:7.2f} ms  {page_kib:6.0f} KiB  "
          f"(min {MINIMA['page']:.2f} ms)")
    print(f"history JSON, full        {full_ms:7.2f} ms  {full_kib:6.0f} KiB  "
          f"(min {MINIMA['full']:.2f} ms)")
    print(f"history JSON, ?since=     {inc_ms:7.2f} ms  {inc_kib:6.0f} KiB  "
          f"(min {MINIMA['since']:.2f} ms; top's poll: every process row)")
    print(f"  ... &processes={TOP_PROCESSES}      {poll_ms:7.2f} ms  {poll_kib:6.0f} KiB  "
          f"(min {MINIMA['poll']:.2f} ms; the page's poll)")
    print(f"History.add               {statistics.median(adds) * 1e3:7.2f} ms  "
          "(collector thread, once per interval)")
    try:
        from rich.console import Console
        from rich.live import Live

        from exporter.client.top import command as top
    except ImportError:
        print("top frame                 (skipped: pip install '.[top]' in the checkout)")
        return
    reply = json.loads(body())
    incremental = json.loads(body(last))
    model, view = top.Model(), top.View()
    model.merge(reply)

    def frame(width: int, height: int) -> Callable[[], None]:
        """As top draws: rich's Live on the alternate screen, a refresh per frame."""
        console = Console(file=io.StringIO(), width=width, height=height,
                          color_system="truecolor", force_terminal=True)
        live = Live(console=console, screen=True, auto_refresh=False, redirect_stdout=False,
                    redirect_stderr=False)
        live.start()

        def run() -> None:
            model.merge(incremental)
            console.file = io.StringIO()
            live.update(top.frame(model, view, "http://127.0.0.1:9445", width, height),
                        refresh=True)
        return run

    for width, height in ((args.width, args.height), (80, 24)):
        name = f"top {width}x{height}"
        frame_ms = median_ms(frame(width, height), args.n, name)
        print(f"{'top frame ' + str(width) + 'x' + str(height):<25} {frame_ms:7.2f} ms  "
              f"(min {MINIMA[name]:.2f} ms; decode and merge a reply, draw the screen)")


if __name__ == "__main__":
    main()
