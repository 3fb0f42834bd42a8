"""``gpu-exporter top --prometheus``'s view: the node list most waste first, scrolling,
drilling into a node and back, the state lines (a load in progress, failed queries, a
cut answer, no answer at all) and Prometheus' strings stripped before they are drawn.

Prometheus is faked at the HTTP boundary, as tests/test_fleet_client.py does: a local
server answers each query of exporter.client.fleet.ql (the expression text looked up in
FleetQL's own query tables) with the API's JSON envelope (Prometheus' querying/api
documentation); the view is fed what exporter.client.fleet.nodes made of it, as the poller
feeds it. The real server, daemons and terminal: tests/test_top_fleet_e2e.py.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from exporter.client.fleet.flags import Query, connect
from exporter.client.fleet.nodes import Progress, load_fleet, load_history, load_node
from exporter.client.fleet.promapi import PrometheusAPI
from exporter.client.fleet.ql import FleetQL
from exporter.core.config import ConfigError, MetricNames
from tests.test_fleet_client import Reply, serving, vector
from tests.test_top import assert_help_whole

pytest.importorskip("rich", reason="the top extra (rich) is not installed")

from rich.console import Console  # noqa: E402

from exporter.client.fleet import command as fleettop  # noqa: E402
from exporter.client.fleet.command import FleetApp  # noqa: E402
from exporter.client.terminal import Wakeup  # noqa: E402

EVIL = "gpu\x1b]0;pwned\x07node\x1b[2J\u202e"  # a title, a clear screen, a bidi override


def node_answers(nodes: Mapping[str, Mapping[str, str]]) -> dict[str, bytes]:
    """FleetQL's node-list queries -> a vector with one series per node holding that
    query's name (the rest answer no series)."""
    out = {}
    for name, expr in FleetQL().node_queries().items():
        rows = [({"instance": node}, values[name]) for node, values in nodes.items()
                if name in values]
        out[expr] = vector(*rows)
    return out


def script(answers: Mapping[str, bytes], default: bytes = vector()) -> object:
    def answer(handler: BaseHTTPRequestHandler, form: dict[str, str]) -> Reply:
        return Reply(body=answers.get(form.get("query", ""), default))
    return answer


FLEET = {
    "quiet-a": {"gpus": "2", "util": "0.9", "mem_used": "1073741824",
                "mem_total": "85899345920", "power": "500", "health": "0", "up": "1"},
    "wasteful": {"gpus": "8", "util": "0.02", "mem_used": "3221225472",
                 "mem_total": "687194767360", "power": "800", "health": "1", "up": "1",
                 "idle_gpus": "3", "idle_watts": "210", "idle_procs": "2",
                 "idle_memory": "2147483648"},
    EVIL: {"gpus": "1", "util": "0.5", "health": "2", "up": "1"},
    "down-node": {"up": "0"},
}


