"""tests/kubelet.py, the model of the kubelet and containerd that the pod journey
(tests/test_deploy_pod_journey.py) runs the shipped DaemonSet with, held to the rules of
the sources it cites: probe results and thresholds (prober/worker.go), the HTTP probe
(probe/http), the environment's order and Service links (kubelet_pods.go, containerd's
buildLinuxSpec), argv, user and capabilities, hostPath type checks and the grace period."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests import kubelet as k

PROBE = {**k.PROBE_DEFAULTS, "periodSeconds": 10, "failureThreshold": 3}


# ---------------------------------------------------------------- probe workers


def test_readiness_starts_failed_and_turns_on_the_first_success() -> None:
    w = k.ProbeWorker("readiness", PROBE)
    assert w.state == "failure"
    w.record(0.0, "failure", "refused", 0.0)
    assert w.changes == []  # one failure below the threshold changes nothing
    w.record(10.0, "success", "Ready", 0.01)
    assert w.state == "success" and w.changes == [(10.0, "success")]
    w.record(20.0, "failure", "503", 0.01)
    w.record(30.0, "failure", "503", 0.01)
    assert w.state == "success"  # two in a row: still below failureThreshold 3
    w.record(40.0, "failure", "503", 0.01)
    assert w.state == "failure" and w.kill_at is None  # readiness never kills


def test_liveness_kills_at_the_threshold_and_a_success_resets_the_run() -> None:
    w = k.ProbeWorker("liveness", PROBE)
    assert w.state == "success"
    for at in (0.0, 10.0):
        w.record(at, "failure", "refused", 0.0)
    w.record(20.0, "success", "OK", 0.0)  # the run of failures starts again
    for at in (30.0, 40.0):
        w.record(at, "failure", "refused", 0.0)
    assert w.kill_at is None
    w.record(50.0, "failure", "refused", 0.0)
    assert w.kill_at == 50.0 and w.state == "failure" and w.run == 0
    assert not w.due(60.0)  # on hold until a new container


def test_success_threshold_and_initial_delay() -> None:
    w = k.ProbeWorker("readiness", {**PROBE, "successThreshold": 2, "initialDelaySeconds": 5})
    assert not w.due(4.9) and w.due(5.0)  # int(seconds since start) < initialDelaySeconds
    w.record(5.0, "success", "", 0.0)
    assert w.state == "failure"
    w.record(15.0, "success", "", 0.0)
    assert w.state == "success"


def test_api_defaults_fill_the_probe_and_the_pod() -> None:
    spec = k.with_api_defaults({"containers": [{"name": "c", "livenessProbe": {
        "httpGet": {"path": "/", "port": 1}, "periodSeconds": 30}}]})
    live = spec["containers"][0]["livenessProbe"]
    assert (live["periodSeconds"], live["timeoutSeconds"], live["failureThreshold"],
            live["successThreshold"], live["initialDelaySeconds"]) == (30, 1, 3, 1, 0)
    assert spec["enableServiceLinks"] is True and spec["terminationGracePeriodSeconds"] == 30
    assert spec["containers"][0]["terminationMessagePath"] == "/dev/termination-log"
    assert k.grace_period({"terminationGracePeriodSeconds": 0}) == 2


class _Handler(BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        _Handler.seen.append(dict(self.headers))
        code = {"/ok": 200, "/moved": 302, "/bad": 503}.get(self.path, 404)
        if self.path == "/slow":
            threading.Event().wait(2.5)
            code = 200
        self.send_response(code)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[int]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield int(httpd.server_address[1])
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.slow
def test_http_probe_counts_2xx_and_3xx_and_times_out(server: int) -> None:
    container = {"ports": [{"name": "metrics", "containerPort": server}]}

    def probe(path: str, timeout: int = 1) -> str:
        spec = {**k.PROBE_DEFAULTS, "timeoutSeconds": timeout,
                "httpGet": {"path": path, "port": "metrics", "scheme": "HTTP"}}
        return k.run_probe(spec, container, "127.0.0.1", kube_version="1.33")[0]

    assert [probe(p) for p in ("/ok", "/moved", "/bad")] == ["success", "success", "failure"]
    assert probe("/slow", timeout=1) == "failure"
    headers = _Handler.seen[0]
    assert headers["User-Agent"] == "kube-probe/1.33" and headers["Accept"] == "*/*"
    tcp = {**k.PROBE_DEFAULTS, "tcpSocket": {"port": "metrics"}}
    assert k.run_probe(tcp, container, "127.0.0.1")[0] == "success"
    with pytest.raises(ValueError, match="no port named web"):
        k.resolve_port("web", container)


# ---------------------------------------------------------------- environment


SERVICES = [k.KUBERNETES_SERVICE,
            k.Service("ns", "gpu-exporter", "10.96.0.20", ((9445, "metrics", "TCP"),)),
            k.Service("other", "db", "10.96.0.30", ((5432, "", "TCP"),)),
            k.Service("ns", "headless", "None", ((80, "", "TCP"),))]
FACTS = k.PodFacts("pod-1", "ns", "uid-1", "node-a", "192.0.2.1", "10.244.0.5", "sa")


def test_service_links_follow_enable_service_links_but_kubernetes_always_comes() -> None:
    off = k.service_links("ns", False, SERVICES)
    assert off == k.service_env("kubernetes", "10.96.0.1", [(443, "https", "TCP")])
    on = k.service_links("ns", True, SERVICES)
    assert on["GPU_EXPORTER_PORT"] == "tcp://10.96.0.20:9445"
    assert not any(n.startswith(("DB_", "HEADLESS_")) for n in on)  # other ns, no cluster IP


def test_container_env_expands_reads_the_downward_api_and_wins_over_links() -> None:
    spec = {"enableServiceLinks": True, "serviceAccountName": "exporter"}
    container = {"env": [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "ADDR", "value": "$(GPU_EXPORTER_SERVICE_HOST):$(NODE_NAME)/$(NOPE)$$"},
        {"name": "GPU_EXPORTER_PORT", "value": "mine"},
        {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}}]}
    env = k.kubelet_env(spec, container, FACTS, SERVICES)
    assert list(env)[:4] == ["NODE_NAME", "ADDR", "GPU_EXPORTER_PORT", "SA"]
    assert env["ADDR"] == "10.96.0.20:node-a/$(NOPE)$"
    assert env["GPU_EXPORTER_PORT"] == "mine" and env["SA"] == "exporter"
    assert env["KUBERNETES_SERVICE_HOST"] == "10.96.0.1"
    with pytest.raises(NotImplementedError):
        k.kubelet_env(spec, {"env": [{"name": "X", "valueFrom": {"secretKeyRef": {}}}]},
                      FACTS, [])


def test_runtime_env_puts_hostname_then_image_then_container_in_place() -> None:
    out = k.runtime_env(["PATH=/image/bin", "LANG=C", "HOSTNAME=image"], "pod-1",
                        {"LANG": "C.UTF-8", "NODE_NAME": "node-a"}, tty=True)
    assert out == ["HOSTNAME=image", "PATH=/image/bin", "LANG=C.UTF-8", "NODE_NAME=node-a",
                   "TERM=xterm"]


def test_argv_takes_command_and_args_over_entrypoint_and_cmd() -> None:
    image = k.ImageConfig((), ("gpu-exporter",), ("--help",), "10001:10001", "", "SIGTERM")
    env = {"PORT": "9445"}
    assert k.argv({}, image, env) == ["gpu-exporter", "--help"]
    assert k.argv({"args": ["--web.listen-address=:$(PORT)"]}, image, env) == [
        "gpu-exporter", "--web.listen-address=:9445"]
    assert k.argv({"command": ["sh"]}, image, env) == ["sh"]
    assert k.argv({"command": ["sh"], "args": ["-c", "x"]}, image, env) == ["sh", "-c", "x"]


# ---------------------------------------------------------------- identity and volumes


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/bash\n"
        "gpu-exporter:x:10001:10001::/nonexistent:/usr/sbin/nologin\n")
    (tmp_path / "etc" / "group").write_text("root:x:0:\nvideo:x:44:gpu-exporter\n"
                                            "gpu-exporter:x:10001:\n")
    return tmp_path


IMAGE = k.ImageConfig((), ("gpu-exporter",), (), "10001:10001", "", "SIGTERM")


def test_identity_follows_the_security_contexts(rootfs: Path) -> None:
    pod = {"securityContext": {"runAsUser": 0, "runAsGroup": 10001, "runAsNonRoot": False}}
    drop_all = {"securityContext": {"capabilities": {"drop": ["ALL"]},
                                    "allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True}}
    ident = k.identity(pod, drop_all, IMAGE, rootfs)
    assert (ident.uid, ident.gid, ident.groups, ident.capabilities) == (0, 10001, (), ())
    assert ident.no_new_privs and ident.read_only_rootfs
    ptrace = {"securityContext": {"capabilities": {"drop": ["ALL"], "add": ["SYS_PTRACE"]}}}
    assert k.identity(pod, ptrace, IMAGE, rootfs).capabilities == ("SYS_PTRACE",)
    default = k.identity({}, {}, IMAGE, rootfs)  # the image's USER and containerd's caps
    assert (default.uid, default.gid, default.groups) == (10001, 10001, (44,))
    assert default.capabilities == k.CONTAINERD_CAPS and not default.no_new_privs
    sup = k.identity({"securityContext": {"runAsUser": 10001, "supplementalGroups": [5],
                                          "fsGroup": 7}}, {}, IMAGE, rootfs)
    assert (sup.gid, sup.groups) == (10001, (44, 5, 7))  # gid from /etc/passwd
    with pytest.raises(PermissionError):
        k.identity({"securityContext": {"runAsUser": 0, "runAsNonRoot": True}}, {}, IMAGE,
                   rootfs)


def test_host_path_types_are_checked_and_created(tmp_path: Path) -> None:
    node = k.Node(tmp_path / "root", {"/sys": tmp_path / "fixture-sys"})
    assert node.host_path("/sys/class/drm") == tmp_path / "fixture-sys" / "class" / "drm"
    made = k.host_path_volume(node, {"path": "/var/run/cdi", "type": "DirectoryOrCreate"})
    assert made.is_dir() and made == tmp_path / "root" / "var" / "run" / "cdi"
    with pytest.raises(FileNotFoundError, match="is not a Directory"):
        k.host_path_volume(node, {"path": "/sys", "type": "Directory"})
    with pytest.raises(FileNotFoundError, match="is not a Socket"):
        k.host_path_volume(node, {"path": "/var/run/cdi", "type": "Socket"})
    spec = {"volumes": [{"name": "state", "emptyDir": {}},
                        {"name": "cdi", "hostPath": {"path": "/var/run/cdi"}}]}
    container = {"volumeMounts": [{"name": "state", "mountPath": "/var/lib/x"},
                                  {"name": "cdi", "mountPath": "/cdi", "readOnly": True}]}
    mounts = k.mounts(spec, container, node, tmp_path / "pod")
    assert [(m["destination"], m["read_only"]) for m in mounts] == [("/var/lib/x", False),
                                                                    ("/cdi", True)]
    assert Path(mounts[0]["source"]).stat().st_mode & 0o777 == 0o777
