"""A model of how a kubelet (and containerd under it) starts, probes and stops one
container of a pod spec, written from the Kubernetes and containerd sources named at each
piece, for the pod journey (tests/test_deploy_pod_journey.py). The container itself is
started by tests/container_init.py (what runc does), by chroot into the image's root
filesystem in namespaces of its own: no container runtime can start one on this machine.

What the API server adds before a kubelet sees a pod (``with_api_defaults``,
pkg/apis/core/v1/defaults.go), the environment (``container_env``: the kubelet's
makeEnvironmentVariables and getServiceEnvVarMap in pkg/kubelet/kubelet_pods.go, the
Service-link variables of pkg/kubelet/envvars/envvars.go, then containerd's merge with the
image's), the volumes (``mounts``: hostPath type checks of pkg/volume/hostpath, emptyDir
of pkg/volume/emptydir), user and capabilities (``identity``: containerd's WithUser,
WithAdditionalGIDs and WithCapabilities), the probe workers (``ProbeWorker``,
pkg/kubelet/prober/worker.go, with the HTTP and TCP probes of pkg/probe/http and
pkg/probe/tcp) and the stop (``grace_period``, kuberuntime_container.go's killContainer:
the image's stop signal, then SIGKILL when the grace period is over).
"""

from __future__ import annotations

import copy
import http.client
import re
import socket
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Port = tuple[int, str, str]  # (port, name, protocol); name "" only for a lone first port

# ---------------------------------------------------------------- API defaults

# pkg/apis/core/v1/defaults.go: SetDefaults_Probe, SetDefaults_PodSpec, SetDefaults_Container
PROBE_DEFAULTS = {"timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1,
                  "failureThreshold": 3, "initialDelaySeconds": 0}
DEFAULT_GRACE_S = 30  # v1.DefaultTerminationGracePeriodSeconds
MINIMUM_GRACE_S = 2  # kuberuntime_container.go: minimumGracePeriodInSeconds
CONTAINERD_CAPS = ("CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID",
                   "SETUID", "SETFCAP", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL",
                   "AUDIT_WRITE")  # containerd pkg/oci/spec.go, populateDefaultUnixSpec


