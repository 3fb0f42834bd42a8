"""The landing page ``/``, its ring buffer (exporter.history) and ``/api/v1/history``:
in-process with a scripted backend, against the fixture daemon, and in headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path

import bcrypt
import pytest

from exporter.collector import Hub
from exporter.config import Config
from exporter.history import History
from exporter.landing import chart_path
from exporter.model import ProcessSample
from tests.daemon import FIXTURES, machine_args, running
from tests.fakes.fake_nvml import FakeGPU
from tests.test_collector import Scripted

MIXED = FIXTURES / "mixed"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu",
                  "--disable-background-networking", "--no-first-run",
                  "--disable-component-update", "--disable-sync")


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
    assert d == "M0.0,60.0 M225.0,30.0 L300.0,0.0"  # a gap where the value is unknown
    assert chart_path([], [], 1.0, 1.0, None) == ("", 0)


def test_landing_page_lists_gpus_values_charts_and_processes(tmp_path: Path) -> None:
    with running([*machine_args(MIXED), "--collector.interval", "0.2s"], tmp_path,
                 nvml_json=MIXED / "nvml.json") as d:
        time.sleep(1.0)
        r = d.get("/")
        history = d.get("/api/v1/history").json()
        newest = max(history["gpus"][0]["t"])
        later = d.get(f"/api/v1/history?since={newest}").json()
        bad_since = d.get("/api/v1/history?since=nan")
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
    assert re.search(r"<td>1</td><td>NVIDIA GeForce RTX 4080</td><td>nvidia</td><td>up</td>"
                     r"<td>0 %</td><td>2\.0 / 16\.0 GiB \(13 %\)</td><td>70 W</td>"
                     r"<td>41 °C</td><td>healthy</td>", page)
    assert "<td>Intel Arc B580</td>" in page
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
    assert bad_since.status_code == 200 and bad_since.json()["gpus"]
    assert static.status_code == 200 and static.headers["content-type"].startswith(
        "text/javascript")
    assert missing.status_code == 404


def test_landing_page_shows_top_processes_with_pods() -> None:
    from exporter import landing

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
    assert re.search(r"<td>106</td><td>train6</td><td>6\.00 GiB</td><td>ml/trainer-0</td>"
                     r"<td>main</td>", page)
    assert "<td>101</td>" not in page and "and 2 more" in page


def test_landing_and_history_need_the_same_auth_as_metrics(tmp_path: Path) -> None:
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")
    with running([*machine_args(MIXED), "--web.config.file", str(web)], tmp_path,
                 nvml_json=MIXED / "nvml.json") as d:
        for path in ("/", "/api/v1/history", "/static/app.js", "/metrics"):
            assert d.get(path).status_code == 401, path
            assert d.get(path, auth=("prom", "pw")).status_code == 200, path


def test_history_window_flag_sets_the_capacity(tmp_path: Path) -> None:
    with running([*machine_args(MIXED), "--web.history", "30s", "--collector.interval",
                  "0.5s"], tmp_path, nvml_json=MIXED / "nvml.json") as d:
        body = d.get("/api/v1/history").json()
    assert (body["window"], body["interval"], body["capacity"]) == (30.0, 0.5, 60)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install "
                    "chromium): the page is not tried in a real browser")
def test_landing_page_in_headless_chromium(tmp_path: Path) -> None:
    """A real browser under the page's CSP: app.js loads, polls /api/v1/history and
    redraws every chart; the table is there without JavaScript too."""
    assert CHROMIUM is not None
    with running([*machine_args(MIXED), "--collector.interval", "0.2s"], tmp_path,
                 nvml_json=MIXED / "nvml.json") as d:
        time.sleep(0.6)

        def chromium(*args: str) -> subprocess.CompletedProcess[str]:
            profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
            return subprocess.run(
                [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args,
                 d.base_url + "/"], capture_output=True, text=True, timeout=120, check=True)

        dom = chromium("--virtual-time-budget=4000", "--dump-dom").stdout
        screenshot = tmp_path / "landing.png"
        chromium("--virtual-time-budget=4000", "--window-size=1280,1800",
                 f"--screenshot={screenshot}")
        raw = d.get("/").text  # what a browser without JavaScript shows
    print(f"landing page screenshot: {screenshot}")
    parsed = charts_of(dom)
    assert parsed.body.get("data-live") == "1", "app.js did not run or its fetch failed"
    assert re.search(r'<span id="live">Live, updated [^<]+</span>', dom)
    by_gpu: dict[str, list[int]] = {}
    for c in parsed.charts:
        by_gpu.setdefault(c["data-gpu"], []).append(int(c["data-points"]))
        assert c["d"].count("L") + c["d"].count("M") == int(c["data-points"])
    assert set(by_gpu) == {"0", "1", "2"}
    assert all(max(points) >= 3 for points in by_gpu.values())  # a chart per GPU with data
    assert screenshot.stat().st_size > 10_000 and screenshot.read_bytes()[:4] == b"\x89PNG"
    assert "data-live" not in raw and "<td>NVIDIA GeForce RTX 4080</td>" in raw
    assert "<td>NVIDIA GeForce RTX 4080</td>" in dom


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
