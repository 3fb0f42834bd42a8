"""The shipped DaemonSet's pod, started, probed, scraped, exec'd into and stopped the way
a kubelet does it, from the built image (tests/image_build.py, one build per run).

Each scenario takes the DaemonSet of a render (the Helm chart by Helm's engine, the
kustomize manifests by kubectl) and, on a node whose /sys is a fixture (an AMD RX 7800 XT)
and whose kubelet is a fake pod-resources server (tests/fakes/kubelet.py) naming the pod
that holds that GPU, does what tests/kubelet.py models: the API server's defaults, a pod
sandbox with its own network namespace and the pod's IP, the container's environment
(image, spec, downward API, the Service-link variables of every Service the release
makes and of ``kubernetes``), hostPath and emptyDir mounts, user, groups, capabilities,
no_new_privs and read-only root as containerd sets them (tests/container_init.py does
what runc does, by chroot into the image's root), the image's entrypoint with the spec's
args as pid 1 of its PID namespace; the liveness and readiness probes with the spec's
timing, from the container's start (pkg/kubelet/prober/worker.go); a scrape of the pod's
IP; ``kubectl exec ... gpu-exporter snapshot`` and ``gpu-exporter top`` (in a terminal);
then the image's stop signal, SIGKILL only after terminationGracePeriodSeconds
(kuberuntime_container.go, killContainer). The scenarios run at once: the whole journey
takes about the liveness probe's period (30 s) and a few seconds more.

Scenarios: the chart's and kustomize's defaults; the chart on the kubelet root directories
of microk8s and k0s, and on one where no kubelet serves (the pod runs, the kubernetes
backend down); the chart with Service links turned
back on and Services of other names and ports in the namespace; the chart without pod
attribution (uid 10001) pushing OTLP to a collector on the pod's loopback (the image's
``otlp`` extra); the per-process preset (hostPID, CAP_SYS_PTRACE).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from helm_python.chart import Chart
from prometheus_client.parser import text_string_to_metric_families
from test_deploy_kubernetes import KUBECTL, KUSTOMIZE, kustomize

from tests import kubelet as k
from tests.daemon import FIXTURES, promtool_check
from tests.fakes.kubelet import Container, FakeKubelet, Node, Pod
from tests.image_build import BuiltImage

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
INIT = ROOT / "tests" / "container_init.py"
CHART = ROOT / "helm" / "gpu-exporter"
NODE_SYS = FIXTURES / "amd-rdna3-rx7800xt" / "sys"
NAMESPACE = "gpu-exporter"
CLONE_NEWNET = 0x40000000
TMUX = shutil.which("tmux")
T = TypeVar("T")

# The workload the fake kubelet reports: the AMD device plugin gives the GPU's PCI address.
WORKLOAD = Pod("vision", "detector-0", "4f1c2a9e-0d6b-4e55-9b2f-7f0c3e1d2a10", [
    Container("detector", "9c" * 32, {"amd.com/gpu": ["0000:03:00.0"]})])


def card_bus_id() -> str:
    """The fixture card's PCI address, read from its sysfs tree (not from the exporter)."""
    (card,) = [c for c in (NODE_SYS / "class" / "drm").iterdir()
               if c.name.startswith("card") and "-" not in c.name]
    return os.path.basename(os.path.realpath(card / "device"))


# ---------------------------------------------------------------- the scenarios


@dataclass(frozen=True)
class Scenario:
    name: str
    source: str  # "chart" or "kustomize"
    release: str = "gpu-exporter"
    values: dict[str, Any] = field(default_factory=dict)
    service_links: bool | None = None  # set on the pod spec (None: as rendered)
    other_services: tuple[k.Service, ...] = ()  # more Services in the namespace
    otlp: bool = False  # a collector on the pod's loopback, its URL in extraArgs
    top: bool = False  # kubectl exec -it <pod> -- gpu-exporter top
    # what the pod spec says, written here: the process's identity
    uid: int = 0
    gid: int = 10001
    cap_eff: int = 0
    pid_namespace: bool = True
    attribution: bool = True
    kubelet_absent: bool = False  # no kubelet socket where the pod looks: backend down


def _svc(name: str, ip: str, *ports: k.Port) -> k.Service:
    return k.Service(NAMESPACE, name, ip, ports)