def with_api_defaults(pod_spec: Mapping[str, Any]) -> dict[str, Any]:
    spec = copy.deepcopy(dict(pod_spec))
    spec.setdefault("enableServiceLinks", True)  # v1.DefaultEnableServiceLinks
    spec.setdefault("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("securityContext", {})
    for c in spec["containers"]:
        c.setdefault("terminationMessagePath", "/dev/termination-log")
        for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
            if kind in c:
                c[kind] = {**PROBE_DEFAULTS, **c[kind]}
    return spec


# ---------------------------------------------------------------- environment


def _var(name: str) -> str:
    return name.upper().replace("-", "_")


def _join_host_port(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def service_env(service: str, cluster_ip: str, ports: Sequence[Port]) -> dict[str, str]:
    """The variables the kubelet writes for one Service (envvars.go, FromServices): for a
    Service with a cluster IP, ``<NAME>_SERVICE_HOST``, ``<NAME>_SERVICE_PORT`` (the first
    port), ``<NAME>_SERVICE_PORT_<PORT NAME>`` for every named port, and the Docker-link set
    (makeLinkVariables): ``<NAME>_PORT`` for the first port, then per port
    ``<NAME>_PORT_<port>_<PROTO>`` and its ``_PROTO``, ``_PORT``, ``_ADDR``; the name is the
    Service's upper-cased with ``-`` as ``_``, the protocol defaults to TCP, host and port
    are joined as Go's net.JoinHostPort does (IPv6 in brackets)."""
    env: dict[str, str] = {}
    prefix = _var(service)
    env[prefix + "_SERVICE_HOST"] = cluster_ip
    env[prefix + "_SERVICE_PORT"] = str(ports[0][0])
    for port, name, _ in ports:
        if name:
            env[f"{prefix}_SERVICE_PORT_{_var(name)}"] = str(port)
    for i, (port, _, protocol) in enumerate(ports):
        proto = (protocol or "TCP").lower()
        url = f"{proto}://{_join_host_port(cluster_ip, port)}"
        if i == 0:
            env[prefix + "_PORT"] = url
        port_prefix = f"{prefix}_PORT_{port}_{proto.upper()}"
        env[port_prefix] = url
        env[port_prefix + "_PROTO"] = proto
        env[port_prefix + "_PORT"] = str(port)
        env[port_prefix + "_ADDR"] = cluster_ip
    return env


@dataclass(frozen=True)
class Service:
    namespace: str
    name: str
    cluster_ip: str  # "" or "None": headless, no variables
    ports: tuple[Port, ...]

    @classmethod
    def of(cls, doc: Mapping[str, Any], cluster_ip: str) -> Service:
        """A rendered Service object, given the cluster IP the API server would assign."""
        ports = tuple((int(p["port"]), p.get("name", ""), p.get("protocol", "TCP"))
                      for p in doc["spec"]["ports"])
        return cls(doc["metadata"]["namespace"], doc["metadata"]["name"],
                   doc["spec"].get("clusterIP", cluster_ip), ports)


KUBERNETES_SERVICE = Service("default", "kubernetes", "10.96.0.1", ((443, "https", "TCP"),))


def service_links(namespace: str, enable: bool, services: Sequence[Service]) -> dict[str, str]:
    """getServiceEnvVarMap: the master Service ``kubernetes`` of namespace default always,
    every other Service of the pod's namespace only with enableServiceLinks; a Service
    without a cluster IP gives nothing."""
    chosen: dict[str, Service] = {}
    for s in services:
        if s.cluster_ip in ("", "None"):
            continue
        if s.namespace == "default" and s.name == "kubernetes":
            chosen.setdefault(s.name, s)
        elif s.namespace == namespace and enable:
            chosen[s.name] = s
    env: dict[str, str] = {}
    for s in chosen.values():
        env.update(service_env(s.name, s.cluster_ip, s.ports))
    return env


@dataclass(frozen=True)
class PodFacts:
    """What the downward API reads that the pod spec does not say."""

    name: str
    namespace: str
    uid: str
    node_name: str
    host_ip: str
    pod_ip: str
    service_account: str = "default"


def expand(text: str, env: Mapping[str, str]) -> str:
    """$(VAR) references (third_party/forked/golang/expansion): a defined variable is
    replaced, $$ is a literal $, anything else stays as written."""
    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", one, text)


def field_ref(path: str, pod: PodFacts, spec: Mapping[str, Any]) -> str:
    """podFieldSelectorRuntimeValue (kubelet_pods.go) and the fields it hands to the
    generic path (metadata.name, metadata.namespace, metadata.uid)."""
    values = {"metadata.name": pod.name, "metadata.namespace": pod.namespace,
              "metadata.uid": pod.uid, "spec.nodeName": pod.node_name,
              "spec.serviceAccountName": spec.get("serviceAccountName", pod.service_account),
              "status.hostIP": pod.host_ip, "status.hostIPs": pod.host_ip,
              "status.podIP": pod.pod_ip, "status.podIPs": pod.pod_ip}
    return values[path]


def kubelet_env(spec: Mapping[str, Any], container: Mapping[str, Any], pod: PodFacts,
                services: Sequence[Service]) -> dict[str, str]:
    """makeEnvironmentVariables: the container's env in order (``value`` with $(VAR)
    expanded against what came before and the Service variables, ``fieldRef`` from the
    downward API), then each Service-link variable the container did not set."""
    links = service_links(pod.namespace, spec["enableServiceLinks"], services)
    env: dict[str, str] = {}
    for e in container.get("env", []):
        if "valueFrom" in e:
            source = e["valueFrom"]
            if set(source) != {"fieldRef"}:
                raise NotImplementedError(f"env {e['name']}: {sorted(source)}")
            env[e["name"]] = field_ref(source["fieldRef"]["fieldPath"], pod, spec)
        else:
            env[e["name"]] = expand(e.get("value", ""), {**links, **env})
    for name, value in links.items():
        env.setdefault(name, value)
    return env


def runtime_env(image_env: Sequence[str], hostname: str, env: Mapping[str, str],
                tty: bool = False) -> list[str]:
    """containerd's buildLinuxSpec: HOSTNAME, then the image's environment, then the
    container's, each replacing a variable of the same name where it stands (oci.WithEnv);
    an exec with a terminal adds TERM=xterm (container_execsync.go)."""
    out: list[str] = []

    def put(entries: Sequence[str]) -> None:
        for entry in entries:
            name = entry.split("=", 1)[0]
            for i, old in enumerate(out):
                if old.split("=", 1)[0] == name:
                    out[i] = entry
                    break
            else:
                out.append(entry)

    put([f"HOSTNAME={hostname}"])
    put(list(image_env))
    put([f"{k}={v}" for k, v in env.items()])
    if tty:
        put(["TERM=xterm"])
    return out


# ---------------------------------------------------------------- the image


@dataclass(frozen=True)
class ImageConfig:
    """The image's config (podman image inspect's .Config)."""

    env: tuple[str, ...]
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    user: str
    working_dir: str
    stop_signal: str

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> ImageConfig:
        return cls(tuple(config.get("Env") or ()), tuple(config.get("Entrypoint") or ()),
                   tuple(config.get("Cmd") or ()), config.get("User") or "",
                   config.get("WorkingDir") or "", config.get("StopSignal") or "SIGTERM")


def argv(container: Mapping[str, Any], image: ImageConfig, env: Mapping[str, str]) -> list[str]:
    """The process's argv (kubecontainer.ExpandContainerCommandAndArgs, containerd's
    WithProcessArgs): ``command`` replaces the image's ENTRYPOINT (and drops its CMD),
    ``args`` replaces CMD; $(VAR) references are expanded."""
    command = [expand(w, env) for w in container.get("command", [])] or list(image.entrypoint)
    if "command" in container and "args" not in container:
        return command
    args = [expand(w, env) for w in container["args"]] if "args" in container else list(
        image.cmd)
    return command + args


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int
    groups: tuple[int, ...]
    capabilities: tuple[str, ...]
    no_new_privs: bool
    read_only_rootfs: bool


def _passwd(rootfs: Path, uid: int) -> tuple[str, int] | None:
    for line in (rootfs / "etc" / "passwd").read_text().splitlines():
        fields = line.split(":")
        if len(fields) > 3 and fields[2] == str(uid):
            return fields[0], int(fields[3])
    return None


def identity(spec: Mapping[str, Any], container: Mapping[str, Any], image: ImageConfig,
             rootfs: Path) -> Identity:
    """The process's user, groups and capabilities. runAsUser/runAsGroup of the container,
    else of the pod, else the image's USER (containerd platformSpecOpts, oci.WithUser: a
    uid without a group takes the gid /etc/passwd gives it, else 0); runAsNonRoot refuses
    uid 0 (the kubelet's verifyRunAsNonRoot); the groups of the image's /etc/group that
    list the user by name (oci.WithAdditionalGIDs), supplementalGroups and fsGroup;
    capabilities from containerd's default set, ``drop`` (ALL: every one) then ``add``
    (customopts.WithCapabilities); allowPrivilegeEscalation false: no_new_privs."""
    pod_ctx = spec.get("securityContext", {})
    ctx = container.get("securityContext", {})
    if ctx.get("privileged"):
        raise NotImplementedError("privileged containers")

    def setting(key: str) -> Any:
        return ctx.get(key, pod_ctx.get(key))

    image_uid, _, image_gid = image.user.partition(":")
    uid = setting("runAsUser")
    if uid is None:
        uid = int(image_uid or 0)
    gid = setting("runAsGroup")
    entry = _passwd(rootfs, uid)
    if gid is None:
        gid = int(image_gid) if image_gid and setting("runAsUser") is None else (
            entry[1] if entry else 0)
    if setting("runAsNonRoot") and uid == 0:
        raise PermissionError("container has runAsNonRoot and image will run as root")
    groups: list[int] = []
    if entry:
        for line in (rootfs / "etc" / "group").read_text().splitlines():
            fields = line.split(":")
            if len(fields) > 3 and entry[0] in fields[3].split(","):
                groups.append(int(fields[2]))
    groups += list(pod_ctx.get("supplementalGroups", []))
    if "fsGroup" in pod_ctx:
        groups.append(pod_ctx["fsGroup"])
    caps_spec = ctx.get("capabilities", {})
    drop, add = set(caps_spec.get("drop", [])), list(caps_spec.get("add", []))
    caps = [] if "ALL" in drop else [c for c in CONTAINERD_CAPS if c not in drop]
    caps += [c for c in add if c not in caps]
    return Identity(int(uid), int(gid), tuple(dict.fromkeys(groups)), tuple(caps),
                    ctx.get("allowPrivilegeEscalation") is False,
                    bool(ctx.get("readOnlyRootFilesystem")))


# ---------------------------------------------------------------- volumes


@dataclass
class Node:
    """The node's file system: host paths resolve under ``root``, except those given in
    ``paths`` (e.g. "/sys" -> a fixture's sys tree, "/proc" -> this machine's /proc)."""

    root: Path
    paths: dict[str, Path] = field(default_factory=dict)
    name: str = "gpu-node-1"
    ip: str = "192.0.2.10"

    def host_path(self, path: str) -> Path:
        clean = "/" + path.strip("/")
        for known, where in self.paths.items():
            if clean == known or clean.startswith(known + "/"):
                return where / clean[len(known):].lstrip("/")
        return self.root / clean.lstrip("/")


def host_path_volume(node: Node, source: Mapping[str, Any]) -> Path:
    """pkg/volume/hostpath/host_path.go (checkType): DirectoryOrCreate makes a missing
    directory (0755), FileOrCreate a missing file (0644); Directory, File and Socket must
    exist as one; no type checks nothing."""
    path, kind = node.host_path(source["path"]), source.get("type", "")
    if kind == "DirectoryOrCreate" and not path.exists():
        path.mkdir(mode=0o755, parents=True)
    if kind == "FileOrCreate" and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o644)
    checks: dict[str, Callable[[Path], bool]] = {
        "Directory": Path.is_dir, "DirectoryOrCreate": Path.is_dir, "File": Path.is_file,
        "FileOrCreate": Path.is_file, "Socket": Path.is_socket}
    if kind and not checks[kind](path):
        raise FileNotFoundError(f"hostPath type check failed: {source['path']} is not a {kind}")
    return path


def mounts(spec: Mapping[str, Any], container: Mapping[str, Any], node: Node,
           pod_dir: Path) -> list[dict[str, Any]]:
    """The container's volume mounts in their order, each with the directory the kubelet
    mounts: a hostPath on the node, an emptyDir under the pod's directory (created 0777,
    pkg/volume/emptydir/empty_dir.go)."""
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    out = []
    for m in container.get("volumeMounts", []):
        volume = volumes[m["name"]]
        if "hostPath" in volume:
            source = host_path_volume(node, volume["hostPath"])
        elif "emptyDir" in volume:
            source = pod_dir / "volumes" / "kubernetes.io~empty-dir" / m["name"]
            source.mkdir(parents=True, exist_ok=True)
            source.chmod(0o777)
        else:
            raise NotImplementedError(f"volume {m['name']}: {sorted(volume)}")
        if "subPath" in m:
            raise NotImplementedError("subPath")
        out.append({"source": str(source), "destination": m["mountPath"],
                    "read_only": bool(m.get("readOnly"))})
    return out


# ---------------------------------------------------------------- probes


@dataclass
class Outcome:
    at: float  # seconds after the container started
    result: str  # "success" or "failure"
    detail: str
    took: float


def resolve_port(port: int | str, container: Mapping[str, Any]) -> int:
    """probe.ResolveContainerPort: a number as is, a name from the container's ports."""
    if isinstance(port, int):
        return port
    for p in container.get("ports", []):
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"no port named {port}")


