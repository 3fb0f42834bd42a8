"""``gpu-exporter top --prometheus URL`` as a user runs it: in tmux, at 80x24, against a
real Prometheus (Debian's) and a real VictoriaMetrics (Debian's), each scraping three
daemons on three fixture machines (the fleet of tests/test_fleet_prometheus_e2e.py: the
k8s node with its fake kubelet and runtime, the HGX H100 pair, the RX 7800 XT desktop).

What the screen must show is read from each daemon's own /metrics, not from the code
under test: every node and its GPU count, the k8s node (whose pods hold idle GPUs)
first, its processes (pids and names) once drilled into; then Esc back to the list and
q gives the terminal back. Once in the exporter's names and once in dcgm-exporter's.
The node list's load time is measured and printed (docs/deploy.md quotes it).
"""

from __future__ import annotations

import re
import socket
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from exporter.client.fleet.model import KEYS_HELP
from exporter.client.fleet.nodes import load_fleet
from exporter.client.fleet.promapi import PrometheusAPI
from exporter.core.config import MetricNames
from tests.prometheus_harness import PROMETHEUS, query
from tests.test_fleet_prometheus_e2e import fleet_api, truth, vm_api  # noqa: F401 - fixtures
from tests.test_top import assert_help_whole, needs_tmux, tmux, top_command
from tests.test_top_fleet import FLEET_LEGENDS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(PROMETHEUS).exists(),
                       reason="no prometheus binary (Debian package prometheus)"),
    needs_tmux,
]

Truth = dict[str, dict[str, list[dict[str, str]]]]


def row_of(screen: str, instance: str) -> str:
    rows = [line for line in screen.splitlines() if f" {instance} " in line]
    assert len(rows) == 1, screen
    return rows[0]


def rows_through_the_pages(t: Any, total: int) -> dict[str, str]:
    """The selected GPU's process rows, pid -> line, paging down (PgDn) to the last."""
    seen: dict[str, str] = {}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        screen = t.screen()
        span = re.search(r"processes · (\d+)-(\d+) of (\d+)", screen)
        if span is None:
            time.sleep(0.2)
            continue
        assert int(span.group(3)) == total, screen
        for line in screen.splitlines():
            if m := re.match(r"\s*(\d+) +\S+ +[\d.]+ (?:[KMGT]i)?B ", line):  # pid user mem
                seen[m.group(1)] = line
        if int(span.group(2)) >= total:
            return seen
        t.keys("NPage")
        time.sleep(0.3)
    raise AssertionError(f"never reached the last process: {seen}")


