"""``gpu-exporter top --prometheus URL``: the fleet in the terminal, from the Prometheus
(or Thanos, Mimir, VictoriaMetrics) that scrapes it.

The node list (exporter.client.fleet.nodes's ``load_fleet``: per node its GPUs, mean
utilisation, memory, power, worst health verdict and waste, most waste first) is loaded
every ``--prometheus.refresh-interval``; Enter on a node loads that node
(``load_node``: its GPUs and processes, and ``load_history`` for the sparklines) and
shows it as the one-daemon view shows a daemon; Esc goes back. Only what is on the
screen is loaded, each at most once per interval (a load that takes longer is followed
by a pause before the next: Prometheus is never asked back to back), and each answer is
bounded in series, bytes and time (exporter.client.fleet.promapi). A load in progress is drawn
as "loading 7/12 queries".

Here: the poller and the view over exporter.client.terminal; the state and keys are
exporter.client.fleet.model's, the screen exporter.client.fleet.screen's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from exporter.client.fleet.flags import Query
from exporter.client.fleet.model import FleetModel, FleetView, clean, key, take_node
from exporter.client.fleet.nodes import Fleet, Progress, load_fleet, load_history, load_node
from exporter.client.fleet.promapi import PrometheusAPI
from exporter.client.fleet.screen import frame
from exporter.client.terminal import Screen, Wakeup, run

HISTORY_WINDOW = 1200.0  # seconds of a node's GPUs' utilisation in its sparklines
HISTORY_POINTS = 120
MIN_PAUSE = 2.0  # seconds between the end of a load and the next, at least


class FleetApp:
    """The fleet view: the model of Prometheus' answers and what the operator looks at."""

    def __init__(self, source: str, query: Query, max_series: int,
                 wakeup: Wakeup | None = None) -> None:
        self.model = FleetModel(source=source, refresh=query.refresh, max_series=max_series)
        self.view = FleetView()
        self.wakeup = wakeup

    @property
    def wanted(self) -> str | None:
        """What the screen shows, so what the poller loads: a node, or the list (None)."""
        node = self.view.node
        return None if node is None else node.node

    def frame(self, width: int, height: int) -> Screen:
        return frame(self.model, self.view, width, height)

    def key(self, k: str) -> bool:
        going, kick = key(self.view, self.model, k)
        if kick and self.wakeup is not None:
            self.wakeup.kick()
        return going

    def take(self, kind: str, payload: object) -> None:
        if kind == "progress" and isinstance(payload, tuple):
            node, progress = payload
            if isinstance(progress, Progress):
                self.model.take_progress(node, progress)
        elif kind == "fleet" and isinstance(payload, Fleet):
            self.model.take_fleet(payload)
            self.view.keep_selection(self.model)
        elif kind == "node" and isinstance(payload, tuple):
            raw, detail, history = payload
            self.model.load = None
            if self.view.node is not None and self.view.node.node == raw:
                take_node(self.view.node, detail, history)
        elif kind == "failed" and isinstance(payload, tuple):  # a bug, not an answer
            node, message = payload
            self.model.load = None
            error = (clean(f"internal error: {message}", 300),)
            if node is None:
                self.model.loaded, self.model.errors = True, error
            elif self.view.node is not None and self.view.node.node == node:
                self.view.node.loaded, self.view.node.errors = True, error


def poll(api: PrometheusAPI, query: Query, wanted: Callable[[], str | None],
         wakeup: Wakeup) -> None:
    """Load what the screen shows when it is due: the list, or the node drilled into;
    each load's progress and result go to the view."""
    due: dict[str | None, float] = {}
    while not wakeup.stopped:
        node = wanted()
        now = time.monotonic()
        if now < due.get(node, -math.inf):
            wakeup.wait(due[node] - now)
            continue

        def progress(p: Progress, node: str | None = node) -> None:
            wakeup.post("progress", (node, p))

        try:
            if node is None:
                wakeup.post("fleet", load_fleet(api, query.names, query.node_label,
                                                query.matchers, progress))
            else:
                detail = load_node(api, node, query.names, query.node_label, query.matchers,
                                   progress)
                history = load_history(api, node, query.names, query.node_label,
                                       query.matchers, HISTORY_WINDOW, HISTORY_POINTS)
                wakeup.post("node", (node, detail, history))
        except Exception as e:  # noqa: BLE001 - the loads return failures; this is a bug
            wakeup.post("failed", (node, f"{type(e).__name__}: {e}"))
        due[node] = max(now + query.refresh, time.monotonic() + min(query.refresh, MIN_PAUSE))


def main(api: PrometheusAPI, query: Query) -> int:
    """Run the fleet view until q or Ctrl-C (0), or a hang-up or SIGTERM (129, 143)."""
    wakeup = Wakeup()
    app = FleetApp(clean(api.display, 200), query, api.max_series, wakeup)
    return run(app, lambda w: poll(api, query, lambda: app.wanted, w), wakeup,
               name="top-prometheus")

