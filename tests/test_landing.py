"""The landing page ``/``, its ring buffer (exporter.serve.history) and ``/api/v1/history``:
in-process with a scripted backend, against the fixture daemon, and in headless Chromium."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from html.parser import HTMLParser
from pathlib import Path

import bcrypt
import pytest

from exporter.core.config import Config
from exporter.core.model import ProcessSample
from exporter.pipeline.hub import Hub
from exporter.serve.history import History
from exporter.serve.landing import chart_path
from exporter.serve.view import Processes, State
from exporter.sources.base import Cycle
from tests.cdp import Browser
from tests.daemon import FIXTURES, Daemon, machine_args, running
from tests.fakes.fake_nvml import FakeGPU
from tests.test_collector import Scripted

MIXED = FIXTURES / "mixed"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Charts(HTMLParser):
    """Every ``svg.chart`` of a page: (gpu, series, data-points, path d)."""

    def __init__(self) -> None:
        super().__init__()
        self.charts: list[dict[str, str]] = []
        self.body: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "svg" and a.get("class") == "chart":
            self.charts.append(a)
        elif tag == "path" and self.charts and "d" not in self.charts[-1]:
            self.charts[-1]["d"] = a.get("d", "")
        elif tag == "body":
            self.body = a


class Rows(HTMLParser):
    """The rows of a table body ``tbody#<id>``: per row, {data-label: text}."""

    def __init__(self, tbody: str) -> None:
        super().__init__()
        self.tbody, self.inside, self.cell = tbody, False, ""
        self.rows: list[dict[str, str]] = []
        self.label: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "tbody":
            self.inside = a.get("id") == self.tbody
        elif self.inside and tag == "tr":
            self.rows.append({})
        elif self.inside and tag == "td":
            self.label, self.cell = a["data-label"], ""

    def handle_data(self, data: str) -> None:
        if self.label is not None:
            self.cell += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self.label is not None:
            self.rows[-1][self.label] = self.cell
            self.label = None
        elif tag == "tbody":
            self.inside = False


def table_rows(page: str, tbody: str) -> list[dict[str, str]]:
    parser = Rows(tbody)
    parser.feed(page)
    return parser.rows


def gpu_rows(page: str) -> dict[str, dict[str, str]]:
    return {r["gpu"]: r for r in table_rows(page, "gpu-rows")}


AMD_CARD = "devices/pci0000:00/0000:00:01.1/0000:03:00.0"


def amd_hottest(card: Path) -> str:
    """The GPUs table's "hottest sensor" cell of an amdgpu card, from its hwmon files:
    the highest tempN_input, its label (amdgpu's "mem" is the memory sensor) and its own
    tempN_crit."""
    hwmon = next((card / "hwmon").iterdir())
    temps = [(int((hwmon / f"temp{n}_input").read_text()) / 1000, n)
             for n in range(1, 4) if (hwmon / f"temp{n}_input").exists()]
    celsius, n = max(temps)
    label = (hwmon / f"temp{n}_label").read_text().strip()
    crit = int((hwmon / f"temp{n}_crit").read_text()) / 1000
    return f"{celsius:.0f} °C {'memory' if label == 'mem' else label} (critical {crit:.0f})"


def charts_of(page: str) -> Charts:
    parser = Charts()
    parser.feed(page)
    return parser


def test_history_keeps_one_sample_per_interval_and_at_most_capacity() -> None:
    hub = Hub(Config(), [Scripted("amd", ["0000:03:00.0", "0000:04:00.0"])])
    snapshot = hub.collect_once()
    history = History(window=10.0, interval=1.0)
    assert history.capacity == 10
    for i in range(40):  # four publishes per interval, for 10 intervals past the window
        history.add(snapshot, now=1000.0 + i * 0.25 * 2)
    points = history.points()
    assert set(points) == {"0", "1"}
    assert all(len(p) == 10 for p in points.values())  # bounded
    times = [p[0] for p in points["0"]]
    assert all(b - a >= 0.9 for a, b in zip(times, times[1:], strict=False))  # one per interval
    assert points["0"][-1][3] == 10.0  # power, W, from the scripted backend
    assert points["0"][-1][1] is None  # no utilisation reported: null, never a made-up 0
    body = history.as_json(since=times[-3], now=1030.0)
    assert [g["t"] for g in body["gpus"]][0] == times[-2:]  # only what is newer than since
    assert body["now"] == 1030.0 and json.dumps(body)  # plain JSON