@pytest.mark.parametrize("engine", ["prometheus", "victoriametrics"])
@pytest.mark.parametrize("names", ["gpu", "dcgm"])
def test_the_fleet_in_tmux_most_waste_first_drill_down_back_and_quit(
        fleet_api: tuple[str, dict[str, str]], truth: Truth, names: str,  # noqa: F811
        engine: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """The same screens from Prometheus and from VictoriaMetrics scraping the same daemons
    (its own dialect, MetricsQL; no rules: no waste alerts, the default idle threshold)."""
    api, machines = fleet_api
    if engine == "victoriametrics":
        api = request.getfixturevalue("vm_api")
    instance_of = {m: i for i, m in machines.items()}
    started = time.monotonic()
    command = top_command("--prometheus", api, "--metric-names", names,
                          "--prometheus.refresh-interval", "2s")
    with tmux(f"gxfleet-{engine}-{names}-{tmp_path.name}", command, 80, 24) as t:
        screen = t.wait("3 nodes", 30)
        shown = time.monotonic() - started
        print(f"\n{screen}")  # pytest -s: the screen as the user sees it
        # the title whole on its line, the list right under it
        assert screen.splitlines()[0].strip().startswith("gpu-exporter top")
        assert screen.splitlines()[1].startswith("   NODE")
        for machine, metrics in truth.items():
            gpus = len({m["gpu"] for m in metrics["gpu_up"]})
            row = row_of(screen, instance_of[machine])
            assert re.search(rf" {re.escape(instance_of[machine])}\s+{gpus}\s", row), row
        lines = screen.splitlines()
        assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
        assert "q quit" in lines[-1] or "q quit" in screen.rstrip().splitlines()[-1]
        # the k8s node holds idle allocated GPUs: first, selected, its waste said
        first = next(line for line in lines if line.startswith("▶"))
        assert instance_of["k8s-node"] in first
        assert re.search(r"3 GPUs \d+ W", first), first
        for machine in ("nvidia-h100x2", "amd-rdna3-rx7800xt"):  # no pods: no GPU idle
            assert not re.search(r"GPUs? \d+ W", row_of(screen, instance_of[machine]))
        # Enter: the node's GPUs and processes
        t.keys("Enter")
        k8s = truth["k8s-node"]
        procs = k8s["gpu_process_memory_used_bytes"]
        on_gpu0 = {m["pid"]: m["process"] for m in procs if m["gpu"] == "0"}
        assert on_gpu0
        screen = t.wait(f"node {instance_of['k8s-node']}", 15)
        screen = t.wait("GPU 0 processes · 1-", 15)
        print(f"\n{screen}")
        seen = rows_through_the_pages(t, len(on_gpu0))
        assert set(seen) == set(on_gpu0), screen
        for pid, name in on_gpu0.items():
            assert name[:6] in seen[pid], (pid, name, seen[pid])  # the command, cut to fit
        # → : the next GPU's processes, as in the one-daemon view
        t.keys("Right")
        on_gpu1 = {m["pid"] for m in procs if m["gpu"] == "1"}
        screen = t.wait("GPU 1 processes", 10)
        for pid in on_gpu1:
            screen = t.wait(pid, 10)
        # Esc: back to the list, the same node selected
        t.keys("Escape")
        screen = t.wait("NODE", 10)
        assert "3 nodes" in screen
        first = next(line for line in screen.splitlines() if line.startswith("▶"))
        assert instance_of["k8s-node"] in first
        # ?: every line of the help whole at 80x24 (a new user learns the keys there)
        t.keys("?")
        screen = t.wait("Keys", 10)
        assert_help_whole(screen, KEYS_HELP, FLEET_LEGENDS)
        t.keys("x")  # any key closes it
        t.wait("NODE", 10)
        t.keys("q")
        screen = t.wait("END", 10)
        assert "EXIT=0" in screen
        assert "icanon" in screen and "-icanon" not in screen  # the terminal given back
        assert " echo" in screen and "-echo" not in screen
    print(f"\nfleet view ({engine}, {names}): node list on the screen {shown:.1f} s after the "
          "command (Python start-up included)")


def test_measure_the_node_list_load(fleet_api: tuple[str, dict[str, str]]) -> None:  # noqa: F811
    """The node list's load time and size on this fleet, printed for docs/deploy.md."""
    api, machines = fleet_api
    held = int(float(query(api, 'count({__name__=~".+"})')[0]["value"][1]))
    print(f"\nPrometheus holds {held} series")
    for names in (MetricNames.GPU, MetricNames.DCGM):
        client = PrometheusAPI(api)
        runs = [load_fleet(client, names=names) for _ in range(7)]
        assert all(not r.errors and len(r.nodes) == len(machines) for r in runs)
        median = statistics.median(r.seconds for r in runs)
        slowest = statistics.median(r.slowest for r in runs)
        print(f"\nnode list ({names}): {len(machines)} nodes, {runs[0].gpus} GPUs, "
              f"{runs[0].series} series in the answers; load median {1000 * median:.0f} ms "
              f"(slowest query median {1000 * slowest:.0f} ms) over {len(runs)} loads")
        assert median < 10.0


def test_q_exits_at_once_while_a_query_waits_on_a_silent_server(tmp_path: Path) -> None:
    """A server that accepts and never answers: the progress is drawn, q gives the
    terminal back at once (not after the queries' 30 s timeout), and a server that
    refuses is a state line, never a traceback."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with tmux(f"gxfleets-{tmp_path.name}", top_command("--prometheus", url), 80, 24) as t:
            t.wait("Loading the node list from Prometheus", 15)
            assert "0/" in t.screen() or "… loading" in t.screen()
            time.sleep(0.5)
            asked = time.monotonic()
            t.keys("q")
            screen = t.wait("END", 10)
            assert time.monotonic() - asked < 5
            assert "EXIT=0" in screen and "Traceback" not in screen
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"  # bound, not listening
        with tmux(f"gxfleetr-{tmp_path.name}", top_command("--prometheus", url), 80, 24) as t:
            screen = t.wait("No answer from Prometheus", 15)
            assert "Connection" in screen and "Traceback" not in screen
            t.keys("q")
            assert "EXIT=0" in t.wait("END", 10)