def run_probe(probe: Mapping[str, Any], container: Mapping[str, Any], pod_ip: str,
              kube_version: str = "1.33") -> tuple[str, str]:
    """One probe (pkg/probe/http/http.go DoHTTPProbe, request.go; pkg/probe/tcp): GET
    scheme://<pod IP>:<port><path> with User-Agent kube-probe/<major.minor> and
    Accept */*, no keep-alive, certificates not verified, the whole exchange within
    timeoutSeconds; 200 <= status < 400 is success. tcpSocket: a connect within it."""
    timeout = float(probe["timeoutSeconds"])
    if "tcpSocket" in probe:
        try:
            with socket.create_connection((pod_ip, resolve_port(
                    probe["tcpSocket"]["port"], container)), timeout=timeout):
                return "success", "connected"
        except OSError as e:
            return "failure", str(e)
    get = probe["httpGet"]
    port = resolve_port(get["port"], container)
    host = get.get("host") or pod_ip
    if get.get("scheme", "HTTP").upper() == "HTTPS":
        context = ssl._create_unverified_context()
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            host, port, timeout=timeout, context=context)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    headers = {"User-Agent": f"kube-probe/{kube_version}", "Accept": "*/*",
               "Connection": "close",
               **{h["name"]: h["value"] for h in get.get("httpHeaders", [])}}
    try:
        conn.request("GET", get.get("path", "/"), headers=headers)
        response = conn.getresponse()
        body = response.read(10 * 1024)
    except (OSError, http.client.HTTPException) as e:
        return "failure", str(e) or type(e).__name__
    finally:
        conn.close()
    if 200 <= response.status < 400:
        return "success", body.decode(errors="replace").strip()
    return "failure", f"HTTP probe failed with statuscode: {response.status}"