def test_history_forgets_a_gpu_gone_for_a_whole_window() -> None:
    backend = Scripted("amd", ["0000:03:00.0"])
    hub = Hub(Config(), [backend])
    history = History(window=5.0, interval=1.0)
    history.add(hub.collect_once(), now=100.0)
    backend.up = False  # down devices are not sampled
    down = hub.collect_once()
    history.add(down, now=103.0)
    assert list(history.points()) == ["0"]
    history.add(down, now=106.0)
    assert history.points() == {}


def test_chart_path_breaks_at_unknown_values_and_scales_to_the_window() -> None:
    d, points = chart_path([0.0, 50.0, 75.0, 100.0], [0.0, None, 50.0, 100.0], now=100.0,
                           window=100.0, high=100.0)
    assert points == 3
    assert d == "M0,60 M225,30 L300,0"  # a gap where the value is unknown
    # one point per pixel column, the largest value of its samples: 80, not 10 or 20
    assert chart_path([0.0, 0.1, 0.2, 50.0], [10.0, 80.0, 20.0, 30.0], now=100.0,
                      window=100.0, high=100.0) == ("M0,12 L150,42", 2)
    assert chart_path([], [], 1.0, 1.0, None) == ("", 0)


@pytest.mark.slow
def test_landing_page_lists_gpus_values_charts_and_processes(tmp_path: Path) -> None:
    # a 30 s window: 0.1 s a pixel, so that 0.2 s samples are points of their own
    with running([*machine_args(MIXED), "--collector.interval", "0.2s",
                  "--web.history", "30s"], tmp_path,
                 nvml_json=MIXED / "nvml.json") as d:
        time.sleep(1.0)
        r = d.get("/")
        history = d.get("/api/v1/history").json()
        newest = max(history["gpus"][0]["t"])
        later = d.get(f"/api/v1/history?since={newest}").json()
        bad_since = [d.get(f"/api/v1/history?since={v}") for v in ("nan", "abc", "inf", "")]
        one_row = d.get("/api/v1/history?processes=1").json()["processes"]["0"]
        bad_rows = [d.get(f"/api/v1/history?processes={v}") for v in ("-1", "x", "257", "")]
        static = d.get("/static/app.js")
        missing = d.get("/static/other.js")
    assert r.status_code == 200
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp
    assert "unsafe-inline" not in csp and "<script>" not in r.text  # no inline script
    page = r.text
    # The fixture's NVIDIA card (nvml.json): its name, 16 GiB of which its one process
    # uses 2 GiB; 69.85 W and 41 °C are the fake NVML's defaults (tests/fakes/fake_nvml.py).
    card = json.loads((MIXED / "nvml.json").read_text())["gpus"][0]
    assert card["name"] == "NVIDIA GeForce RTX 4080"
    assert card["memory_total_bytes"] / 2**30 == pytest.approx(16.0, abs=0.05)
    assert [p["used_memory_bytes"] for p in card["processes"]] == [2 << 30]
    assert (FakeGPU.power_mw, FakeGPU.temperature_gpu) == (69850, 41)
    rows = gpu_rows(page)
    # the hottest sensor, named: the fake's memory sensor (48 °C) over its die (41 °C),
    # and that sensor's own limit, NVML's memory max operating threshold
    assert FakeGPU.temperature_memory == 48 and FakeGPU().thresholds["mem_max"] == 95
    assert rows["1"] == {
        "gpu": "1", "name": "NVIDIA GeForce RTX 4080", "vendor": "nvidia", "state": "● up",
        "utilisation": "0 %", "memory": "2.0 / 16.0 GiB (13 %)",
        "power / limit": f"70 W / {card['power_limit_mw'] // 1000} W",
        "hottest sensor": "48 °C memory (critical 95)", "health": "✔ healthy"}
    # The AMD card: its hottest hwmon sensor and that sensor's own critical limit, read
    # from the fixture's files here; no VRAM size in this fixture: "no data", never 0.
    assert rows["0"]["hottest sensor"] == amd_hottest(MIXED / "sys" / AMD_CARD)
    assert rows["0"]["memory"] == "no data"
    # the AMD card's memory chart: no value ever, "no data" over the empty chart
    assert '<span data-gpu="0" data-last="memory">no data</span>' in page
    assert '<span class="nodata" data-gpu="0" data-nodata="memory">no data</span>' in page
    assert '<span class="nodata" data-gpu="0" data-nodata="power" hidden>' in page
    assert "Intel Arc B580" in rows["2"]["name"]
    charts = charts_of(page).charts
    assert {c["data-gpu"] for c in charts} == {"0", "1", "2"}
    assert len(charts) == 3 * len(history["series"])
    assert all(int(c["data-points"]) >= 2 for c in charts if c["data-key"] == "power")
    assert "<h4>Top processes</h4>" in page
    assert [g["gpu"] for g in history["gpus"]] == ["0", "1", "2"]
    assert len(history["gpus"][1]["t"]) >= 3
    assert history["gpus"][1]["power"][-1] == 69.85
    memory = round(100 * (2 << 30) / card["memory_total_bytes"], 3)
    assert history["gpus"][1]["memory"][-1] == memory
    assert all(t > newest for g in later["gpus"] for t in g["t"])
    # Top processes of the latest recorded snapshot, whatever ``since``: the NVIDIA card's
    # one process (nvml.json: pid 3310, 2 GiB; its comm in the fixture's procfs) ...
    comm = (MIXED / "proc" / "3310" / "comm").read_text().strip()
    sm = card["processes"][0]["sm_util"] / 100
    assert history["processes"]["1"] == later["processes"]["1"] == {"rows": [
        {"pid": 3310, "process": comm, "memory_bytes": float(2 << 30), "pod": "",
         "container": "", "utilization": sm, "user": "", "command": "",
         "shared_memory_bytes": None, "engines": {"sm": sm}}], "more": 0}
    # ... and the AMD card's from fdinfo: gnome-shell's two clients, 16384 + 412672 KiB of
    # VRAM (proc/1874/fdinfo/14 and 15), vkcube's 98304 KiB (proc/5120/fdinfo/5).
    amd = {r["pid"]: r for r in history["processes"]["0"]["rows"]}
    assert amd[1874]["memory_bytes"] == (16384 + 412672) * 1024.0
    assert amd[1874]["process"] == "gnome-shell"
    assert amd[5120]["memory_bytes"] == 98304 * 1024.0
    sizes = [r["memory_bytes"] or 0 for r in history["processes"]["0"]["rows"]]
    assert sizes == sorted(sizes, reverse=True)  # largest first, as the page's table
    assert [r.status_code for r in bad_since] == [400, 400, 400, 400]
    # ?processes=N: the page asks for the rows it shows; the others are counted in "more"
    assert [r["pid"] for r in one_row["rows"]] == [history["processes"]["0"]["rows"][0]["pid"]]
    assert one_row["more"] == len(history["processes"]["0"]["rows"]) - 1
    assert [r.status_code for r in bad_rows] == [400, 400, 400, 400]
    assert "since" in bad_since[1].text
    assert static.status_code == 200 and static.headers["content-type"].startswith(
        "text/javascript")
    assert missing.status_code == 404


