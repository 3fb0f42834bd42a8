"""The ``kubernetes`` backend: refreshes pod attribution on its own slow tier.

Every ``--kubernetes.interval`` (5 s) it asks the kubelet which container holds
which device (pod-resources ``List``: device-plugin ids and DRA claims, the latter
resolved through the CDI spec files, exporter.attribution.kubernetes.dra) and the container
runtime which pod each running container belongs to (CRI ``ListContainers``; with
``--kubernetes.pod-labels`` also ``ListPodSandbox``), each with a 1 s timeout, and
keeps an immutable ``Attribution`` that labels the merged devices and processes: the
collector gets it in each cycle (``Cycle.enricher``, exporter.sources.base), and also
as the join series (``Cycle.joins``: pod labels, and processes on a GPU their pod was
not given, exporter.attribution.kubernetes.unallocated). It reports no devices of its own.

States (``gpu_exporter_backend_up{backend="kubernetes"}``):
- pod-resources socket absent, refusing or timing out: down with the reason; the
  collector drops the last attribution and reopens every interval, so a kubelet
  restart (socket removed, then created again) recovers on its own;
- CRI socket absent or failing: up; devices keep their pods, processes get none
  until it answers (``cri_unavailable`` counted per cycle, one log line per change).
  The last container map is kept meanwhile: a container id names one container
  for ever, so what it said stays true.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import structlog

from exporter.attribution.kubernetes.attribution import Attribution, check_offered, index_grants
from exporter.attribution.kubernetes.cdi import CdiRegistry
from exporter.attribution.kubernetes.cgroup import ContainerCache
from exporter.attribution.kubernetes.cri import CriClient, find_socket
from exporter.attribution.kubernetes.dra import Claim, NodeResolver, index_claims
from exporter.attribution.kubernetes.podlabels import PodLabels, parse_sandboxes
from exporter.attribution.kubernetes.podresources import PodResourcesClient
from exporter.attribution.kubernetes.rpc import RpcFailed, is_socket
from exporter.core.config import Config
from exporter.core.fs import ProcFS, SysFS
from exporter.core.labels import ErrorReason
from exporter.core.model import DeviceInfo, PodRef
from exporter.sources.base import DERIVED, BackendFailed, BackendUnavailable, Capabilities, Cycle

log = structlog.get_logger(__name__)

_NO_CONTAINERS: Mapping[str, PodRef] = MappingProxyType({})


class KubernetesBackend:
    name = "kubernetes"
    source = "kubelet"  # devices it has none; its allocations carry source="kubelet"
    priority = DERIVED

    def __init__(self, config: Config) -> None:
        self.config = config
        self.interval: float | None = config.kubernetes_interval
        # The collector retries a failed open() this often instead of backing off to a
        # minute: a restarted kubelet is back within one interval.
        self.capabilities = Capabilities(retry_interval=config.kubernetes_interval)
        self.cache = ContainerCache(ProcFS(config.procfs))
        self._kubelet: PodResourcesClient | None = None
        self._cri: CriClient | None = None
        self._cri_path: str | None = None
        self._cri_state = ""  # last CRI problem logged ("" = answering)
        self._containers = _NO_CONTAINERS
        self._pod_uids: Mapping[tuple[str, str], str] = MappingProxyType({})
        self._pod_labels: tuple[PodLabels, ...] = ()
        self._allow = (re.compile(config.kubernetes_pod_labels)
                       if config.kubernetes_pod_labels is not None else None)
        self.cdi = CdiRegistry(config.kubernetes_cdi_spec_dirs)
        self._bad_specs: tuple[str, ...] = ()
        self.resolver = NodeResolver(SysFS(config.sysfs), ProcFS(config.procfs))
        self._pending: Counter[ErrorReason] = Counter()

    def open(self) -> Sequence[DeviceInfo]:
        path = self.config.pod_resources_socket
        if not is_socket(path):
            # The usual cause: a kubelet whose --root-dir is not /var/lib/kubelet (microk8s,
            # k0s): say which setting points elsewhere, here and in the forced-on error.
            raise BackendUnavailable(
                f"kubelet pod-resources socket {path} not found (a kubelet with another "
                "--root-dir serves <root-dir>/pod-resources/kubelet.sock: set "
                "--kubernetes.pod-resources-socket; Helm chart: kubernetes.kubeletRootDir)")
        try:
            kubelet = PodResourcesClient(path)
        except RpcFailed as e:
            raise BackendUnavailable(str(e)) from None
        try:
            offered = kubelet.allocatable()
        except RpcFailed as e:
            if e.code != "UNIMPLEMENTED":  # kubelets before 1.23 lack the call
                kubelet.close()
                raise BackendUnavailable(str(e)) from None
            offered = None
        self._kubelet = kubelet
        self._pending.update(check_offered(offered or {}))
        gpus = {r: len(ids) for r, ids in (offered or {}).items() if r.startswith(
            ("nvidia.com/", "amd.com/", "gpu.intel.com/"))}
        # The Hub logs "backend up" for this open: one line more only where the kubelet
        # says it offers no GPU at all (no device plugin registered yet); a kubelet before
        # 1.23 cannot say (no GetAllocatableResources): its allocations still count.
        if gpus or offered is None:
            log.debug("kubelet pod-resources connected", socket=path, offered=gpus)
        else:
            log.info("kubelet offers no GPU resource", socket=path,
                     hint="no GPU device plugin or DRA driver registered on this node yet")
        return ()

    def sample(self, slow: bool) -> Cycle:
        if self._kubelet is None:
            raise BackendFailed("sampled before open()")
        try:
            grants, claims = self._kubelet.list()
        except RpcFailed as e:
            raise BackendFailed(str(e)) from None
        errors = self._refresh_containers()  # first: the pod UIDs label the allocations
        claimed: list[tuple[tuple[str, str], Claim]] = []
        if claims:  # the spec directories are read only on a node that uses DRA
            errors.update(self._refresh_cdi())
            claimed, dra_errors = index_claims(claims, self.cdi.devices, self.resolver)
            errors.update(dra_errors)
        allocations, grant_errors = index_grants(grants, claimed, self._pod_uids)
        errors.update(grant_errors)
        errors.update(self._pending)
        self._pending.clear()
        self.cache.sweep()
        errors.update(self.cache.take_errors())
        attribution = Attribution(allocations, self._containers, self.cache,
                                  self._pod_labels, self._cri_state == "")
        # It labels the merged devices and processes, and serves the join series: the
        # pod labels, with --kubernetes.pod-labels, and the processes using a GPU their
        # pod was not given.
        return Cycle(devices=(), errors=dict(errors), enricher=attribution, joins=attribution)

    def _refresh_cdi(self) -> Counter[ErrorReason]:
        errors = self.cdi.refresh()
        if self.cdi.bad != self._bad_specs:
            if self.cdi.bad:
                log.warning("CDI spec files unreadable; their devices are not attributed",
                            files=list(self.cdi.bad))
            else:
                log.info("CDI spec files readable again")
            self._bad_specs = self.cdi.bad
        return errors

    def _refresh_containers(self) -> Counter[ErrorReason]:
        """Ask the runtime for its containers; a failure keeps the last map."""
        path = find_socket(self.config.kubernetes_cri_socket)
        if path != self._cri_path:
            self._close_cri()
            self._cri_path = path
        if path is None:
            self._cri_changed("no CRI socket found (set --kubernetes.cri-socket); "
                              "processes are not attributed to pods")
            return Counter()
        try:
            if self._cri is None:
                self._cri = CriClient(path)
            self._containers, self._pod_uids = self._cri.containers()
            errors: Counter[ErrorReason] = Counter()
            if self._allow is not None:
                self._pod_labels, errors = parse_sandboxes(self._cri.sandboxes(), self._allow)
        except RpcFailed as e:
            self._cri_changed(str(e))
            return Counter({ErrorReason.CRI_UNAVAILABLE: 1})
        self._cri_changed("")
        return errors

    def _cri_changed(self, problem: str) -> None:
        if problem == self._cri_state:
            return
        if problem:
            log.warning("CRI runtime not answering", reason=problem)
        else:
            log.info("CRI runtime answering", socket=self._cri_path)
        self._cri_state = problem

    def _close_cri(self) -> None:
        if self._cri is not None:
            self._cri.close()
            self._cri = None

    def close(self) -> None:
        if self._kubelet is not None:
            self._kubelet.close()
            self._kubelet = None
        self._close_cri()