# The kubelet root directories docs/deploy.md names: on this node a kubelet serves under
# each (kubeadm, k3s and RKE2 use the default); "/srv/kubelet" is a custom --root-dir that
# serves nothing, where the chart's pod must still run.
KUBELET_ROOTS = ("/var/lib/kubelet", "/var/snap/microk8s/common/var/lib/kubelet",
                 "/var/lib/k0s/kubelet")
NO_KUBELET_ROOT = "/srv/kubelet"

SCENARIOS = [
    Scenario("chart", "chart", top=True),
    Scenario("chart-microk8s", "chart",
             values={"kubernetes": {"kubeletRootDir": KUBELET_ROOTS[1]}}),
    Scenario("chart-k0s", "chart", values={"kubernetes": {"kubeletRootDir": KUBELET_ROOTS[2]}}),
    Scenario("chart-socket-absent", "chart",
             values={"kubernetes": {"kubeletRootDir": NO_KUBELET_ROOT}}, attribution=False,
             kubelet_absent=True),
    Scenario("kustomize", "kustomize"),
    Scenario("chart-service-links", "chart", release="gpu-exporter-web",
             values={"service": {"port": 80}}, service_links=True,
             other_services=(_svc("gpu-exporter-web-listen", "10.96.7.1", (9445, "web", "TCP")),
                             _svc("gpu-exporter-collector", "10.96.7.2",
                                  (4317, "otlp-grpc", "TCP"), (4318, "otlp-http", "TCP")),
                             _svc("gpu-exporter-log", "fd00:10:96::7", (53, "dns", "UDP")))),
    Scenario("chart-non-root-otlp", "chart", values={"kubernetes": {"enabled": False}},
             otlp=True, uid=10001, attribution=False),
    Scenario("chart-per-process", "chart", values={"perProcess": {"enabled": True}},
             cap_eff=1 << 19, pid_namespace=False),  # CAP_SYS_PTRACE
]


def rendered(scenario: Scenario, extra_args: list[str]) -> list[dict[str, Any]]:
    if scenario.source == "kustomize":
        if KUBECTL is None:
            pytest.skip("kubectl (with kustomize) is not installed")
        return kustomize(KUSTOMIZE)
    values = {**scenario.values}
    if extra_args:
        values["extraArgs"] = extra_args
    with Chart.load(CHART) as chart:
        out = chart.render(values=values, name=scenario.release, namespace=NAMESPACE,
                           is_install=True)
    return [d for path, text in out.items() if path.endswith(".yaml")
            for d in yaml.safe_load_all(text) if d]


# ---------------------------------------------------------------- namespaces


