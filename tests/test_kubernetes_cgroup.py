"""/proc/<pid>/cgroup -> container id and pod UID, on public captures and the k8s-node tree."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from exporter.attribution.kubernetes.cgroup import (
    HOST,
    CgroupRef,
    ContainerCache,
    parse_cgroup,
    parse_start_time,
)
from exporter.core.fs import ProcFS

FIXTURES = Path(__file__).resolve().parent / "fixtures"
NODE_PROC = FIXTURES / "k8s-node" / "proc"

# Paths as captured by others (tests/fixtures/k8s-node/SOURCES.md): falcosecurity/libs
# container_cgroup.cpp and neuvector/neuvector share/system/cgroup_test.go.
FALCO_CONTAINERD_CGROUPFS = (
    "/kubepods/besteffort/podac04f3f2-1f2c-11e9-b015-1ebee232acfa/"
    "605439acbd4fb18c145069289094b17f17e0cfa938f78012d4960bc797305f22")
FALCO_CRIO_CGROUPFS = (
    "/kubepods/besteffort/pod63b3ebfc-2890-11e9-8154-16bf8ef8d9dc/"
    "crio-73bfe475650de66df8e2affdc98d440dcbe84f8df83b6f75a68a82eb7026136a")
FALCO_CRIO_SYSTEMD = (
    "/kubepods.slice/kubepods-besteffort.slice/"
    "kubepods-besteffort-pod63b3ebfc_2890_11e9_8154_16bf8ef8d9dc.slice/"
    "crio-17d8c9eacc629f9945f304d89e9708c0c619649a484a215b240628319548a09f.scope")
FALCO_DOCKER_SYSTEMD = (
    "/docker.slice/docker-7951fb549ab99e0722a949b6c121634e1f3a36b5bacbe5392991e3b12251e6b8.scope")
FALCO_CONTAINERD_COLONS = (
    "/kubepods-burstable-podbd12dd3393227d950605a2444b13c27a.slice:cri-containerd:"
    "d52db56a9c80d536a91354c0951c061187ca46249e64865a12703003d8f42366")
NEUVECTOR_KUBE_PROXY = (
    "/kubepods/besteffort/podf8a694f2-7c08-11e9-98da-000c29077430/"
    "c04e0a88a1de067f25bece337d4dbb897396e0b623c2a65330850fc9823f1903/kube-proxy")
NEUVECTOR_BOTTLEROCKET = (
    "/kubepods.slice/kubepods-besteffort.slice/"
    "kubepods-besteffort-poddd1bf9d1_241d_47f5_8e25_12de83135812.slice/"
    "cri-containerd-f45298cd514d1930c4fe3afc4412e59547f7e3148fddd22ca33cefce046eb830.scope")


@pytest.mark.parametrize(("text", "container", "pod"), [
    (f"0::{FALCO_CONTAINERD_CGROUPFS}\n",
     "605439acbd4fb18c145069289094b17f17e0cfa938f78012d4960bc797305f22",
     "ac04f3f2-1f2c-11e9-b015-1ebee232acfa"),
    (f"0::{FALCO_CRIO_CGROUPFS}\n",
     "73bfe475650de66df8e2affdc98d440dcbe84f8df83b6f75a68a82eb7026136a",
     "63b3ebfc-2890-11e9-8154-16bf8ef8d9dc"),
    (f"0::{FALCO_CRIO_SYSTEMD}\n",
     "17d8c9eacc629f9945f304d89e9708c0c619649a484a215b240628319548a09f",
     "63b3ebfc-2890-11e9-8154-16bf8ef8d9dc"),
    (f"0::{FALCO_DOCKER_SYSTEMD}\n",
     "7951fb549ab99e0722a949b6c121634e1f3a36b5bacbe5392991e3b12251e6b8", None),
    (f"1:name=systemd:{FALCO_CONTAINERD_COLONS}\n",
     "d52db56a9c80d536a91354c0951c061187ca46249e64865a12703003d8f42366",
     "bd12dd3393227d950605a2444b13c27a"),  # a static pod: its UID is a 32-hex hash
    ("3:rdma:/\n2:cpu,cpuacct:" + NEUVECTOR_KUBE_PROXY + "\n1:name=systemd:" +
     NEUVECTOR_KUBE_PROXY + "\n",
     "c04e0a88a1de067f25bece337d4dbb897396e0b623c2a65330850fc9823f1903",
     "f8a694f2-7c08-11e9-98da-000c29077430"),
    (f"11:cpuset:{NEUVECTOR_BOTTLEROCKET}\n10:blkio:{NEUVECTOR_BOTTLEROCKET}\n",
     "f45298cd514d1930c4fe3afc4412e59547f7e3148fddd22ca33cefce046eb830",
     "dd1bf9d1-241d-47f5-8e25-12de83135812"),
    ("12:name=systemd:/docker/31cb02944da7a12196a193cf0e0f6c226d7c453a1db62e65ba98287593a2ee30\n",
     "31cb02944da7a12196a193cf0e0f6c226d7c453a1db62e65ba98287593a2ee30", None),
])
def test_captured_container_paths(text: str, container: str, pod: str | None) -> None:
    assert parse_cgroup(text) == CgroupRef(container, pod)


@pytest.mark.parametrize("text", [
    "13:name=systemd:/\n12:pids:/\n1:cpuset:/",  # neuvector TestHostProcess
    "13:name=systemd:/user/1000.user/c2.session\n12:pids:/\n1:cpuset:/",
    "0::/init.scope\n",
    "0::/system.slice/gpu-exporter.service\n",
    # crio's conmon monitors a container but is not in it
    "0::/system.slice/crio-conmon-17d8c9eacc629f9945f304d89e9708c0c619649a484a215b240628319548a09f.scope\n",
])
def test_host_processes(text: str) -> None:
    assert parse_cgroup(text) == HOST


@pytest.mark.parametrize("text", [
    "",  # a kernel thread's file can be empty
    "garbage without colons\n",
    "0::/kubepods/burstable/pod70565f42-b704-42f2-83fe-1ffb77a67800\n",  # a pod, no container
    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/mystery.scope\n",
])
def test_unknown_formats_give_none(text: str) -> None:
    assert parse_cgroup(text) is None


def test_start_time_survives_a_comm_with_spaces_and_parentheses() -> None:
    line = b"42 (a) b (c)) S 1 42 42 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 98765 0 0\n"
    assert parse_start_time(line) == 98765
    assert parse_start_time(b"42 (short) S 1") is None
    assert parse_start_time(b"") is None


def _expected_node() -> dict[int, tuple[str | None, str | None]]:
    """What the k8s-node builder wrote, re-derived from the file text by plain string work."""
    out: dict[int, tuple[str | None, str | None]] = {}
    for d in NODE_PROC.iterdir():
        text = (d / "cgroup").read_text()
        path = text.splitlines()[-1].split(":", 2)[2]
        last = path.rstrip("/").split("/")
        leaf = last[-2] if last[-1] == "container" else last[-1]
        cid = leaf.removesuffix(".scope").rsplit("-", 1)[-1]
        pod = next((p.split("pod")[-1].removesuffix(".slice").replace("_", "-")
                    for p in path.split("/") if p.startswith("pod") or "-pod" in p), None)
        out[int(d.name)] = (cid if len(cid) == 64 else None, pod)
    return out


def test_every_fixture_process() -> None:
    cache = ContainerCache(ProcFS(NODE_PROC))
    expected = _expected_node()
    assert len(expected) == 15
    for pid, (cid, pod) in expected.items():
        ref = cache.lookup(pid)
        if pid == 7707:  # kubepods path without a container: unknown, counted
            assert ref is None
        elif cid is None:
            assert ref == HOST, pid
        else:
            assert ref == CgroupRef(cid, pod), pid
    assert cache.take_errors() == {"cgroup_format": 1}
    assert cache.take_errors() == {}


def test_cache_reads_once_and_guards_pid_reuse(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    shutil.copytree(NODE_PROC / "7101", proc / "7101")
    cache = ContainerCache(ProcFS(proc))
    first = cache.lookup(7101)
    assert first is not None and first.container_id is not None
    # A changed file is not read again while the process lives: one read per process.
    (proc / "7101" / "cgroup").write_text("0::/user.slice/user-1000.slice/session-3.scope\n")
    cache.sweep()
    assert cache.lookup(7101) == first
    # The pid now belongs to a new process (another start time): the sweep forgets it.
    stat = (proc / "7101" / "stat").read_text().replace(" 107101 ", " 208000 ")
    (proc / "7101" / "stat").write_text(stat)
    cache.sweep()
    assert len(cache) == 0
    assert cache.lookup(7101) == HOST
    # The process exits: forgotten at the next sweep.
    shutil.rmtree(proc / "7101")
    cache.sweep()
    assert len(cache) == 0
    assert cache.lookup(7101) is None
    assert cache.take_errors() == {"cgroup_unreadable": 1}


def test_cache_is_bounded() -> None:
    cache = ContainerCache(ProcFS(NODE_PROC), limit=3)
    for pid in (7101, 7202, 7303, 7404, 7505):
        cache.lookup(pid)
    assert len(cache) == 3
    cache.lookup(7404)  # most recent stays
    cache.lookup(7101)  # evicted earlier, read again, evicts the least recent (7505)
    assert len(cache) == 3