@dataclass
class ProbeWorker:
    """pkg/kubelet/prober/worker.go for one probe of a running container: the state
    starts at the initial value (readiness: failure, liveness: success); each tick
    (periodSeconds apart, the first at the container's start: the worst case of the
    worker's phase) probes unless the container has run less than initialDelaySeconds;
    a result changes the state only after successThreshold (failureThreshold) results of
    that kind in a row; a liveness failure that reaches it means the container is
    killed and restarted (then the worker holds until a new container)."""

    kind: str  # "liveness" or "readiness"
    spec: Mapping[str, Any]
    state: str = ""
    last: str = ""
    run: int = 0
    outcomes: list[Outcome] = field(default_factory=list)
    changes: list[tuple[float, str]] = field(default_factory=list)
    kill_at: float | None = None

    def __post_init__(self) -> None:
        self.state = "failure" if self.kind == "readiness" else "success"

    def ticks(self) -> float:
        return float(self.spec["periodSeconds"])

    def record(self, at: float, result: str, detail: str, took: float) -> None:
        """doProbe's bookkeeping after one probe."""
        self.outcomes.append(Outcome(at, result, detail, took))
        if result == self.last:
            self.run += 1
        else:
            self.last, self.run = result, 1
        threshold = self.spec["failureThreshold" if result == "failure" else "successThreshold"]
        if self.run < threshold:
            return
        if result != self.state:
            self.state = result
            self.changes.append((at, result))
        if self.kind == "liveness" and result == "failure" and self.kill_at is None:
            self.kill_at = at
            self.run = 0

    def due(self, since_start: float) -> bool:
        """Whether a tick at this time probes (the initial delay is over, the worker is
        not on hold after a liveness kill)."""
        return int(since_start) >= self.spec["initialDelaySeconds"] and self.kill_at is None


def probe_loop(worker: ProbeWorker, started: float, stop_at: float,
               probe: Callable[[], tuple[str, str]]) -> None:
    """The worker's ticker from the container's start until ``stop_at`` (monotonic)."""
    tick = started
    while tick < stop_at:
        now = time.monotonic()
        if now < tick:
            time.sleep(tick - now)
        since = time.monotonic() - started
        if worker.due(since):
            t0 = time.monotonic()
            result, detail = probe()
            worker.record(since, result, detail, time.monotonic() - t0)
        tick += worker.ticks()


def grace_period(spec: Mapping[str, Any]) -> int:
    """killContainer's grace period for a pod being deleted (setTerminationGracePeriod):
    terminationGracePeriodSeconds, at least minimumGracePeriodInSeconds."""
    return max(int(spec["terminationGracePeriodSeconds"]), MINIMUM_GRACE_S)
