"""DRA-allocated GPUs, pod labels and Slurm jobs on a running daemon: the fake kubelet
serves ``dynamic_resources`` (tests/fixtures/k8s-dra/kubelet.json), CDI spec files in
the NVIDIA, AMD and Intel drivers' shapes sit in copies of /etc/cdi and /var/run/cdi,
the mixed machine's sysfs and NVML fake give DRM nodes and minor numbers. What each
claim should resolve to is derived here from the fixture files (spec files, sysfs
links, nvml.json), not from the exporter's code. Specs and Slurm mapping files change
under the running daemon.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from test_golden import normalize

from tests.daemon import FIXTURES, REPO, Daemon, fixture_ids, promtool_check, running
from tests.fakes.kubelet import FakeKubelet, FakeRuntime, Node

DRA = FIXTURES / "k8s-dra"
NODE_DIR = FIXTURES / "k8s-node"
MIXED_SYS = FIXTURES / "mixed" / "sys"
POD_LABELS = r"team|app\.kubernetes\.io/name"
GOLDEN = REPO / "tests" / "golden" / "k8s-dra.prom"
ONE_CYCLE = ["--collector.interval", "1h", "--collector.slow-interval", "1h",
             "--collector.processes.interval", "1h", "--kubernetes.interval", "1h"]
Labels = dict[str, str]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Path]]:
    tmp = tmp_path_factory.mktemp("dra")
    shutil.copytree(DRA / "cdi", tmp / "cdi")
    (tmp / "slurm").mkdir()
    (tmp / "slurm" / "3").write_text("4242\n")
    scenario = Node.load(DRA / "kubelet.json")
    with FakeKubelet(tmp / "kubelet.sock", scenario) as kubelet, \
            FakeRuntime(tmp / "containerd.sock", scenario) as runtime:
        args = ["--path.sysfs", str(MIXED_SYS), "--path.procfs", str(NODE_DIR / "proc"),
                *fixture_ids(MIXED_SYS.parent),
                "--kubernetes.pod-resources-socket", str(kubelet.socket),
                "--kubernetes.cri-socket", str(runtime.socket),
                "--kubernetes.cdi-spec-dirs", f"{tmp / 'cdi' / 'etc'},{tmp / 'cdi' / 'run'}",
                "--kubernetes.pod-labels", POD_LABELS, "--kubernetes.device-labels",
                "--slurm.job-mapping-dir", str(tmp / "slurm"),
                "--kubernetes.interval", "300ms", "--collector.slow-interval", "300ms",
                "--collector.processes.interval", "1h"]
        with running(args, tmp, nvml_json=NODE_DIR / "nvml.json") as daemon:
            yield daemon, tmp


@pytest.mark.golden
def test_golden_and_promtool(tmp_path: Path) -> None:
    """One cycle of everything (DRA, pod labels, a Slurm job): byte-stable output."""
    shutil.copytree(DRA / "cdi", tmp_path / "cdi")
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "3").write_text("4242\n")
    scenario = Node.load(DRA / "kubelet.json")
    with FakeKubelet(tmp_path / "kubelet.sock", scenario) as kubelet, \
            FakeRuntime(tmp_path / "containerd.sock", scenario) as runtime:
        args = ["--path.sysfs", str(MIXED_SYS), "--path.procfs", str(NODE_DIR / "proc"),
                *fixture_ids(MIXED_SYS.parent),
                "--kubernetes.pod-resources-socket", str(kubelet.socket),
                "--kubernetes.cri-socket", str(runtime.socket),
                "--kubernetes.cdi-spec-dirs",
                f"{tmp_path / 'cdi' / 'etc'},{tmp_path / 'cdi' / 'run'}",
                "--kubernetes.pod-labels", POD_LABELS,
                "--slurm.job-mapping-dir", str(tmp_path / "slurm"), *ONE_CYCLE]
        with running(args, tmp_path, nvml_json=NODE_DIR / "nvml.json") as daemon:
            text = daemon.get().text
    got = normalize(text)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(got)
    assert got == GOLDEN.read_text(), f"/metrics differs from {GOLDEN}"
    result = promtool_check(text)
    assert result.returncode == 0, result.stdout + result.stderr


def series(daemon: Daemon, name: str) -> list[tuple[Labels, float]]:
    text = daemon.get().text
    return [(dict(s.labels), s.value) for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name]


def eventually(daemon: Daemon, name: str, check: Callable[[list[tuple[Labels, float]]], bool],
               timeout: float = 15.0) -> list[tuple[Labels, float]]:
    deadline = time.monotonic() + timeout
    while True:
        got = series(daemon, name)
        if check(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


# -- the truth, from the fixture files ---------------------------------------------------

def spec_nodes() -> dict[str, list[str]]:
    """Qualified CDI name -> device node paths, from the spec files (JSON and YAML)."""
    out = {}
    for path in sorted((DRA / "cdi").rglob("*.*")):
        if path.suffix not in (".json", ".yaml"):
            continue
        doc = json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(
            path.read_text())
        for device in doc["devices"]:
            nodes = device.get("containerEdits", {}).get("deviceNodes", [])
            out[f"{doc['kind']}={device['name']}"] = [n["path"] for n in nodes]
    return out


def uuid_of_node(path: str, uuid_of_pci: dict[str, str]) -> str | None:
    name = os.path.basename(path)
    if path.startswith("/dev/nvidia") and name[len("nvidia"):].isdigit():
        gpus = json.loads((NODE_DIR / "nvml.json").read_text())["gpus"]
        return next(str(g["uuid"]) for g in gpus if g["minor"] == int(name[len("nvidia"):]))
    if path.startswith("/dev/dri/"):
        return uuid_of_pci[os.path.basename(os.path.realpath(MIXED_SYS / "class" / "drm"
                                                            / name / "device"))]
    return None


def expected(uuid_of_pci: dict[str, str]) -> set[tuple[str, ...]]:
    """(uuid, namespace, pod, container, driver, claim, pod uid) of every claimed GPU."""
    nodes = spec_nodes()
    out = set()
    for pod in json.loads((DRA / "kubelet.json").read_text())["pods"]:
        for c in pod["containers"]:
            for claim in c["claims"]:
                for device in claim["devices"]:
                    paths = [p for name in device["cdi"] for p in nodes.get(name, [])]
                    if not paths or any("nvidia-caps" in p for p in paths):
                        continue  # no spec, or a MIG slice: counted, not mapped
                    nvidia = [p for p in paths if p.startswith("/dev/nvidia")]
                    uuids = {uuid_of_node(p, uuid_of_pci) for p in nvidia or paths} - {None}
                    assert len(uuids) == 1, (pod["name"], uuids)
                    out.add((uuids.pop(), pod["namespace"], pod["name"], c["name"],
                             device["driver"], f"{claim['namespace']}/{claim['name']}",
                             pod["uid"]))
    return out


def gpus(daemon: Daemon) -> dict[str, Labels]:
    """uuid -> gpu_info labels."""
    return {labels["uuid"]: labels for labels, _ in series(daemon, "gpu_info")}


def allocations(got: list[tuple[Labels, float]]) -> set[tuple[str, ...]]:
    return {tuple(labels[k] for k in ("uuid", "namespace", "pod", "container", "resource",
                                      "claim", "pod_uid")) for labels, _ in got}


# -- tests (module order: the last ones change files under the daemon) ------------------

def test_each_vendors_dra_gpu_carries_its_pods(node: tuple[Daemon, Path]) -> None:
    daemon, _ = node
    uuid_of_pci = {labels["pci_bus_id"]: uuid for uuid, labels in gpus(daemon).items()}
    want = expected(uuid_of_pci)
    got = eventually(daemon, "gpu_kubernetes_allocation_info",
                     lambda g: allocations(g) == want)
    assert allocations(got) == want
    vendors = {gpus(daemon)[a[0]]["vendor"] for a in want}
    assert vendors == {"nvidia", "amd", "intel"}
    shared = [a for a in want if a[5] == "ml/shared-gpu"]
    assert {a[2] for a in shared} == {"dra-train-0", "dra-eval-0"}  # one claim, two pods
    assert len({a[0] for a in shared}) == 1


def test_device_labels_follow_dra_allocations(node: tuple[Daemon, Path]) -> None:
    daemon, _ = node
    info = gpus(daemon)
    by_vendor = {labels["vendor"]: labels for labels in info.values() if labels["gpu"] != "1"}
    # An exclusively claimed GPU carries its pod; the GPU two pods share carries none.
    assert by_vendor["amd"]["pod"] == "dra-detect-0"
    assert by_vendor["intel"]["pod"] == "dra-transcode-0"
    shared_gpu = next(labels for labels in info.values() if labels["gpu"] == "3")
    assert "pod" not in shared_gpu


def test_unmappable_claims_are_counted_not_guessed(node: tuple[Daemon, Path]) -> None:
    daemon, _ = node
    errors = {labels["reason"]: value for labels, value in
              series(daemon, "gpu_exporter_collection_errors_total")
              if labels["backend"] == "kubernetes"}
    assert errors["cdi_device_unknown"] >= 2  # dra-pending-0's and the NIC's names
    assert errors["dra_device_node_unknown"] >= 2  # the MIG slice's two capability nodes
    pods = {labels["pod"] for labels, _ in series(daemon, "gpu_kubernetes_allocation_info")}
    assert pods.isdisjoint({"dra-mig-0", "dra-pending-0", "rdma-0"})


def test_pod_labels_are_joinable(node: tuple[Daemon, Path]) -> None:
    daemon, _ = node
    got = {(labels["namespace"], labels["pod"]): {k: v for k, v in labels.items()
                                                   if k.startswith("label_")}
           for labels, _ in series(daemon, "gpu_kubernetes_pod_labels_info")}
    want = {}
    for pod in json.loads((DRA / "kubelet.json").read_text())["pods"]:
        chosen = {"label_" + k.replace(".", "_").replace("/", "_"): v
                  for k, v in pod.get("labels", {}).items()
                  if k in ("team", "app.kubernetes.io/name")}
        if chosen:
            want[(pod["namespace"], pod["name"])] = chosen
    assert got == want
    assert got[("ml", "dra-train-0")] == {"label_team": "nlp",
                                          "label_app_kubernetes_io_name": "trainer"}


def test_slurm_job_files_are_followed_while_running(node: tuple[Daemon, Path]) -> None:
    daemon, tmp = node
    slurm = tmp / "slurm"

    def jobs(got: list[tuple[Labels, float]]) -> set[tuple[str, str]]:
        return {(labels["gpu"], labels["job"]) for labels, _ in got}

    got = eventually(daemon, "gpu_slurm_job_info", lambda g: jobs(g) == {("3", "4242")})
    assert jobs(got) == {("3", "4242")}
    uuid = gpus(daemon)
    assert {labels["uuid"] for labels, _ in got} == {
        u for u, labels in uuid.items() if labels["gpu"] == "3"}
    (slurm / "0").write_text("5001\n5002\n\n")  # appears: two jobs on gpu 0
    (slurm / "3").write_text("4242\n4300\n")  # changes
    want = {("0", "5001"), ("0", "5002"), ("3", "4242"), ("3", "4300")}
    assert jobs(eventually(daemon, "gpu_slurm_job_info", lambda g: jobs(g) == want)) == want
    (slurm / "3").unlink()  # vanishes (the epilog)
    want = {("0", "5001"), ("0", "5002")}
    assert jobs(eventually(daemon, "gpu_slurm_job_info", lambda g: jobs(g) == want)) == want


def test_a_spec_removed_while_running_drops_its_claim(node: tuple[Daemon, Path]) -> None:
    daemon, tmp = node
    (tmp / "cdi" / "run" / "k8s.gpu.amd.com-gpu_8f2b1c3d-0000-4000-8000-00000000c003.json"
     ).unlink()
    got = eventually(daemon, "gpu_kubernetes_allocation_info",
                     lambda g: "dra-detect-0" not in {labels["pod"] for labels, _ in g})
    pods = {labels["pod"] for labels, _ in got}
    assert "dra-detect-0" not in pods
    assert {"dra-train-0", "dra-eval-0", "dra-transcode-0"} <= pods