def test_landing_page_shows_top_processes_with_pods() -> None:
    from exporter.serve import landing

    backend = Scripted("amd", ["0000:03:00.0"])
    backend.processes = tuple(
        ProcessSample(pid=100 + i, process=f"train{i}", memory_used_bytes=float(i << 30),
                      pod="trainer-0" if i == 6 else None, namespace="ml", container="main")
        for i in range(7))
    snapshot = Hub(Config(), [backend]).collect_once()
    history = History(900.0, 1.0)
    history.add(snapshot)
    page = landing.page(snapshot, history, "/metrics")
    # the five largest by memory, largest first, with the pod of the one that has one
    procs = re.search(r'<div class="processes" data-gpu="0">(.*?)</div>', page)
    assert procs is not None
    assert "<th>pod</th><th>container</th>" in procs.group(1)
    assert re.search(r'<td data-label="pid">106</td><td data-label="process">train6</td>'
                     r'<td data-label="memory">6\.00 GiB</td><td data-label="pod">'
                     r'ml/trainer-0</td><td data-label="container">main</td>', page)
    assert '">101</td>' not in page and "and 2 more" in page


def test_pod_columns_only_when_a_process_has_a_pod() -> None:
    from exporter.serve import landing

    backend = Scripted("amd", ["0000:03:00.0"])
    backend.processes = (ProcessSample(pid=7, process="train", memory_used_bytes=1e9),)
    snapshot = Hub(Config(), [backend]).collect_once()
    page = landing.page(snapshot, History(900.0, 1.0), "/metrics")
    assert "<th>pid</th><th>process</th><th>memory</th></tr>" in page
    assert "<th>pod</th>" not in page and 'data-label="pod"' not in page