def text_of(app: FleetApp, width: int = 80, height: int = 24) -> list[str]:
    screen = app.frame(width, height)
    console = Console(width=width, height=height, record=True, force_terminal=True,
                      color_system="truecolor", file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(screen)
    raw = console.export_text(styles=True)
    console.file.close()
    assert "\x1b]" not in raw and "\x07" not in raw and "\u202e" not in raw  # only SGR
    assert not re.search(r"\x1b\[(?![0-9;]*m)", raw)
    lines = screen.plain.split("\n")
    assert len(lines) == height
    assert all(Console(width=400).measure(line).maximum <= width for line in lines if line)
    return lines


def loaded_app(nodes: Mapping[str, Mapping[str, str]] = FLEET) -> FleetApp:
    app = FleetApp("http://prometheus:9090", Query(), 20_000)
    with serving(script(node_answers(nodes))) as s:  # type: ignore[arg-type]
        app.take("fleet", load_fleet(PrometheusAPI(s.url)))
    return app


def test_the_node_list_is_most_waste_first_with_every_column() -> None:
    app = loaded_app()
    lines = text_of(app, 100, 24)
    rows = [line for line in lines if line[:3].strip() in ("▶●", "●", "✖", "▶✖", "?")]
    names = [re.split(r"\s+", r[3:].strip())[0] for r in rows]
    # the node wasting GPUs first; then, of the nodes without waste, the one whose
    # exporter is down; then by name
    assert names == ["wasteful", "down-node", "gpu]0;pwnednode[2J", "quiet-a"]
    wasteful = rows[0]
    assert re.search(r"wasteful\s+8\s+2%\s+3\.0/640G\s+800 W\s+▲ degraded\s+3 GPUs 210 W, "
                     r"2 procs 2\.0 GiB", wasteful), wasteful
    quiet = rows[-1]
    assert re.search(r"quiet-a\s+2\s+90%\s+1\.0/80G\s+500 W\s+✔ healthy\s+-", quiet), quiet
    down = rows[1]
    assert down[1:3].strip().startswith("✖") and "n/a" in down  # no GPU series: no data
    assert "4 nodes, 11 GPUs" in lines[0]
    assert lines[-1].startswith(" ↑↓ node") and "q quit" in lines[-1]


def test_a_node_up_without_gpus_reads_0_gpus_and_no_verdict() -> None:
    """It read "n/a" GPUs and health "?", the legend's symbol for "not scraped"."""
    app = loaded_app({**FLEET, "cpu-node": {"up": "1"}})
    (row,) = [line for line in text_of(app, 100, 24) if " cpu-node " in line]
    assert re.search(r"^ ● cpu-node\s+0\s+n/a\s+n/a\s+n/a\s+-\s+-$", row.rstrip()), row
    (node,) = [n for n in app.model.nodes if n.node == "cpu-node"]
    assert node.gpus == 0 and node.health is None
    # a node not scraped (its exporter down) still says it cannot tell
    (down,) = [line for line in text_of(app, 100, 24) if " down-node " in line]
    assert re.search(r"down-node\s+n/a\s.*\? n/a", down), down


FLEET_LEGENDS = (
    "GPUS: GPUs on the node; UTIL: their mean utilisation; MEMORY: used/total; POWER: their "
    "draw; HEALTH: the worst verdict (n lost: gpu_up 0; - no GPU)",
    "WASTE: allocated GPUs idle over 5 min (utilisation under 5 %) and their power; "
    "processes holding memory with no engine time and that memory; waste alerts firing. "
    "Most waste first.",
    "● exporter scraped (up) ✖ exporter down ? not scraped")


@pytest.mark.parametrize("width", [80, 120])
def test_the_fleet_help_and_header_are_whole_at_80_columns(width: int) -> None:
    """At 80x24 the fleet help lost its POWER/HEALTH legends and half of WASTE."""
    from exporter.client.fleet.model import KEYS_HELP

    app = loaded_app()
    lines = text_of(app, width, 24)
    assert lines[0].strip().startswith("gpu-exporter top") and "4 nodes, 11 GPUs" in lines[0]
    assert lines[1].startswith("   NODE")  # one title line: the list starts under it
    app.key("?")
    assert_help_whole("\n".join(text_of(app, width, 24)), KEYS_HELP, FLEET_LEGENDS, width)


def test_prometheus_strings_are_stripped_before_drawing() -> None:
    app = loaded_app()
    plain = "\n".join(text_of(app, 120, 30))
    assert "gpu]0;pwnednode[2J" in plain  # the printable rest of the name is kept
    # the raw name is kept to ask Prometheus about that node again
    assert EVIL in app.model.keys
    index = app.model.keys.index(EVIL)
    app.view.selected = index
    app.key("\r")
    assert app.wanted == EVIL


@pytest.mark.slow
def test_the_list_scrolls_and_keeps_the_selected_node_across_reloads() -> None:
    nodes = {f"node-{i:02d}": {"gpus": "4", "up": "1", "idle_procs": str(40 - i),
                               "idle_memory": "1e9"} for i in range(40)}
    app = loaded_app(nodes)
    lines = text_of(app)
    assert "node-00" in lines[2] and "▶" in lines[2]  # most idle processes first
    assert any("nodes 1-" in line and "of 40" in line for line in lines)
    for _ in range(25):
        app.key("j")
    lines = text_of(app)
    assert any("▶" in line and "node-25" in line for line in lines)
    assert not any("node-00" in line for line in lines)  # scrolled
    app.key("G")
    assert any("▶" in line and "node-39" in line for line in text_of(app))
    app.key("\x1b[5~")  # PgUp
    app.key("\x1b[6~")  # PgDn
    app.key("k")
    assert app.model.keys[app.view.selected] == "node-38"
    # a reload where the order changed: node-38 stays selected
    nodes["node-38"]["idle_procs"] = "100"
    app.take("fleet", load_again(nodes))
    assert app.view.selected == 0 and app.model.keys[0] == "node-38"
    assert any("▶" in line and "node-38" in line for line in text_of(app))


def load_again(nodes: Mapping[str, Mapping[str, str]]) -> object:
    with serving(script(node_answers(nodes))) as s:  # type: ignore[arg-type]
        return load_fleet(PrometheusAPI(s.url))


def gpu_answers(node: str) -> dict[str, bytes]:
    ql = FleetQL()
    q = ql.gpu_queries(node)
    gpu = {"instance": node, "job": "gpu-exporter"}
    g0 = {**gpu, "gpu": "0", "uuid": "GPU-aaa", "vendor": "nvidia"}
    g1 = {**gpu, "gpu": "1", "uuid": "GPU-bbb", "vendor": "nvidia"}
    proc = {**g0, "pid": "4242", "process": "python\x1b[31m", "namespace": "ml",
            "pod": "trainer-0", "container": "main"}
    idle = {**g0, "pid": "5151", "process": "notebook", "namespace": "ml",
            "pod": "nb-0", "container": "jupyter"}
    answers = {
        q["seen"]: vector((g0, "1"), (g1, "1")),
        q["info"]: vector(({**g0, "name": "NVIDIA H100 80GB HBM3"}, "1"),
                          ({**g1, "name": "NVIDIA H100 80GB HBM3"}, "1")),
        q["util"]: vector((g0, "0.01"), (g1, "0.75")),
        q["mem_used"]: vector((g0, "4294967296"), (g1, "8589934592")),
        q["mem_total"]: vector((g0, "85899345920"), (g1, "85899345920")),
        q["power"]: vector((g0, "90"), (g1, "400")),
        q["health"]: vector((g0, "0"), (g1, "1")),
        q["alloc"]: vector(({**g0, "namespace": "ml", "pod": "trainer-0",
                             "container": "main"}, "1")),
        q["idle_gpus"]: vector(({**g0, "namespace": "ml", "pod": "trainer-0"}, "0.01")),
        q["proc_memory"]: vector((proc, "2147483648"), (idle, "1073741824")),
        q["proc_util"]: vector((proc, "0.3"), (idle, "0")),
        q["idle_procs"]: vector((idle, "1073741824")),
    }
    return answers


@pytest.mark.slow
def test_drilling_into_a_node_shows_its_gpus_and_processes_and_esc_goes_back() -> None:
    app = loaded_app()
    app.view.selected = app.model.keys.index("wasteful")
    assert app.wanted is None
    assert app.key("\r") is True
    assert app.wanted == "wasteful" and app.view.node is not None
    lines = text_of(app)
    assert "node wasteful" in lines[0]
    assert any("Loading the node's GPUs" in line for line in lines)
    # a load in progress for the node is said on its screen, not the list's
    app.take("progress", ("wasteful", Progress(3, 14, "util")))
    lines = text_of(app)
    assert "⟳ loading 3/14 queries" in lines[0]
    with serving(script(gpu_answers("wasteful"))) as s:  # type: ignore[arg-type]
        api = PrometheusAPI(s.url)
        app.take("node", ("wasteful", load_node(api, "wasteful"),
                          load_history(api, "wasteful")))
    lines = text_of(app, 100, 30)
    plain = "\n".join(lines)
    assert "loading" not in plain
    assert "NVIDIA H100 80GB HBM3" in plain
    assert re.search(r"\b90 ?W", plain) and re.search(r"\b400 ?W", plain)
    assert re.search(r"4242 .*2\.00 GiB .*ml/trainer-0 \(main\) .*python\[31m", plain)
    assert re.search(r"5151 .*1\.00 GiB .*ml/nb-0 .*notebook \(idle", plain)
    assert "allocated and idle" in plain  # GPU 0's panel says why it is waste
    assert "\x1b" not in plain
    app.key("\x1b[C")  # → : the next GPU, as in the one-daemon view
    plain = "\n".join(text_of(app, 100, 30))
    assert "GPU 1 processes" in plain and "no processes reported" in plain
    # a node answer for another node (the operator moved on) is not drawn
    app.take("node", ("quiet-a", load_node(PrometheusAPI("http://127.0.0.1:9"), "x"), None))
    assert app.view.node.node == "wasteful"
    assert app.key("\x1b") is True  # Esc
    assert app.wanted is None
    lines = text_of(app)
    assert "NODE" in lines[1] and "4 nodes" in lines[0]
    app.key("\r")
    assert app.key("\x7f") is True and app.view.node is None  # Backspace
    assert app.key("q") is False


def test_help_and_quit() -> None:
    app = loaded_app()
    app.key("?")
    plain = "\n".join(text_of(app))
    assert "WASTE: allocated GPUs idle over 5 min" in plain
    assert app.key("x") is True and not app.view.help
    assert app.key("\x03") is False


@pytest.mark.slow
def test_no_answer_at_all_partial_answers_and_a_cut_answer_are_state_lines() -> None:
    app = FleetApp("http://prometheus:9090", Query(), 3)
    lines = text_of(app)
    assert "… loading" in lines[0] and "Loading the node list" in lines[2]
    app.take("progress", (None, Progress(7, 12, "util")))
    lines = text_of(app)
    assert "⟳ loading 7/12 queries" in lines[0]
    assert "Loading the node list from Prometheus: 7/12 queries" in lines[2]
    with serving(lambda h, f: Reply(status=401, body=b"")) as s:
        app.take("fleet", load_fleet(PrometheusAPI(s.url)))
    lines = text_of(app)
    assert "✖ no answer" in lines[0]
    assert "No answer from Prometheus" in lines[1] and "HTTP 401" in lines[1]
    assert any("No data" in line for line in lines)
    # some queries fail: the rest is drawn, and the line says how many failed
    answers = node_answers(FLEET)
    answers[FleetQL().node_queries()["power"]] = (
        b'{"status":"error","errorType":"execution","error":"query timed out\\u001b[2J"}')
    with serving(script(answers)) as s:  # type: ignore[arg-type]
        fleet = load_fleet(PrometheusAPI(s.url, max_series=3))
    app.take("fleet", fleet)
    lines = text_of(app, 120, 24)
    assert "● live" in lines[0]
    failed = next(line for line in lines if "failed" in line)
    assert "1 query failed" in failed and "power: execution: query timed out" in failed
    assert any("cut at 3 series (--prometheus.max-series)" in line for line in lines)


@pytest.mark.slow  # takes seconds
def test_a_load_with_no_answer_keeps_the_last_list_and_node_as_stale() -> None:
    app = loaded_app()
    unreachable = PrometheusAPI("http://127.0.0.1:9", timeout=2)
    app.take("fleet", load_fleet(unreachable))
    lines = text_of(app, 120, 24)
    assert "✖ not updating" in lines[0] and "4 nodes" in lines[0]
    assert "No answer from Prometheus" in lines[1] and "values below are from" in lines[1]
    assert any("wasteful" in line for line in lines)  # still drawn, dimmed
    with serving(script(node_answers(FLEET))) as s:  # type: ignore[arg-type]
        app.take("fleet", load_fleet(PrometheusAPI(s.url)))
    lines = text_of(app, 120, 24)
    assert "● live" in lines[0] and not any("No answer" in line for line in lines)
    app.view.selected = app.model.keys.index("wasteful")
    app.key("\r")
    with serving(script(gpu_answers("wasteful"))) as s:  # type: ignore[arg-type]
        app.take("node", ("wasteful", load_node(PrometheusAPI(s.url), "wasteful"), None))
    app.take("node", ("wasteful", load_node(unreachable, "wasteful"), None))
    lines = text_of(app, 120, 30)
    assert "✖ not updating" in lines[0]
    assert any("4242" in line for line in lines)  # the processes before, dimmed
    app.key("b")  # no backends pane here: Prometheus has no backends to show
    assert any("4242" in line for line in text_of(app, 120, 30))


def test_unreachable_is_a_state_line() -> None:
    app = FleetApp("http://127.0.0.1:9", Query(), 100)
    app.take("fleet", load_fleet(PrometheusAPI("http://127.0.0.1:9", timeout=2)))
    lines = text_of(app, 120, 24)
    assert "No answer from Prometheus" in lines[1] and "ConnectionRefusedError" in lines[1]


@pytest.mark.slow
def test_every_screen_fits_80x24_and_keeps_its_footer() -> None:
    app = loaded_app({f"n{i}": {"gpus": "8", "up": "1"} for i in range(100)})
    for size in ((80, 24), (100, 30), (200, 60), (40, 10)):
        lines = text_of(app, *size)
        assert "q quit" in lines[-1]
    app.key("\r")
    with serving(script(gpu_answers("n0"))) as s:  # type: ignore[arg-type]
        app.take("node", ("n0", load_node(PrometheusAPI(s.url), "n0"), None))
    for size in ((80, 24), (100, 30), (200, 60)):
        lines = text_of(app, *size)
        assert "Esc back" in lines[-1] and "q quit" in lines[-1]
        assert any("4242" in line for line in lines)


@pytest.mark.slow  # takes seconds
def test_the_poller_loads_what_is_shown_once_per_interval() -> None:
    """The list, then the node drilled into at once (a kick), then the list again only
    when its interval is due: never back to back."""
    seen: list[str] = []
    answers = {**node_answers(FLEET), **gpu_answers("wasteful")}
    lists = set(FleetQL().node_queries().values())
    nodes = set(FleetQL().gpu_queries("wasteful").values())

    def answer(handler: BaseHTTPRequestHandler, form: dict[str, str]) -> Reply:
        q = form.get("query", "")
        seen.append("history" if handler.path.endswith("query_range") else
                    "list" if q in lists else "node" if q in nodes else "other")
        return Reply(body=answers.get(q, vector()))

    wakeup = Wakeup()
    app = FleetApp("x", Query(refresh=1.0), 100, wakeup)
    with serving(answer) as s:
        thread = threading.Thread(target=fleettop.poll, args=(
            PrometheusAPI(s.url), Query(refresh=1.0), lambda: app.wanted, wakeup))
        thread.start()
        try:
            kind, fleet = wait_for(wakeup, "fleet")
            app.take(kind, fleet)
            started = time.monotonic()
            app.view.selected = app.model.keys.index("wasteful")
            app.key("\r")
            kind, payload = wait_for(wakeup, "node")
            assert time.monotonic() - started < 1.0  # at once, not at the next interval
            app.take(kind, payload)
            assert app.view.node is not None and len(app.view.node.model.devices) == 2
            kind, payload = wait_for(wakeup, "node")  # the node again, an interval later
            assert time.monotonic() - started >= 0.9
        finally:
            wakeup.stop()
            thread.join(10)
            wakeup.close()
    assert seen.count("list") == len(lists)  # the list once: it is not on the screen now
    assert seen.count("node") == 2 * len(nodes) and seen.count("history") == 2
    assert "other" not in seen


def wait_for(wakeup: Wakeup, kind: str, timeout: float = 10.0) -> tuple[str, object]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = wakeup.replies.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        if got[0] == kind:
            return got
    raise AssertionError(f"no {kind} posted")


def test_flags_become_the_client_and_the_queries(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    api, query = connect("https://prom.example:9090/prom", {
        "prometheus.bearer-token-file": str(token), "metric-names": "dcgm",
        "prometheus.selector": 'job="gpu"', "prometheus.node-label": "node",
        "prometheus.refresh-interval": "30s", "prometheus.timeout": "5s",
        "prometheus.max-series": "500", "tls.server-name": "prom.internal"},
        insecure=True)
    assert query == Query(MetricNames.DCGM, "node", 'job="gpu"', 30.0)
    assert (api.timeout, api.max_series, api.prefix) == (5.0, 500, "/prom")
    assert api.config.authorization is not None
    assert api.config.authorization.credentials_file == str(token)
    assert api.config.tls_config.server_name == "prom.internal"
    assert api.config.tls_config.insecure_skip_verify
    config = tmp_path / "http.yml"
    config.write_text("basic_auth: {username: u, password: p}\n")
    api, query = connect("http://p:9090", {"prometheus.http-config": str(config)})
    assert api.config.basic_auth is not None and api.config.basic_auth.username == "u"
    assert query == Query()
    for flags, url, error in (
            ({"prometheus.http-config": str(config),
              "prometheus.bearer-token-file": str(token)}, "http://p", "bearer-token-file"),
            ({"prometheus.http-config": str(tmp_path / "none.yml")}, "http://p",
             "prometheus.http-config"),
            ({"prometheus.refresh-interval": "100ms"}, "http://p", "refresh-interval"),
            ({"prometheus.max-series": "0"}, "http://p", "max-series"),
            ({"metric-names": "otel"}, "http://p", "metric-names"),
            ({"tls.cert-file": str(tmp_path / "nope.pem")}, "https://p", "tls.cert-file"),
            ({}, "http://u:p@p:notaport", "prometheus")):
        with pytest.raises(ConfigError) as e:
            connect(url, flags)
        assert str(e.value).startswith(error) or error in str(e.value), (flags, e.value)


def test_the_defaults_are_the_clients() -> None:
    from exporter.client.fleet.flags import FLEET_DEFAULTS
    from exporter.client.fleet.promapi import DEFAULT_MAX_SERIES, DEFAULT_TIMEOUT

    api, query = connect("http://p:9090", {})
    assert (api.timeout, api.max_series) == (DEFAULT_TIMEOUT, DEFAULT_MAX_SERIES)
    assert query == Query(refresh=10.0)
    assert FLEET_DEFAULTS["prometheus.max-series"] == str(DEFAULT_MAX_SERIES)


@pytest.mark.parametrize("argv, error", [
    (["top", "--prometheus.timeout", "5s"], "--prometheus.timeout: only with top --prometheus"),
    (["top", "--metric-names", "dcgm"], "--metric-names: only with top --prometheus"),
    (["top", "--prometheus", "http://p", "--from", "http://d"], "one daemon or the fleet"),
    (["top", "--prometheus", "ftp://p"], "--prometheus: ftp://p: not an http:// or https://"),
    (["top", "--prometheus", "http://p", "--prometheus.timeout", "1h"],
     "--prometheus.timeout: must be between 1s and 300s"),
    (["top", "--prometheus", "https://p", "--tls.ca-file", "/no/such/ca.pem"],
     "--tls.ca-file: /no/such/ca.pem: No such file or directory"),
    (["top", "--prometheus", "http://p"], "top needs a terminal"),  # all good but the tty
])
def test_top_prometheus_bad_input_is_one_line_and_exit_2(
        argv: list[str], error: str, capsys: pytest.CaptureFixture[str]) -> None:
    from exporter.app.cli import main

    assert main(argv, environ={}) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and error in err and "Traceback" not in err, err


def test_top_help_lists_the_fleet_flags_and_keys(capsys: pytest.CaptureFixture[str]) -> None:
    from exporter.app.cli import main

    with pytest.raises(SystemExit) as done:
        main(["top", "--help"], environ={})
    assert done.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--prometheus URL", "--prometheus.http-config FILE", "--metric-names SCHEME",
                 "--prometheus.max-series N", "--prometheus.timeout DURATION",
                 "--prometheus.refresh-interval DURATION", "--tls.cert-file FILE"):
        assert flag in out
    assert "Enter →" in out and "Esc Backspace" in out
