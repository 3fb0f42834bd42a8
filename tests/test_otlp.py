"""OTLP push end to end: the real daemon on a fixture machine pushes to a real OTLP/HTTP
receiver on 127.0.0.1, started here (http.server, decoding ExportMetricsServiceRequest
with opentelemetry-proto). Needs the ``otlp`` extra (the SDK, for the daemon) and
opentelemetry-proto (for the receiver); .ci/run installs both.
"""

from __future__ import annotations

import gzip
import json
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.daemon import FIXTURES, machine_args, parse_samples, running
from tests.fakes.fake_nvml import FakeGPU
from tests.test_otlp_names import need

pb = need("opentelemetry.proto.collector.metrics.v1.metrics_service_pb2")
need("opentelemetry.exporter.otlp.proto.http")

pytestmark = pytest.mark.slow
MACHINE = "amd-rdna3-rx7800xt"  # a tests/test_golden.py machine: sysfs, hwmon and fdinfo
ONE_CYCLE = ["--collector.interval", "1h", "--collector.slow-interval", "1h",
             "--collector.processes.interval", "1h"]


class Receiver:
    """An OTLP/HTTP metrics receiver. ``replies`` is a list of (status, headers) answered
    in turn (then 200); ``delay`` seconds of sleep before each answer."""

    def __init__(self, tls: tuple[Path, Path] | None = None) -> None:
        self.requests: list[Any] = []  # decoded ExportMetricsServiceRequest, in order
        self.headers: list[dict[str, str]] = []
        self.times: list[float] = []  # when each request arrived (monotonic)
        self.replies: list[tuple[int, dict[str, str]]] = []
        self.delay = 0.0
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                with receiver.lock:
                    receiver.times.append(time.monotonic())
                    receiver.in_flight += 1
                    receiver.max_in_flight = max(receiver.max_in_flight, receiver.in_flight)
                    status, headers = receiver.replies.pop(0) if receiver.replies else (200, {})
                try:
                    body = self.rfile.read(int(self.headers["Content-Length"]))
                    if self.headers.get("Content-Encoding") == "gzip":
                        body = gzip.decompress(body)
                    request = pb.ExportMetricsServiceRequest()
                    request.ParseFromString(body)
                    time.sleep(receiver.delay)
                    with receiver.lock:
                        receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
                        if status == 200:
                            receiver.requests.append(request)
                    reply = pb.ExportMetricsServiceResponse().SerializeToString()
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Type", "application/x-protobuf")
                    self.send_header("Content-Length", str(len(reply)))
                    self.end_headers()
                    self.wfile.write(reply)
                finally:
                    with receiver.lock:
                        receiver.in_flight -= 1

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        scheme = "http"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"

    def wait(self, count: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.requests) >= count:
                return
            time.sleep(0.05)
        raise AssertionError(f"{len(self.requests)} of {count} pushes after {timeout}s")