def test_page_says_no_gpu_found_and_names_its_links() -> None:
    """No GPU: an explicit empty state pointing at the backends (down, with the reason),
    and the GPUs table hidden; the liveness link cannot be taken for GPU health."""
    from exporter.serve import landing

    backend = Scripted("amd", [])
    backend.unavailable = "no amdgpu device"
    snapshot = Hub(Config(), [backend]).collect_once()
    page = landing.page(snapshot, History(900.0, 1.0), "/metrics")
    assert '<p id="no-gpu" class="empty">No GPU found: see the backends below.</p>' in page
    assert '<table class="gpus cards" hidden>' in page
    assert table_rows(page, "backend-rows") == [
        {"backend": "amd", "state": "✖ down", "reason": "no amdgpu device", "devices": "0"}]
    assert '<a href="/-/healthy">Exporter liveness (not GPU health)</a>' in page
    assert ">Health<" not in page


def test_a_down_gpu_reads_down_as_a_word_and_a_class() -> None:
    """State and verdict as words with a symbol (readable without colour) and a class
    (the colour); the reasons listed once, under "Health problems"."""
    from exporter.serve import landing
    from exporter.serve.tables import current

    backend = Scripted("amd", ["0000:03:00.0"])
    hub = Hub(Config(), [backend])
    hub.collect_once()
    backend.up = False
    snapshot = hub.collect_once()
    devices, backends = current(snapshot)
    assert devices[0].state is State.DOWN and backends[0].state is State.UP
    page = landing.page(snapshot, History(900.0, 1.0), "/metrics")
    row = gpu_rows(page)["0"]
    assert row["state"] == "✖ down"
    assert '<tr data-gpu="0" class="state-down">' in page
    assert '<td data-label="state" class="state-down">✖ down</td>' in page


def test_history_devices_have_every_value_top_shows_and_null_where_absent() -> None:
    """``devices`` of /api/v1/history: the Scripted backend reports power only (10 W),
    so everything else is null, never 0; the health verdict and its checks come along."""
    backend = Scripted("amd", ["0000:03:00.0"])
    history = History(60.0, 1.0)
    # nothing recorded yet: null (not known), which the page and top leave alone
    assert (history.as_json()["devices"], history.as_json()["backends"]) == (None, None)
    history.add(Hub(Config(), [backend]).collect_once(), now=100.0)
    dev = history.as_json(now=100.0)["devices"][0]
    assert dev["power_watts"] == 10.0 and dev["state"] == "up"
    for key in ("utilization", "memory_utilization", "encoder", "decoder", "fan",
                "memory_used_bytes", "power_limit_watts", "temperature"):
        assert dev[key] is None, key
    assert set(dev["clocks"]) == {"graphics", "memory", "sm"}
    assert all(v is None for v in dev["clocks"].values())
    assert dev["cells"]["utilization"] == "no data" and dev["cells"]["power"] == "10 W"


def test_history_processes_follow_the_latest_recorded_snapshot() -> None:
    """Computed once per recorded snapshot: a publish within the interval changes nothing,
    the next recorded one drops a process that exited."""
    backend = Scripted("amd", ["0000:03:00.0"])
    hub = Hub(Config(), [backend])
    backend.processes = (ProcessSample(pid=10, process="trainer", memory_used_bytes=3e9),
                         ProcessSample(pid=11, process="eval", memory_used_bytes=None))
    history = History(window=60.0, interval=1.0)
    history.add(hub.collect_once(), now=100.0)
    none = {"pod": "", "container": "", "utilization": None, "user": "", "command": "",
            "shared_memory_bytes": None, "engines": {}}
    assert history.as_json(since=1e12)["processes"] == {"0": {"more": 0, "rows": [
        {"pid": 10, "process": "trainer", "memory_bytes": 3e9, **none},
        {"pid": 11, "process": "eval", "memory_bytes": None, **none}]}}
    backend.processes = backend.processes[:1]  # pid 11 exits
    history.add(hub.collect_once(), now=100.5)  # same interval: not recorded
    assert [r.pid for r in history.processes()["0"].rows] == [10, 11]
    history.add(hub.collect_once(), now=101.0)
    assert [r["pid"] for r in history.as_json()["processes"]["0"]["rows"]] == [10]
    backend.processes = ()
    history.add(hub.collect_once(), now=102.0)
    assert history.processes() == {"0": Processes((), 0)}