def in_netns(pid: int, fn: Callable[[], T]) -> T:
    """fn() on a thread of its own inside the network namespace of ``pid`` (setns moves
    only the calling thread): how the kubelet and Prometheus reach the pod's IP."""
    libc = ctypes.CDLL(None, use_errno=True)
    box: dict[str, Any] = {}

    def target() -> None:
        fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns net")
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e
        finally:
            os.close(fd)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def container_process(pid: int, timeout: float = 20.0) -> int:
    """The child of ``pid`` (unshare --fork's: the container's pid 1) once it has replaced
    tests/container_init.py with the image's program."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and INIT.name not in cmdline:
                return int(entry.name)
        time.sleep(0.05)
    raise AssertionError(f"the container of {pid} did not start in {timeout}s")


def status_of(pid: int) -> dict[str, str]:
    return dict(line.split(":\t", 1) for line in
                Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line)


# ---------------------------------------------------------------- one journey


@dataclass
class Journey:
    scenario: Scenario
    pod_name: str = ""
    spec: dict[str, Any] = field(default_factory=dict)
    container: dict[str, Any] = field(default_factory=dict)
    env: list[str] = field(default_factory=list)
    argv: list[str] = field(default_factory=list)
    liveness: k.ProbeWorker | None = None
    readiness: k.ProbeWorker | None = None
    metrics: str = ""
    snapshot: dict[str, Any] = field(default_factory=dict)
    status: dict[str, str] = field(default_factory=dict)
    environ: list[str] = field(default_factory=list)
    root_options: list[str] = field(default_factory=list)
    otlp_requests: list[Any] = field(default_factory=list)
    top_screen: str = ""
    top_exit: str = ""
    grace: int = 0
    stop_signal: str = ""
    stopped_after: float = -1.0
    exit_code: int | None = None
    killed: bool = False
    stdout: str = ""
    stderr: str = ""
    run_state: dict[str, Any] = field(default_factory=dict)
    error: BaseException | None = None
    host_dir: list[str] | None = None  # the pod-resources directory on the node, after


class PodRun:
    """One pod on the node: sandbox, container, probes, exec, stop; cleaned up in close()."""

    def __init__(self, scenario: Scenario, image: BuiltImage, node: k.Node, tmp: Path,
                 index: int) -> None:
        self.journey = Journey(scenario)
        self.image, self.node, self.tmp = image, node, tmp
        self.pod_ip = f"10.244.1.{10 + index}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.cid = ""
        self.pid = 0  # the container's process, as this machine numbers it
        self.receiver: Any = None
        self.tmux: list[str] = []

    def write(self, name: str, data: Any) -> Path:
        path = self.tmp / name
        path.write_text(json.dumps(data) if not isinstance(data, str) else data)
        return path

    def start_sandbox(self, pod_name: str) -> None:
        spec = self.write("sandbox.json", {"hostname": pod_name, "pod_ip": self.pod_ip})
        proc = subprocess.Popen(["unshare", "--net", "--uts", "--ipc", sys.executable,
                                 str(INIT), "sandbox", str(spec)])
        self.procs.append(proc)
        deadline = time.monotonic() + 20
        while Path(f"/proc/{proc.pid}/comm").read_text().strip() != "sleep":
            assert proc.poll() is None and time.monotonic() < deadline, "sandbox did not start"
            time.sleep(0.05)
        self.sandbox = proc.pid

    def run(self) -> Journey:
        j, sc = self.journey, self.journey.scenario
        pod_name = f"{sc.release}-x7k2p"  # a DaemonSet pod: the DaemonSet's name and a suffix
        self.start_sandbox(pod_name)
        extra_args: list[str] = []
        if sc.otlp:  # an OpenTelemetry Collector beside the exporter, on the pod's loopback
            from tests.test_otlp import Receiver

            self.receiver = in_netns(self.sandbox, Receiver)
            threading.Thread(target=self.receiver.server.serve_forever, daemon=True).start()
            extra_args = [f"--otlp.endpoint={self.receiver.url}", "--otlp.interval=2s"]
        docs = rendered(sc, extra_args)
        (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
        assert daemonset["metadata"]["name"] == sc.release
        template = daemonset["spec"]["template"]["spec"]
        if sc.service_links is not None:
            template = {**template, "enableServiceLinks": sc.service_links}
        spec = j.spec = k.with_api_defaults(template)
        (container,) = spec["containers"]
        j.container, j.pod_name = container, pod_name
        services = [k.Service.of(d, f"10.96.0.{20 + i}") for i, d in enumerate(docs)
                    if d["kind"] == "Service"]
        services += [*sc.other_services, k.KUBERNETES_SERVICE]
        facts = k.PodFacts(pod_name, NAMESPACE, "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d",
                           self.node.name, self.node.ip, self.pod_ip)
        image = k.ImageConfig.of(self.image.config)
        # the container: its own writable layer of the image, mounted
        podman = self.image.store.podman  # the test run's own storage (tests/image_build.py)
        self.cid = subprocess.run([*podman, "create", self.image.id], capture_output=True,
                                  text=True, check=True, timeout=120).stdout.strip()
        rootfs = Path(subprocess.run([*podman, "mount", self.cid], capture_output=True,
                                     text=True, check=True, timeout=120).stdout.strip())
        ident = k.identity(spec, container, image, rootfs)
        env = k.kubelet_env(spec, container, facts, services)
        j.env = k.runtime_env(image.env, pod_name, env)
        j.argv = k.argv(container, image, env)
        pod_dir = self.tmp / "pod"
        mounts = k.mounts(spec, container, self.node, pod_dir)
        # what the kubelet and containerd add: hosts, hostname, resolv.conf, termination-log
        for name, text, where in (
                ("etc-hosts", f"# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"
                              f"::1\tlocalhost ip6-localhost ip6-loopback\n"
                              f"{self.pod_ip}\t{pod_name}\n", "/etc/hosts"),
                ("hostname", pod_name + "\n", "/etc/hostname"),
                ("resolv.conf", f"search {NAMESPACE}.svc.cluster.local svc.cluster.local "
                                "cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n",
                 "/etc/resolv.conf"),
                ("termination-log", "", container["terminationMessagePath"])):
            mounts.append({"source": str(self.write(name, text)), "destination": where,
                           "read_only": False})
        self.process = {"env": j.env, "uid": ident.uid, "gid": ident.gid,
                        "groups": list(ident.groups), "capabilities": list(ident.capabilities),
                        "no_new_privs": ident.no_new_privs,
                        "cwd": container.get("workingDir") or image.working_dir or "/"}
        run_spec = self.write("run.json", {
            **self.process, "rootfs": str(rootfs), "mounts": mounts, "argv": j.argv,
            "read_only_rootfs": ident.read_only_rootfs, "sandbox_pid": self.sandbox})
        self.stdout, self.stderr = self.tmp / "stdout.log", self.tmp / "stderr.log"
        host_pid = spec.get("hostPID", False)
        unshare = ["unshare", "--mount", *([] if host_pid else ["--pid"]), "--fork",
                   "--kill-child", "--propagation", "private"]
        with self.stdout.open("wb") as out, self.stderr.open("wb") as err:
            proc = subprocess.Popen([*unshare, sys.executable, str(INIT), "run", str(run_spec)],
                                    stdout=out, stderr=err)
        started = time.monotonic()
        self.procs.append(proc)
        self.container_proc = proc
        self.pid = container_process(proc.pid)
        # the probe workers, from the container's start
        workers = [k.ProbeWorker("liveness", container["livenessProbe"]),
                   k.ProbeWorker("readiness", container["readinessProbe"])]
        j.liveness, j.readiness = workers
        observe = max(w.spec["initialDelaySeconds"] + w.spec["periodSeconds"]
                      for w in workers) + 1
        threads = [threading.Thread(target=k.probe_loop, args=(
            w, started, started + observe, self.prober(w.spec))) for w in workers]
        for t in threads:
            t.start()
        while j.readiness.state != "success" and time.monotonic() < started + observe:
            time.sleep(0.2)
        j.status = status_of(self.pid)
        j.environ = Path(f"/proc/{self.pid}/environ").read_bytes().decode().split("\0")[:-1]
        for line in Path(f"/proc/{self.pid}/mountinfo").read_text().splitlines():
            fields = line.split()
            if fields[4] == "/":
                j.root_options = fields[5].split(",")
        port = k.resolve_port("metrics", container)
        j.metrics = in_netns(self.sandbox, lambda: urllib.request.urlopen(
            f"http://{self.pod_ip}:{port}/metrics", timeout=10).read().decode())
        snapshot = self.exec(["gpu-exporter", "snapshot", "--from", f"http://127.0.0.1:{port}"])
        assert snapshot.returncode == 0, snapshot.stderr
        j.snapshot = json.loads(snapshot.stdout)
        if sc.top:
            self.top(port)
        for t in threads:
            t.join()
        if self.receiver is not None:
            j.otlp_requests = list(self.receiver.requests)
        self.stop()
        return j

    def prober(self, probe: dict[str, Any]) -> Callable[[], tuple[str, str]]:
        container = self.journey.container
        return lambda: in_netns(self.sandbox, lambda: k.run_probe(probe, container,
                                                                  self.pod_ip))

    def exec_spec(self, argv: list[str], tty: bool) -> Path:
        env = self.process["env"] + (["TERM=xterm"] if tty else [])
        return self.write(f"exec-{argv[1]}.json", {
            **self.process, "env": env, "argv": argv, "target_pid": self.pid,
            "pid_namespace": not self.journey.spec.get("hostPID", False)})

    def exec(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        """kubectl exec <pod> -- argv."""
        return subprocess.run([sys.executable, str(INIT), "exec",
                               str(self.exec_spec(argv, tty=False))],
                              capture_output=True, text=True, timeout=60)

    def top(self, port: int) -> None:
        """kubectl exec -it <pod> -- gpu-exporter top, in a 120x40 terminal (tmux)."""
        if TMUX is None:
            self.journey.top_screen = "tmux is not installed"
            return
        spec = self.exec_spec(["gpu-exporter", "top", "--from", f"http://127.0.0.1:{port}"],
                              tty=True)
        self.tmux = [TMUX, "-L", f"journey-{os.getpid()}-{self.tmp.name}", "-f", "/dev/null"]
        shell = f"{sys.executable} {INIT} exec {spec}; echo EXIT=$?; sleep 60"
        subprocess.run([*self.tmux, "new-session", "-d", "-s", "top", "-x", "120", "-y", "40",
                        "sh", "-c", shell], check=True, timeout=20)

        def screen() -> str:
            return subprocess.run([*self.tmux, "capture-pane", "-p", "-t", "top"],
                                  capture_output=True, text=True, timeout=20).stdout

        deadline = time.monotonic() + 20
        while "· amd · ● up" not in (text := screen()) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.journey.top_screen = text
        subprocess.run([*self.tmux, "send-keys", "-t", "top", "q"], timeout=20)
        deadline = time.monotonic() + 10
        while "EXIT=" not in (text := screen()) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.journey.top_exit = text[text.find("EXIT="):].split()[0] if "EXIT=" in text else ""

    def stop(self) -> None:
        """killContainer: the image's stop signal, then SIGKILL once the grace period is
        over (the runtime's StopContainer)."""
        j = self.journey
        j.grace, j.stop_signal = k.grace_period(j.spec), k.ImageConfig.of(
            self.image.config).stop_signal
        sent = time.monotonic()
        os.kill(self.pid, signal.Signals[j.stop_signal])
        try:
            self.container_proc.wait(timeout=j.grace)
        except subprocess.TimeoutExpired:
            j.killed = True
            os.kill(self.pid, signal.SIGKILL)
            self.container_proc.wait(timeout=30)
        j.stopped_after = time.monotonic() - sent
        j.exit_code = self.container_proc.returncode
        j.stdout, j.stderr = self.stdout.read_text(), self.stderr.read_text()
        state = self.tmp / "pod" / "volumes" / "kubernetes.io~empty-dir" / "state" / "run.json"
        j.run_state = json.loads(state.read_text()) if state.exists() else {}

    def close(self) -> None:
        if self.tmux:
            subprocess.run([*self.tmux, "kill-server"], capture_output=True, timeout=20)
        if self.receiver is not None:
            self.receiver.server.shutdown()
            self.receiver.server.server_close()
        if self.pid and self.procs[-1].poll() is None:
            os.kill(self.pid, signal.SIGKILL)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        if self.cid:
            podman = self.image.store.podman
            subprocess.run([*podman, "umount", self.cid], capture_output=True, timeout=120)
            subprocess.run([*podman, "rm", "-f", self.cid], capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def journeys(built_image: BuiltImage,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Journey]]:
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    # The node's root is short: a unix socket's path has 107 bytes, and microk8s' socket
    # alone takes 69 of them.
    root = Path(tempfile.mkdtemp(prefix="node-", dir="/tmp"))
    try:
        node = k.Node(root, {"/sys": NODE_SYS, "/proc": Path("/proc")})
        kubelets = ExitStack()
        for kubelet_root in KUBELET_ROOTS:
            sockets = node.host_path(kubelet_root + "/pod-resources")
            sockets.mkdir(parents=True)
            kubelets.enter_context(FakeKubelet(sockets / "kubelet.sock", Node([WORKLOAD])))
        runs = [PodRun(s, built_image, node, tmp_path_factory.mktemp(s.name), i)
                for i, s in enumerate(SCENARIOS)]

        def one(run: PodRun) -> Journey:
            try:
                return run.run()
            except BaseException as e:  # noqa: BLE001 - reported by the scenario's tests
                run.journey.error = e
                for stream in ("stdout", "stderr"):
                    log = run.tmp / f"{stream}.log"
                    if log.exists() and not getattr(run.journey, stream):
                        setattr(run.journey, stream, log.read_text())
                return run.journey
            finally:
                run.close()

        started = time.monotonic()
        with kubelets, ThreadPoolExecutor(len(runs)) as pool:
            done = {j.scenario.name: j for j in pool.map(one, runs)}
        print(f"pod journeys: {len(runs)} pods in {time.monotonic() - started:.1f} s")
        for j in done.values():  # what DirectoryOrCreate left where no kubelet serves
            if j.scenario.kubelet_absent:
                j.host_dir = sorted(
                    p.name for p in node.host_path(NO_KUBELET_ROOT + "/pod-resources").iterdir())
        yield done
    finally:
        shutil.rmtree(root, ignore_errors=True)


def journey_of(journeys: dict[str, Journey], name: str) -> Journey:
    j = journeys[name]
    if isinstance(j.error, pytest.skip.Exception):
        raise j.error
    if j.error is not None:
        raise AssertionError(f"{name}: the journey failed ({j.error!r}); the container "
                             f"said:\n{(j.stdout + j.stderr)[-2000:]}") from j.error
    return j


NAMES = [s.name for s in SCENARIOS]


# ---------------------------------------------------------------- what a kubelet sees


@pytest.mark.parametrize("name", NAMES)
def test_the_pod_becomes_ready_and_is_never_killed_by_its_probes(
        journeys: dict[str, Journey], name: str) -> None:
    j = journey_of(journeys, name)
    assert j.readiness is not None and j.liveness is not None
    print(name, "readiness", [(round(o.at, 2), o.result, o.detail[:40]) for o in
                              j.readiness.outcomes],
          "liveness", [(round(o.at, 2), o.result) for o in j.liveness.outcomes])
    # Ready once, and ready from then on.
    assert [result for _, result in j.readiness.changes] == ["success"]
    ready_at = j.readiness.changes[0][0]
    assert all(o.result == "success" for o in j.readiness.outcomes if o.at >= ready_at)
    # Never killed: the liveness state never left success, and it has seen the daemon.
    assert j.liveness.kill_at is None and j.liveness.changes == []
    assert any(o.result == "success" for o in j.liveness.outcomes)
    for worker in (j.liveness, j.readiness):
        assert len(worker.outcomes) >= 2  # the probe at the start and one a period later
        assert all(o.took < worker.spec["timeoutSeconds"] for o in worker.outcomes
                   if o.result == "success")


@pytest.mark.parametrize("name", NAMES)
def test_the_scrape_of_the_pod_ip_has_the_node_gpu_and_its_pod(
        journeys: dict[str, Journey], name: str) -> None:
    j = journey_of(journeys, name)
    assert promtool_check(j.metrics).returncode == 0
    samples = [(s.name, s.labels, s.value) for f in text_string_to_metric_families(j.metrics)
               for s in f.samples]
    bus = card_bus_id()
    assert ("gpu_up", {"gpu": "0", "source": "sysfs", "uuid": f"pci-{bus}", "vendor": "amd"},
            1.0) in samples
    assert ("gpu_exporter_up", {}, 1.0) in samples
    allocations = [labels for n, labels, _ in samples if n == "gpu_kubernetes_allocation_info"]
    kube_up = [v for n, labels, v in samples
               if n == "gpu_exporter_backend_up" and labels["backend"] == "kubernetes"]
    if j.scenario.attribution:  # the kubelet socket, reached as the pod's user, through the mount
        (workload,) = WORKLOAD.containers
        assert kube_up == [1.0]
        assert [(a["uuid"], a["namespace"], a["pod"], a["container"]) for a in allocations] == [
            (f"pci-{bus}", WORKLOAD.namespace, WORKLOAD.name, workload.name)]
    elif j.scenario.kubelet_absent:  # auto: down with its reason, the pod still serving
        reasons = [labels["reason"] for n, labels, v in samples
                   if n == "gpu_exporter_backend_down_reason" and labels["backend"] ==
                   "kubernetes" and v == 1.0]
        assert allocations == [] and kube_up == [0.0] and reasons == ["unreachable"]
    else:
        assert allocations == [] and kube_up in ([], [0.0])
    backends = {b["backend"]: b for b in j.snapshot["backends"]}
    assert backends["amd"]["up"] is True
    assert [d["info"]["pci_bus_id"] for d in backends["amd"]["devices"]] == [bus]


@pytest.mark.parametrize("name", NAMES)
def test_the_process_has_the_identity_the_spec_gives(
        journeys: dict[str, Journey], name: str) -> None:
    j, sc = journey_of(journeys, name), journey_of(journeys, name).scenario
    assert j.status["Uid"].split() == [str(sc.uid)] * 4
    assert j.status["Gid"].split() == [str(sc.gid)] * 4
    for caps in ("CapEff", "CapPrm", "CapBnd"):
        assert int(j.status[caps], 16) == sc.cap_eff, caps
    assert int(j.status["CapInh"], 16) == 0 and int(j.status.get("CapAmb", "0"), 16) == 0
    assert j.status["NoNewPrivs"] == "1"  # allowPrivilegeEscalation: false
    assert "ro" in j.root_options  # readOnlyRootFilesystem
    nspid = j.status["NSpid"].split()
    assert (nspid[-1] == "1") is sc.pid_namespace  # pid 1 of its PID namespace, unless hostPID
    assert j.argv[0] == "gpu-exporter" and j.argv[1:] == j.container["args"]


@pytest.mark.parametrize("name", NAMES)
def test_the_environment_is_the_kubelets(journeys: dict[str, Journey], name: str) -> None:
    j = journey_of(journeys, name)
    assert j.environ == j.env
    env = dict(e.split("=", 1) for e in j.environ)
    assert env["NODE_NAME"] == "gpu-node-1"  # downward API spec.nodeName
    assert env["HOSTNAME"] == j.pod_name
    assert env["KUBERNETES_SERVICE_HOST"] == "10.96.0.1"  # always, links or not
    assert env["KUBERNETES_PORT"] == "tcp://10.96.0.1:443"
    links = [n for n in env if n.startswith("GPU_EXPORTER_") and n != "GPU_EXPORTER_LOG_FORMAT"]
    if j.scenario.service_links:
        assert env["GPU_EXPORTER_WEB_PORT"].startswith("tcp://10.96.0.") and env[
            "GPU_EXPORTER_WEB_PORT"].endswith(":80")
        assert env["GPU_EXPORTER_WEB_LISTEN_SERVICE_PORT_WEB"] == "9445"
        assert env["GPU_EXPORTER_LOG_PORT_53_UDP"] == "udp://[fd00:10:96::7]:53"
        assert len(links) > 20
    else:
        assert links == []  # enableServiceLinks: false in what we ship


@pytest.mark.parametrize("name", NAMES)
def test_the_stop_signal_ends_it_cleanly_within_the_grace_period(
        journeys: dict[str, Journey], name: str) -> None:
    j = journey_of(journeys, name)
    print(name, f"stopped {j.stopped_after:.2f} s after {j.stop_signal}")
    assert j.stop_signal == "SIGTERM" and j.grace == 30
    assert not j.killed and j.exit_code == 0
    assert j.stopped_after < 10, j.stopped_after
    # The emptyDir survived a read-only root: this run is recorded as a clean stop.
    assert j.run_state["clean"] is True
    assert j.run_state["pid"] == (1 if j.scenario.pid_namespace else j.run_state["pid"])


@pytest.mark.parametrize("name", NAMES)
def test_the_logs_are_json_lines_without_errors(journeys: dict[str, Journey], name: str) -> None:
    j = journey_of(journeys, name)
    lines = [line for line in (j.stdout + j.stderr).splitlines() if line.strip()]
    assert lines
    records = [json.loads(line) for line in lines]  # --log.format=json: every line
    assert [r for r in records if r["level"] in ("error", "critical")] == []
    assert any(r["event"] == "listening" for r in records)


def test_a_kubelet_socket_absent_is_one_log_line_naming_the_value_to_set(
        journeys: dict[str, Journey]) -> None:
    """The chart forced --collector.kubernetes on: where the kubelet's root directory is
    not /var/lib/kubelet the daemon exited 2 and the DaemonSet restarted it for ever."""
    j = journey_of(journeys, "chart-socket-absent")
    records = [json.loads(line) for line in (j.stdout + j.stderr).splitlines() if line.strip()]
    down = [r for r in records if r.get("backend") == "kubernetes"]
    assert [r["event"] for r in down] == ["backend down"], down
    assert down[0]["level"] == "info" and down[0]["code"] == "unreachable"
    assert f"{NO_KUBELET_ROOT}/pod-resources/kubelet.sock not found" in down[0]["reason"]
    assert "kubernetes.kubeletRootDir" in down[0]["reason"]
    assert j.exit_code == 0 and not j.killed
    assert j.host_dir == []  # DirectoryOrCreate made it, and it stays empty


def test_kubectl_exec_top_shows_the_gpu_and_quits(journeys: dict[str, Journey]) -> None:
    j = journey_of(journeys, "chart")
    if TMUX is None:
        pytest.skip("tmux is not installed: top is not tried in a terminal")
    assert "· amd · ● up" in j.top_screen, j.top_screen
    assert j.top_exit == "EXIT=0", j.top_screen


def test_the_image_pushes_otlp_to_a_collector_in_the_pod(journeys: dict[str, Journey]) -> None:
    from tests.test_otlp import points

    j = journey_of(journeys, "chart-non-root-otlp")
    assert j.otlp_requests, "no OTLP push arrived"
    found = points(j.otlp_requests[-1])
    _, gpus = found["hw.gpu.utilization"]
    assert {attrs.get("hw.id") for attrs, _ in gpus} == {f"pci-{card_bus_id()}"}