@contextmanager
def receiving(tls: tuple[Path, Path] | None = None) -> Iterator[Receiver]:
    receiver = Receiver(tls)
    thread = threading.Thread(target=receiver.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()


def _value(v: Any) -> Any:
    return getattr(v, v.WhichOneof("value"))


def points(request: Any) -> dict[str, tuple[Any, list[tuple[dict[str, Any], Any]]]]:
    """OTLP metric name -> (metric, [(attributes, data point)])."""
    out: dict[str, tuple[Any, list[tuple[dict[str, Any], Any]]]] = {}
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                data = getattr(m, m.WhichOneof("data"))
                out[m.name] = (m, [({a.key: _value(a.value) for a in p.attributes}, p)
                                   for p in data.data_points])
    return out


def resource_of(request: Any) -> dict[str, Any]:
    return {a.key: _value(a.value) for a in request.resource_metrics[0].resource.attributes}


def one(found: dict[str, Any], name: str, **attrs: Any) -> Any:
    matches = [p for a, p in found[name][1] if attrs.items() <= a.items()]
    assert len(matches) == 1, (name, attrs, found[name][1])
    return matches[0]


def card() -> Path:
    (dev,) = (FIXTURES / MACHINE / "sys" / "class" / "drm").glob("card?/device")
    return dev


def last_ready(receiver: Receiver) -> Any:
    """The newest push made after the first collection (gpu_exporter.up == 1)."""
    for request in reversed(receiver.requests):
        if one(points(request), "gpu_exporter.up").as_double == 1:
            return request
    raise AssertionError("no push after the first collection")


def push_and_scrape(machine: str, tmp_path: Path, *args: str, env: dict[str, str] | None = None
                    ) -> tuple[Any, dict[Any, float], list[dict[str, str]]]:
    """One fixture machine's push (after its first collection) and its /metrics."""
    nvml = FIXTURES / machine / "nvml.json"
    with receiving() as receiver, running(
            [*machine_args(FIXTURES / machine), *ONE_CYCLE, "--otlp.endpoint", receiver.url,
             "--otlp.interval", "200ms", *args], tmp_path, env=env,
            nvml_json=nvml if nvml.exists() else None) as daemon:
        receiver.wait(2)
        scrape = parse_samples(daemon.get().text)
        receiver.wait(len(receiver.requests) + 1)
        return last_ready(receiver), scrape, receiver.headers


def assert_same_series(found: dict[str, Any], scrape: dict[Any, float]) -> int:
    """Every series of the scrape is one point of the push, with the same value and the
    table's name and attributes (the exporter's own timings and the Python process's
    metrics aside); and the push has no other per-GPU point."""
    from exporter.output.catalogue import FAMILIES, attribute_name

    checked = 0
    for (name, labels), value in scrape.items():
        family = name if name in FAMILIES else name[:-len("_total")] + "_total"
        if family.startswith(("gpu_exporter", "process_", "python_")) or \
                family not in FAMILIES:
            continue
        target = FAMILIES[family]
        route = target.route
        routed = route is not None and dict(labels).get(route.label) in route.values
        attrs = {attribute_name(family, k): (int(v) if k == "pid" else v)
                 for k, v in labels if v != "" and not (routed and k == route.label)}
        attrs.update(target.constant)
        if routed:  # the conventions' metric for this label value (Target.route)
            assert route is not None
            attrs[route.attribute] = dict(labels)[route.label]
        p = one(found, route.name if routed and route else target.name, **attrs)
        assert p.as_double == value, (name, labels)
        checked += 1
    assert checked == sum(len(pts) for n, (_, pts) in found.items()
                          if not n.startswith("gpu_exporter"))
    return checked


def test_nvidia_machine_pushes_a_faithful_copy_of_metrics(tmp_path: Path) -> None:
    machine = "nvidia-h100x2"
    request, scrape, headers = push_and_scrape(
        machine, tmp_path, "--otlp.headers", "x-tenant=gpu,x-team=ml",
        env={"NODE_NAME": "node-7"})
    assert headers[0]["x-tenant"] == "gpu" and headers[0]["x-team"] == "ml"
    assert headers[0]["content-type"] == "application/x-protobuf"
    resource = resource_of(request)
    assert resource["service.name"] == "gpu-exporter" and resource["k8s.node.name"] == "node-7"
    assert resource["service.version"] and resource["host.name"]
    found = points(request)
    assert assert_same_series(found, scrape) > 100

    # Key values against the fake NVML's configuration, read here.
    spec = json.loads((FIXTURES / machine / "nvml.json").read_text())["gpus"][0]
    gpu0 = {"gpu.index": "0", "hw.vendor": "nvidia", "hw.type": "gpu", "gpu.source": "nvml"}
    m, _ = found["hw.gpu.utilization"]
    assert m.unit == "1" and m.WhichOneof("data") == "gauge"
    assert one(found, "hw.gpu.utilization", **gpu0, **{"hw.gpu.task": "general"}).as_double \
        == spec["utilization_gpu"] / 100
    for task in ("encoder", "decoder"):  # NVML's encoder / decoder use, by the conventions' task
        assert one(found, "hw.gpu.utilization", **gpu0, **{"hw.gpu.task": task}).as_double \
            == FakeGPU(0, **{k: v for k, v in spec.items() if k == "engines"}).engines[task] / 100
    assert found["hw.power"][0].unit == "W"
    assert one(found, "hw.power", **gpu0).as_double == spec["power_mw"] / 1000
    m, _ = found["hw.energy"]
    assert m.unit == "J" and m.sum.is_monotonic
    assert m.sum.aggregation_temporality == 2  # AGGREGATION_TEMPORALITY_CUMULATIVE
    assert one(found, "hw.energy", **gpu0).as_double == pytest.approx(spec["energy_mj"] / 1000)
    assert found["hw.temperature"][0].unit == "Cel"
    assert one(found, "hw.temperature", **gpu0, **{"hw.sensor_location": "gpu"}).as_double \
        == spec["temperature_gpu"]
    m, _ = found["hw.gpu.memory.usage"]
    assert m.unit == "By" and not m.sum.is_monotonic and m.sum.aggregation_temporality == 2
    assert found["hw.gpu.memory.limit"][0].unit == "By"
    burn = spec["processes"][0]  # the compute process (gpu_burn)
    assert one(found, "gpu.process.memory.usage", **gpu0, **{
        "process.pid": burn["pid"]}).as_double == burn["used_memory_bytes"]
    assert one(found, "hw.status", **gpu0, **{"hw.state": "ok"}).as_double == 1
    info = {a.key: _value(a.value) for a in one(found, "gpu.info", **gpu0).attributes}
    assert info["hw.model"] == "NVIDIA H100 80GB HBM3" and info["hw.id"].startswith("GPU-")
    histogram = found["gpu_exporter.collection.duration"][0].histogram
    assert histogram.aggregation_temporality == 2 and histogram.data_points[0].count >= 1


def test_amd_machine_values_match_the_sysfs_files(tmp_path: Path) -> None:
    request, scrape, _ = push_and_scrape(MACHINE, tmp_path)
    found = points(request)
    assert assert_same_series(found, scrape) > 30
    dev = card()
    hw = {"hw.id": "pci-0000:03:00.0", "hw.vendor": "amd", "hw.type": "gpu"}
    busy = int((dev / "gpu_busy_percent").read_text())
    assert one(found, "hw.gpu.utilization", **hw, **{"gpu.source": "sysfs"}).as_double \
        == pytest.approx(busy / 100)
    (hwmon,) = (dev / "hwmon").iterdir()
    edge = int((hwmon / "temp1_input").read_text()) / 1000
    assert one(found, "hw.temperature", **hw, **{"hw.sensor_location": "edge"}).as_double \
        == edge
    power = int((hwmon / "power1_average").read_text()) / 1e6
    assert one(found, "hw.power", **hw).as_double == pytest.approx(power)
    m, _ = found["gpu.engine.busy_time"]
    assert m.unit == "s" and m.sum.is_monotonic and m.sum.aggregation_temporality == 2
    blender = one(found, "gpu.process.memory.usage", **{"process.pid": 3310})
    attrs = {a.key: _value(a.value) for a in blender.attributes}
    assert attrs["process.executable.name"] == "blender" and attrs["gpu.source"] == "fdinfo"
    info = {a.key: _value(a.value) for a in one(found, "gpu.info", **hw).attributes}
    assert info["hw.firmware_version"] == "113-EXT90249-100" and "hw.serial_number" not in info


def exports_in(text: str) -> dict[str, float]:
    """gpu_exporter_otlp_exports_total of a /metrics text, by result."""
    return {dict(labels)["result"]: v for (n, labels), v in parse_samples(text).items()
            if n == "gpu_exporter_otlp_exports_total"}


def otlp_exports(daemon: Any) -> dict[str, float]:
    """The daemon's push counts, from a fresh scrape."""
    return exports_in(daemon.get().text)


def wait_for(check: Any, timeout: float = 20.0) -> None:
    """Poll ``check`` until it is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_500_is_counted_and_shown_429_is_retried_after_retry_after(tmp_path: Path) -> None:
    with receiving() as receiver:
        receiver.replies = [(500, {}), (500, {}), (429, {"Retry-After": "1"})]
        with running([*machine_args(FIXTURES / MACHINE), *ONE_CYCLE, "--otlp.endpoint",
                      receiver.url, "--otlp.interval", "300ms", "--otlp.timeout", "5s"],
                     tmp_path) as daemon:
            receiver.wait(1)
            wait_for(lambda: otlp_exports(daemon).get("sent", 0) >= 1)
            exports = otlp_exports(daemon)
            snapshot = json.loads(daemon.get("/snapshot").text)
            landing = daemon.get("/").text
            log = daemon.log()
    # Two 500s: two failed pushes, not retried (the spec retries 429/502/503/504 only).
    # The 429 was retried within the same push, after its Retry-After.
    assert exports["failed"] == 2 and exports["sent"] >= 1
    # Request 3 got the 429; its retry (request 4, the same push) waited the Retry-After
    # second, though the pushes are 300 ms apart.
    assert receiver.times[3] - receiver.times[2] >= 0.95
    assert receiver.times[2] - receiver.times[1] < 0.95
    assert snapshot["otlp"]["exports"]["failed"] == 2
    assert snapshot["otlp"]["endpoint"] == receiver.url + "/v1/metrics"
    assert snapshot["otlp"]["last_success_timestamp"] is not None
    assert "otlp push" in landing
    # One log line when pushes start failing, one when they recover; none per push.
    assert log.count("otlp export failing") == 1 and log.count("otlp export recovered") == 1
    assert "500" in log


def test_a_slow_receiver_delays_neither_metrics_nor_collection(tmp_path: Path) -> None:
    with receiving() as receiver:
        receiver.delay = 2.0
        with running([*machine_args(FIXTURES / MACHINE), "--otlp.endpoint", receiver.url,
                      "--otlp.interval", "100ms", "--otlp.timeout", "10s"],
                     tmp_path) as daemon:
            time.sleep(1.0)  # the first push is in the receiver's sleep now
            latencies = []
            for _ in range(10):
                t0 = time.monotonic()
                assert daemon.get().status_code == 200
                latencies.append(time.monotonic() - t0)
            wait_for(lambda: otlp_exports(daemon).get("dropped", 0) >= 5)
            snapshot = json.loads(daemon.get("/snapshot").text)
    assert max(latencies) < 0.5, latencies
    assert receiver.max_in_flight == 1  # one export at a time: nothing piles up
    assert snapshot["ready"]


def test_a_receiver_that_is_down_costs_only_a_counter(tmp_path: Path) -> None:
    with receiving() as receiver:
        url = receiver.url
    with running([*machine_args(FIXTURES / MACHINE), "--otlp.endpoint", url,
                  "--otlp.interval", "200ms", "--otlp.timeout", "300ms"], tmp_path) as daemon:
        wait_for(lambda: otlp_exports(daemon).get("failed", 0) >= 2)
        snapshot = json.loads(daemon.get("/snapshot").text)
        scrape = daemon.get()
        assert scrape.status_code == 200
        log = daemon.log()
    # The push thread's CPU time is reported beside the collectors' and the renderer's.
    assert any(n == "gpu_exporter_backend_cpu_seconds_total" and ("backend", "otlp") in labels
               for n, labels in parse_samples(scrape.text))
    assert snapshot["otlp"]["last_error"]
    assert log.count("otlp export failing") == 1


def test_tls_with_ca_file_and_the_standard_otel_environment(tmp_path: Path) -> None:
    """--otlp.ca-file verifies a receiver with a self-signed certificate; the SDK's own
    variables still apply: gzip from OTEL_EXPORTER_OTLP_COMPRESSION, resource attributes
    from OTEL_RESOURCE_ATTRIBUTES. REQUESTS_CA_BUNDLE (set in many images) names another
    CA: the flag must win over it (it did not, through requests' session handling)."""
    from tests.test_server import _self_signed

    cert, key = _self_signed(tmp_path)
    (tmp_path / "other").mkdir()
    other_ca, _ = _self_signed(tmp_path / "other")
    env = {"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip", "REQUESTS_CA_BUNDLE": str(other_ca),
           "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=lab"}
    with receiving(tls=(cert, key)) as receiver, running(
            [*machine_args(FIXTURES / MACHINE), *ONE_CYCLE, "--otlp.endpoint", receiver.url,
             "--otlp.interval", "200ms", "--otlp.ca-file", str(cert)], tmp_path, env=env):
        receiver.wait(1)
    assert receiver.url.startswith("https://")
    assert receiver.headers[0]["content-encoding"] == "gzip"
    resource = resource_of(receiver.requests[0])
    assert resource["deployment.environment.name"] == "lab"
    assert resource["service.name"] == "gpu-exporter"