def test_app_js_puts_process_names_in_as_text() -> None:
    """Process names are user-controlled: app.js builds the tables with DOM methods and
    textContent, never by parsing markup (the browser test shows the result)."""
    from exporter.serve.landing_static import APP_JS

    assert "textContent" in APP_JS and "replaceChildren" in APP_JS
    for parser in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write",
                   "DOMParser", "createContextualFragment"):
        assert parser not in APP_JS, parser


@pytest.mark.slow
def test_landing_and_history_need_the_same_auth_as_metrics(tmp_path: Path) -> None:
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")
    with running([*machine_args(MIXED), "--web.config.file", str(web)], tmp_path,
                 nvml_json=MIXED / "nvml.json") as d:
        for path in ("/", "/api/v1/history", "/static/app.js", "/metrics"):
            assert d.get(path).status_code == 401, path
            assert d.get(path, auth=("prom", "pw")).status_code == 200, path


@pytest.mark.slow
def test_history_window_flag_sets_the_capacity(tmp_path: Path) -> None:
    with running([*machine_args(MIXED), "--web.history", "30s", "--collector.interval",
                  "0.5s"], tmp_path, nvml_json=MIXED / "nvml.json") as d:
        body = d.get("/api/v1/history").json()
    assert (body["window"], body["interval"], body["capacity"]) == (30.0, 0.5, 60)


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install "
                    "chromium): the page is not tried in a real browser")
def test_landing_page_in_headless_chromium(tmp_path: Path) -> None:
    """A real browser under the page's CSP: app.js loads, polls /api/v1/history, redraws
    every chart and refills every table. The fixture changes while the page is open (the
    AMD card's junction to 112 °C over its 110 °C critical, 226 W, 93 % busy, as hwmon
    and sysfs files): the GPUs table, the GPU health list and the chart captions follow
    without a reload. The copied procfs names pid 3310 ``<b>x</b>``: shown as text, not
    markup. Screenshots at 1400 and 420 px are kept (paths printed); at 420 px nothing
    is wider than the screen."""
    assert CHROMIUM is not None
    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    shutil.copytree(MIXED / "proc", proc, symlinks=True)
    shutil.copytree(MIXED / "sys", sysfs, symlinks=True)
    (proc / "3310" / "comm").write_text("<b>x</b>\n")
    card = sysfs / AMD_CARD
    hwmon = next((card / "hwmon").iterdir())
    args = machine_args(MIXED)
    args[args.index("--path.procfs") + 1] = str(proc)
    args[args.index("--path.sysfs") + 1] = str(sysfs)
    with running([*args, "--collector.interval", "0.2s", "--web.history", "30s"], tmp_path,
                 nvml_json=MIXED / "nvml.json") as d:
        time.sleep(0.6)
        raw = d.get("/").text  # what a browser without JavaScript shows
        browser = Browser(CHROMIUM, tmp_path / "profile")
        try:
            browser.size(1400, 900)
            browser.go(d.base_url + "/")
            assert browser.wait("document.body.dataset.live") == "1", "app.js did not run"
            before = browser.js("document.documentElement.outerHTML")
            rendered = float(browser.js("document.body.dataset.rendered"))
            changed = time.time()
            (hwmon / "temp2_input").write_text("112000\n")  # junction, critical 110 °C
            (hwmon / "power1_average").write_text("226000000\n")
            (card / "gpu_busy_percent").write_text("93\n")
            row = "document.querySelector('#gpu-rows tr[data-gpu=\"0\"]')"
            browser.wait(f"{row}.innerText.includes('112 °C junction')")
            browser.wait("document.querySelector('[data-gpu=\"0\"][data-last=\"power\"]')"
                         ".textContent === '226 W'")
            dom = browser.js("document.documentElement.outerHTML")
            wide, narrow = tmp_path / "landing-1400.png", tmp_path / "landing-420.png"
            wide_size = browser.screenshot(wide, 1400)
            narrow_size = browser.screenshot(narrow, 420)
            d.proc.terminate()  # the daemon gone: the page says its values are stale
            browser.wait("document.body.dataset.live === '0'")
            offline = browser.js("[document.getElementById('live').textContent, "
                                 "document.body.className]")
        finally:
            browser.close()
    print(f"landing page screenshots: {wide} {narrow}")
    assert rendered < changed  # the page was loaded before the change
    # The table as refilled by app.js, checked against the fixture's files
    rows = gpu_rows(dom)
    assert rows["0"]["hottest sensor"] == amd_hottest(card) == "112 °C junction (critical 110)"
    assert rows["0"]["power / limit"] == "226 W / {:.0f} W".format(
        int((hwmon / "power1_cap").read_text()) / 1e6)
    assert rows["0"]["utilisation"] == "93 %" and rows["0"]["health"] == "▲ degraded"
    assert re.search(r'<tbody id="gpu-rows" data-updated="([\d.]+)"', dom)
    assert '<td data-label="hottest sensor" class="heat-critical">' in dom
    assert "junction 112 °C at or above its critical 110 °C" in dom
    assert gpu_rows(raw)["0"]["health"] == "✔ healthy" == gpu_rows(before)["0"]["health"]
    assert [r["state"] for r in table_rows(dom, "backend-rows")] == ["● up"] * 5
    parsed = charts_of(dom)
    assert re.search(r'<span id="live">Live: refreshed every [^<]+</span>', dom)
    by_gpu: dict[str, list[int]] = {}
    for c in parsed.charts:
        by_gpu.setdefault(c["data-gpu"], []).append(int(c["data-points"]))
        assert c["d"].count("L") + c["d"].count("M") == int(c["data-points"])
    assert set(by_gpu) == {"0", "1", "2"}
    assert all(max(points) >= 3 for points in by_gpu.values())  # a chart per GPU with data
    power = next(c for c in parsed.charts if c["data-gpu"] == "0" and c["data-key"] == "power")
    assert power["data-max"] == "236"  # 0 to the power limit (power1_cap: 236 W)
    assert 'data-top="power">236 W</span>' in dom and 'data-top="temperature">110 °C' in dom
    assert '<span class="sensor" data-gpu="0" data-sensor="">junction</span>' in dom
    assert '<span class="sensor" data-gpu="0" data-sensor="">memory</span>' in raw
    # Each GPU's process table refilled by app.js (data-updated), the NVIDIA card's one
    # process (nvml.json: pid 3310, 2 GiB) with its name as text: no <b> element.
    boxes = re.findall(r'<div class="processes" data-gpu="(\d+)" data-updated="[\d.]+">'
                       r"(.*?)</div>", dom)
    assert {gpu for gpu, _ in boxes} == {"0", "1", "2"}
    nvidia = dict(boxes)["1"]
    assert ('<td data-label="pid">3310</td><td data-label="process">&lt;b&gt;x&lt;/b&gt;'
            '</td><td data-label="memory">2.00 GiB</td></tr>') in nvidia
    assert "<b>" not in dom and "data-updated" not in raw
    for shot in (wide, narrow):
        assert shot.stat().st_size > 10_000 and shot.read_bytes()[:4] == b"\x89PNG"
    assert wide_size[0] == 1400 and narrow_size[0] == 420  # nothing runs off the screen
    assert offline[0].startswith("Not updating (") and "stale" in offline[0]
    assert offline[1] == "offline"


@contextmanager
def hanging_nvidia(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon on the RX 7800 XT machine beside a fake NVIDIA GPU whose NVML hangs after
    1.5 s: past --stale-after (800 ms) the nvidia backend and its GPU are stale."""
    nvml = tmp_path / "nvml.json"
    nvml.write_text(json.dumps({"gpus": [{"pci_bus_id": "00000000:41:00.0"}], "faults": {
        "hang": {"function": "nvmlDeviceGetPowerUsage", "after_seconds": 1.5}}}))
    machine = FIXTURES / "amd-rdna3-rx7800xt"
    args = [*machine_args(machine), "--collector.interval", "200ms", "--stale-after", "800ms"]
    with running(args, tmp_path, nvml_json=nvml) as d:
        yield d


@pytest.mark.slow
def test_a_stale_backend_and_its_gpu_read_stale(tmp_path: Path) -> None:
    """NVML hangs after 1.5 s (the fake's fault): past --stale-after the backend reads
    stale with its reason in /api/v1/history, and so does its GPU (withdrawn from
    /metrics, but not known to be down)."""
    with hanging_nvidia(tmp_path) as d:
        first = d.get("/api/v1/history").json()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            body = d.get("/api/v1/history").json()
            if {b["backend"]: b["state"] for b in body["backends"]}["nvidia"] == "stale":
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"nvidia never stale: {body['backends']}")
        page = d.get("/").text
    states = {dev["vendor"]: dev["state"] for dev in first["devices"]}
    assert states == {"amd": "up", "nvidia": "up"}
    nvidia = next(b for b in body["backends"] if b["backend"] == "nvidia")
    assert nvidia["reason"] == "no completed collection within --stale-after"
    states = {dev["vendor"]: dev["state"] for dev in body["devices"]}
    assert states == {"amd": "up", "nvidia": "stale"}  # not known to be down: stale
    assert {r["backend"]: r["state"] for r in table_rows(page, "backend-rows")}["nvidia"] \
        == "◌ stale"
    assert {r["vendor"]: r["state"] for r in gpu_rows(page).values()}["nvidia"] == "◌ stale"


@pytest.mark.slow
def test_history_is_fed_by_collection_not_by_requests(tmp_path: Path) -> None:
    """With one collection an hour, any number of page views and scrapes add nothing:
    the buffer holds the one sample per GPU the first complete snapshot gave."""
    with running([*machine_args(MIXED), "--collector.interval", "1h",
                  "--collector.slow-interval", "1h"], tmp_path,
                 nvml_json=MIXED / "nvml.json") as d:
        time.sleep(0.3)
        for path in ("/", "/metrics", "/api/v1/history", "/snapshot") * 3:
            assert d.get(path).status_code == 200
        body = d.get("/api/v1/history").json()
    assert [(g["gpu"], len(g["t"])) for g in body["gpus"]] == [("0", 1), ("1", 1), ("2", 1)]


class Limited(Scripted):
    """The Scripted backend with a power limit and a hottest sensor with its limit."""

    def sample(self, slow: bool) -> Cycle:
        cycle = super().sample(slow)
        return Cycle([dataclasses.replace(d, power_limit_watts=300.0,
                                          temperatures_celsius={"edge": 50.0},
                                          temperature_limits_celsius={("edge", "slowdown"): 90.0})
                      for d in cycle.devices], cycle.errors)


def test_a_lost_gpus_charts_keep_their_scale_and_say_no_data() -> None:
    """A GPU that goes down keeps its recorded samples, but its captions no longer give
    its last reading as a current one ("no data"), and its charts keep the scale it had
    (0 to its power limit, to its sensor's limit) instead of jumping to autoscale: in
    the server's render and in the JSON the page's script draws from."""
    from exporter.serve import landing

    backend = Limited("amd", ["0000:03:00.0"])
    hub = Hub(Config(), [backend])
    history = History(60.0, 1.0)
    for i in range(3):
        history.add(hub.collect_once(), now=100.0 + i)
    page = landing.page(hub.snapshot, history, "/metrics", now=102.5)
    assert '<span data-gpu="0" data-last="power">10 W</span>' in page
    assert 'data-key="power" data-max="300"' in page
    backend.up = False  # lost: gpu_up 0, no value
    for i in range(3, 5):
        history.add(hub.collect_once(), now=100.0 + i)
    page = landing.page(hub.snapshot, history, "/metrics", now=104.5)
    assert gpu_rows(page)["0"]["state"] == "✖ down"
    for key in ("power", "temperature", "utilization", "memory"):
        assert f'<span data-gpu="0" data-last="{key}">no data</span>' in page, key
    assert 'data-key="power" data-max="300"' in page
    assert 'data-key="temperature" data-max="90"' in page
    assert 'data-top="power">300 W</span>' in page
    body = history.as_json(now=104.5)
    assert body["gpus"][0]["max"] == {"power": 300.0, "temperature": 90.0}
    assert body["gpus"][0]["power"] == [10.0, 10.0, 10.0]  # what was recorded stays
    assert body["devices"][0]["state"] == "down"


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install "
                    "chromium): the page is not tried in a real browser")
def test_a_long_reason_or_name_never_widens_the_page_at_420px(tmp_path: Path) -> None:
    """A backend's reason (a library path), a process, pod and container name without a
    break: at 420 px the page, with its own style sheet, is no wider than the screen."""
    from exporter.serve import landing
    from exporter.serve.landing_static import APP_CSS

    assert CHROMIUM is not None
    gpu = Scripted("amd", ["0000:03:00.0"])
    gpu.processes = (ProcessSample(pid=7, process="p" * 60, memory_used_bytes=1e9,
                                   pod="pod-" + "y" * 120, namespace="ns", container="c" * 60),)
    down = Scripted("nvidia", [])
    down.unavailable = ("NVML: libnvidia-ml.so.1: cannot open shared object file: "
                        "/usr/lib/x86_64-linux-gnu/" + "z" * 120)
    hub = Hub(Config(), [gpu, down])
    snapshot = hub.collect_once()
    history = History(900.0, 1.0)
    history.add(snapshot)
    page = landing.page(snapshot, history, "/metrics")
    assert down.unavailable in page
    (tmp_path / "index.html").write_text(page.replace(
        '<script src="/static/app.js" defer></script>', "").replace("/static/app.css",
                                                                     "app.css"))
    (tmp_path / "app.css").write_text(APP_CSS)
    browser = Browser(CHROMIUM, tmp_path / "profile")
    try:
        browser.size(420, 900)
        browser.go(f"file://{tmp_path}/index.html")
        browser.wait("document.readyState === 'complete' && document.styleSheets.length === 1")
        width = browser.js("document.documentElement.scrollWidth")
    finally:
        browser.close()
    assert width <= 420


# The widths a phone, a small tablet and a desktop window show the page at: the narrow
# layout (cards) up to its breakpoint, the tables above it.
WIDTHS = (360, 420, 640, 700, 800, 801, 900, 1024, 1400)


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install "
                    "chromium): the page is not tried in a real browser")
def test_the_page_with_its_script_never_scrolls_sideways(tmp_path: Path) -> None:
    """At 420 px the page scrolled sideways once its script had drawn (the test above loads
    it without its script). Here the real page of a daemon over three GPUs, with a GPU
    name, a process name and a command line without a break, is loaded at 420 px in a
    real browser; once app.js has refilled every table and chart, and after more
    refreshes, nothing is wider than the screen, at 420 px and at each of WIDTHS."""
    assert CHROMIUM is not None
    proc = tmp_path / "proc"
    shutil.copytree(MIXED / "proc", proc, symlinks=True)
    (proc / "3310" / "comm").write_text("render-" + "p" * 60 + "\n")
    (proc / "3310" / "cmdline").write_bytes(b"/opt/" + b"x" * 150 + b"\0--scene\0")
    nvml = json.loads((MIXED / "nvml.json").read_text())
    nvml["gpus"][0]["name"] = "NVIDIA GeForce RTX 4080 " + "Q" * 80
    (tmp_path / "nvml.json").write_text(json.dumps(nvml))
    args = machine_args(MIXED)
    args[args.index("--path.procfs") + 1] = str(proc)
    overflowing = ("(() => { const out = []; for (const e of document.querySelectorAll("
                   "'body *')) { const r = e.getBoundingClientRect(); if (r.right > "
                   "window.innerWidth + 0.5 && !e.closest('table.procs')) out.push("
                   "e.tagName + '.' + e.className + ' ' + Math.round(r.right)); } "
                   "return out.slice(0, 5); })()")
    drawn = ("document.body.dataset.live === '1' && document.getElementById('gpu-rows')"
             ".dataset.updated && [...document.querySelectorAll('div.processes')].every("
             "b => b.dataset.updated)")
    with running([*args, "--collector.interval", "0.3s"], tmp_path,
                 nvml_json=tmp_path / "nvml.json") as d:
        browser = Browser(CHROMIUM, tmp_path / "profile")
        try:
            browser.size(420, 900)
            browser.go(d.base_url + "/")
            browser.wait(drawn)
            assert "Q" * 80 in browser.js("document.getElementById('gpu-rows').innerText")
            assert "render-" + "p" * 50 in browser.js(
                "document.querySelector('div.processes[data-gpu=\"1\"]').innerText")
            widths = {}
            for width in (420, *WIDTHS):
                browser.size(width, 900)
                updated = browser.js("document.getElementById('gpu-rows').dataset.updated")
                browser.wait("document.getElementById('gpu-rows').dataset.updated !== "
                             f"'{updated}'")  # a refresh drawn at this width
                widths[width] = (browser.js("document.documentElement.scrollWidth"),
                                 browser.js(overflowing))
        finally:
            browser.close()
    print("scroll width by screen width:", {w: s for w, (s, _) in widths.items()})
    for width, (scroll, wider) in widths.items():
        assert scroll <= width and wider == [], (width, scroll, wider)
