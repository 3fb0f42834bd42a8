"""CDI spec files and device nodes -> GPU keys (exporter.attribution.kubernetes.cdi, .dra), on real
directory trees: the k8s-dra fixture's specs, the mixed machine's sysfs, a procfs with
the NVIDIA driver's mig-minors table, and MIG devices as the NVIDIA backend makes them."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from exporter.app.flags import load_config
from exporter.attribution.kubernetes.attribution import Attribution, index_grants
from exporter.attribution.kubernetes.cdi import CdiRegistry, parse_spec
from exporter.attribution.kubernetes.cgroup import ContainerCache
from exporter.attribution.kubernetes.dra import (
    NODE,
    PCI,
    Claim,
    NodeResolver,
    claim_keys,
    index_claims,
)
from exporter.attribution.slurm import parse_jobs
from exporter.core.config import Config, ConfigError
from exporter.core.fs import ProcFS, SysFS
from exporter.core.model import PodRef
from exporter.sources.nvidia.backend import NvidiaBackend
from tests.daemon import FIXTURES
from tests.test_nvidia import _load_shim

CDI = FIXTURES / "k8s-dra" / "cdi"
RESOLVER = NodeResolver(SysFS(FIXTURES / "mixed" / "sys"), ProcFS(FIXTURES / "k8s-node"
                                                                   / "proc"))
POD = PodRef("ml", "p", "c")


def registry(tmp_path: Path) -> tuple[CdiRegistry, Path, Path]:
    shutil.copytree(CDI, tmp_path / "cdi")
    etc, run = tmp_path / "cdi" / "etc", tmp_path / "cdi" / "run"
    return CdiRegistry([str(etc), str(run)]), etc, run


def test_json_and_yaml_specs_name_their_device_nodes(tmp_path: Path) -> None:
    reg, _, _ = registry(tmp_path)
    assert not reg.refresh()
    assert reg.devices["intel.com/gpu=0000-09-00-0-0x56a0"] == ("/dev/dri/card2",
                                                                "/dev/dri/renderD130")
    assert reg.devices["k8s.gpu.nvidia.com/device=gpu-1"] == ("/dev/nvidia1",)
    assert reg.devices["k8s.gpu.amd.com/gpu=common"] == ()  # environment only
    # Spec-wide edits (nvidiactl, nvidia-uvm) belong to no device.
    assert all("/dev/nvidiactl" not in nodes for nodes in reg.devices.values())


def test_bad_specs_conflicts_and_precedence(tmp_path: Path) -> None:
    reg, etc, run = registry(tmp_path)
    (etc / "broken.json").write_text('{"kind": "x.com/gpu", "devices": [{"name": 1}]')
    (etc / "not-a-spec.yaml").write_text("- a list\n")
    (etc / "README.txt").write_text("ignored: not .json/.yaml")
    # The same device in both directories: /var/run/cdi (later) wins.
    (etc / "override.yaml").write_text(
        "kind: intel.com/gpu\ndevices:\n- name: dup\n  containerEdits:\n"
        "    deviceNodes: [{path: /dev/dri/card1}]\n")
    (run / "override.json").write_text(
        '{"kind": "intel.com/gpu", "devices": [{"name": "dup", "containerEdits":'
        ' {"deviceNodes": [{"path": "/dev/dri/card2"}]}}]}')
    # Twice in one directory: a conflict, resolved to nothing.
    (run / "twice.json").write_text('{"kind": "v.com/c", "devices": [{"name": "t"}]}')
    (run / "twice2.json").write_text('{"kind": "v.com/c", "devices": [{"name": "t"}]}')
    errors = reg.refresh()
    assert errors == {"cdi_spec_unreadable": 2, "cdi_device_conflict": 1}
    assert sorted(os.path.basename(p) for p in reg.bad) == ["broken.json", "not-a-spec.yaml"]
    assert reg.devices["intel.com/gpu=dup"] == ("/dev/dri/card2",)
    assert "v.com/c=t" not in reg.devices
    # A file is re-read when it changes; a removed one takes its devices with it.
    (run / "override.json").unlink()
    (etc / "broken.json").write_text('{"kind": "x.com/gpu", "devices": [{"name": "ok"}]}')
    assert reg.refresh() == {"cdi_spec_unreadable": 1, "cdi_device_conflict": 1}
    assert reg.devices["intel.com/gpu=dup"] == ("/dev/dri/card1",)
    assert reg.devices["x.com/gpu=ok"] == ()


def test_parse_spec_never_raises() -> None:
    for text in ("", "{", "kind: 3", "kind: a/b\ndevices: 7", "\x00\xff", "[1, 2]",
                 "kind: a/b\ndevices: [{name: x, containerEdits: {deviceNodes: [{}]}}]"):
        assert parse_spec(text) is None


def keys(*nodes: str) -> tuple[set[tuple[str, str]], dict[str, int]]:
    got, errors = claim_keys(Claim(POD, "ml/c", "d", ("v.com/c=x",)), {"v.com/c=x": nodes},
                             RESOLVER.key)
    return got, dict(errors)


def test_device_nodes_name_one_gpu_or_are_counted() -> None:
    assert keys("/dev/nvidia1", "/dev/nvidiactl") == ({(NODE, "nvidia1")}, {})
    # nvcdi lists an NVIDIA GPU's DRM nodes too: /dev/nvidia<minor> decides.
    assert keys("/dev/nvidia0", "/dev/dri/card0", "/dev/dri/renderD129") == (
        {(NODE, "nvidia0")}, {})
    assert keys("/dev/kfd", "/dev/dri/renderD128") == ({(PCI, "0000:03:00.0")}, {})
    assert keys("/dev/dri/card2", "/dev/dri/renderD130") == ({(PCI, "0000:09:00.0")}, {})
    # Nodes of two GPUs in one device: shared, never guessed.
    assert keys("/dev/dri/renderD128", "/dev/dri/renderD130") == (
        set(), {"dra_device_shared": 1})
    # A DRM node sysfs does not know, a MIG capability: counted.
    assert keys("/dev/dri/renderD200") == (set(), {"dra_device_node_unknown": 1})
    assert keys("/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap30") == (
        set(), {"dra_device_node_unknown": 1})
    # Another kind of device (a NIC): not a GPU, nothing counted.
    assert keys("/dev/infiniband/uverbs0") == (set(), {})


def test_slurm_job_files_parse() -> None:
    assert parse_jobs("4242\n 4243 \n\n4242\n") == ("4242", "4243")
    assert parse_jobs("x" * 200 + "\n7\n") == ("7",)
    assert parse_jobs("") == ()


def test_the_flags_parse_and_a_bad_regex_is_a_config_error() -> None:
    config = load_config(["--kubernetes.cdi-spec-dirs", "/a,/b/", "--kubernetes.pod-labels",
                          r"team|app\.kubernetes\.io/.*", "--slurm.job-mapping-dir", "/run/j"],
                         {})
    assert config.kubernetes_cdi_spec_dirs == ("/a", "/b/")
    assert config.kubernetes_pod_labels == r"team|app\.kubernetes\.io/.*"
    assert config.slurm_job_mapping_dir == "/run/j"
    assert load_config([], {}).kubernetes_cdi_spec_dirs == ("/etc/cdi", "/var/run/cdi")
    with pytest.raises(ConfigError, match="kubernetes.pod-labels: not a regular expression"):
        load_config(["--kubernetes.pod-labels", "team("], {})


def test_a_dra_mig_device_carries_its_pod_not_its_parent(tmp_path: Path) -> None:
    # The MIG devices as the NVIDIA backend makes them (nvidia-h100-mig through the NVML
    # fake); the capability minors as the driver lists them in mig-minors.
    root = FIXTURES / "nvidia-h100-mig"
    backend = NvidiaBackend(Config(procfs=str(root / "proc")),
                            nvml=_load_shim().build(json.loads((root / "nvml.json").read_text())))
    backend.open()
    parent, *instances = [d.info for d in backend.sample(slow=True).devices]
    backend.close()
    target = next(i for i in instances if i.slice_labels["gpu_instance_id"] == "9")
    minor, ci = parent.device_node.removeprefix("nvidia"), target.slice_labels[
        "compute_instance_id"]
    caps = tmp_path / "proc" / "driver" / "nvidia-caps"
    caps.mkdir(parents=True)
    (caps / "mig-minors").write_text(
        "config 1\nmonitor 2\n" + "".join(
            f"gpu{minor}/gi{g}/access {10 * g}\ngpu{minor}/gi{g}/ci{ci}/access {10 * g + 1}\n"
            for g in range(15)))
    claimed = Claim(POD, "ml/mig", "gpu.nvidia.com", ("k8s.gpu.nvidia.com/device=mig",))
    spec = {"k8s.gpu.nvidia.com/device=mig": (f"/dev/nvidia{minor}", "/dev/nvidiactl",
                                              "/dev/nvidia-caps/nvidia-cap90",
                                              "/dev/nvidia-caps/nvidia-cap91")}
    resolver = NodeResolver(SysFS(FIXTURES / "mixed" / "sys"), ProcFS(tmp_path / "proc"))
    keyed, errors = index_claims([claimed], spec, resolver)
    assert not errors
    index, _ = index_grants((), keyed)
    attribution = Attribution(index, {}, ContainerCache(ProcFS(tmp_path / "proc")))
    assert [(a.pod, a.claim) for a in attribution.allocations(target)] == [(POD, "ml/mig")]
    assert attribution.allocations(parent) == ()
    assert all(attribution.allocations(i) == () for i in instances if i is not target)
    # Without mig-minors (or without the compute instance's capability): counted.
    bare = NodeResolver(SysFS(FIXTURES / "mixed" / "sys"), ProcFS(tmp_path / "nothing"))
    assert index_claims([claimed], spec, bare) == ([], {"dra_device_node_unknown": 2})
    gi_only = {"k8s.gpu.nvidia.com/device=mig": (f"/dev/nvidia{minor}",
                                                  "/dev/nvidia-caps/nvidia-cap90")}
    assert index_claims([claimed], gi_only, resolver) == ([], {"dra_device_node_unknown": 1})


def big_json_spec(devices: int, pad: int = 0) -> str:
    """A spec in the NVIDIA DRA driver's device-spec shape (json.dumps, not ours)."""
    return json.dumps({"cdiVersion": "0.5.0", "kind": "k8s.gpu.nvidia.com/device",
                       "devices": [{"name": f"gpu-{i}" + "x" * pad, "containerEdits": {
                           "deviceNodes": [{"path": f"/dev/nvidia{i % 8}"}]}}
                                   for i in range(devices)]})


def test_a_spec_over_the_bound_is_refused_and_counted_once(tmp_path: Path) -> None:
    from exporter.attribution.kubernetes import cdi

    run = tmp_path / "run"
    run.mkdir()
    # Over the byte cap: refused on its stat, one error, no device kept.
    text = big_json_spec(100, pad=cdi.MAX_JSON_BYTES // 100)
    assert len(text) > cdi.MAX_JSON_BYTES
    (run / "big.json").write_text(text)
    # Under the byte cap but over the device cap.
    many = big_json_spec(cdi.MAX_SPEC_DEVICES + 1)
    assert len(many) < cdi.MAX_JSON_BYTES
    (run / "many.json").write_text(many)
    # A YAML spec still works, next to them; a good JSON one too.
    (run / "intel.yaml").write_text((CDI / "etc" / "intel.com-gpu.yaml").read_text())
    (run / "ok.json").write_text(big_json_spec(8))
    reg = CdiRegistry([str(run)])
    assert reg.refresh() == {"cdi_spec_too_large": 2}  # one per refused file
    assert sorted(os.path.basename(p) for p in reg.bad) == ["big.json", "many.json"]
    assert not any(name.startswith("k8s.gpu.nvidia.com/device=gpu-9") for name in reg.devices)
    assert reg.devices["k8s.gpu.nvidia.com/device=gpu-7"] == ("/dev/nvidia7",)
    assert reg.devices["intel.com/gpu=0000-09-00-0-0x56a0"] == ("/dev/dri/card2",
                                                                "/dev/dri/renderD130")
    # Unchanged files are not read again: their stamps decide (a refused one stays
    # refused, one error per refresh, never parsed twice).
    calls: list[str] = []
    real = cdi.parse_spec

    def counting(text: str, json_text: bool = False) -> dict[str, tuple[str, ...]] | None:
        calls.append(text[:20])
        return real(text, json_text)

    cdi.parse_spec = counting  # type: ignore[assignment]
    try:
        assert reg.refresh() == {"cdi_spec_too_large": 2}
        assert calls == []
        (run / "ok.json").write_text(big_json_spec(4))  # changed: read once
        reg.refresh()
        assert len(calls) == 1
    finally:
        cdi.parse_spec = real
    assert "k8s.gpu.nvidia.com/device=gpu-7" not in reg.devices


def test_json_is_parsed_as_json_and_yaml_as_yaml() -> None:
    from exporter.attribution.kubernetes import cdi

    # YAML-only syntax in a .json file is malformed JSON: no YAML fallback.
    yaml_text = "kind: v.com/c\ndevices:\n- name: a\n"
    assert parse_spec(yaml_text, json_text=True) is None
    assert parse_spec(yaml_text) == {"v.com/c=a": ()}
    # JSON is YAML too: a .yaml file holding JSON still parses.
    assert parse_spec('{"kind": "v.com/c", "devices": [{"name": "a"}]}') == {"v.com/c=a": ()}
    assert parse_spec("[" * 100_000, json_text=True) is None  # too deep: malformed, no raise
    assert cdi.LIBYAML  # PyYAML's wheels carry libyaml; the image installs the wheel


@pytest.mark.slow
def test_the_registry_keeps_at_most_its_total_of_devices(tmp_path: Path) -> None:
    from exporter.attribution.kubernetes import cdi

    run = tmp_path / "run"
    run.mkdir()
    per_file = cdi.MAX_SPEC_DEVICES
    files = cdi.MAX_TOTAL_DEVICES // per_file + 1
    for n in range(files):  # each within the per-file caps; together one file too many
        doc = json.loads(big_json_spec(per_file))
        doc["kind"] = f"v{n}.example.com/gpu"
        (run / f"spec{n:02d}.json").write_text(json.dumps(doc))
    reg = CdiRegistry([str(run)])
    assert reg.refresh() == {"cdi_spec_too_large": 1}
    assert len(reg.devices) == cdi.MAX_TOTAL_DEVICES
    assert [os.path.basename(p) for p in reg.bad] == [f"spec{files - 1:02d}.json"]
    assert not any(k.startswith(f"v{files - 1}.example.com/") for k in reg.devices)


def aliased_yaml_spec(devices: int, nodes: int, one_node: bool = False) -> str:
    """Every device's deviceNodes an alias of the first device's list of ``nodes``
    (``one_node``: each of them an alias of the first)."""
    listed = ", ".join(f"{{path: /dev/nvidia{i % 8}}}" for i in range(nodes))
    if one_node:
        listed = ", ".join(["&p {path: /dev/nvidia0}"] + ["*p"] * (nodes - 1))
    return "\n".join([
        "cdiVersion: 0.5.0", "kind: k8s.gpu.nvidia.com/device", "devices:",
        f"- {{name: g0, containerEdits: {{deviceNodes: &n [{listed}]}}}}",
        *(f"- {{name: g{d}, containerEdits: {{deviceNodes: *n}}}}" for d in range(1, devices)),
    ]) + "\n"


@pytest.mark.slow  # takes seconds
def test_yaml_aliases_that_expand_past_gos_bound_are_refused(tmp_path: Path) -> None:
    from exporter.attribution.kubernetes import cdi

    run = tmp_path / "run"
    run.mkdir()
    # 4,096 devices x 30,000 nodes: 123 million node paths in 320 KiB, under every cap.
    amplified = aliased_yaml_spec(cdi.MAX_SPEC_DEVICES, 30_000, one_node=True)
    assert len(amplified) < 330 * 1024 < cdi.MAX_YAML_BYTES
    (run / "amplified.yaml").write_text(amplified)
    # A billion laughs beside a well-formed spec: 9 levels of 9 aliases each.
    laughs = ["x-laughs:", "  l0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    laughs += [f"  l{k}: &a{k} [" + ", ".join([f"*a{k - 1}"] * 9) + "]" for k in range(1, 9)]
    (run / "laughs.yaml").write_text("\n".join(laughs) + "\n" + aliased_yaml_spec(2, 1))
    # An anchor that holds itself.
    (run / "itself.yaml").write_text(
        "kind: v.com/c\ndevices: &d [{name: a, containerEdits: {deviceNodes: *d}}]\n")
    # A few aliases, as a hand-written spec may use them: read as written.
    (run / "shared.yaml").write_text(aliased_yaml_spec(50, 3).replace("k8s.gpu.nvidia.com",
                                                                      "shared.example.com"))
    reg = CdiRegistry([str(run)])
    assert reg.refresh() == {"cdi_spec_too_large": 3}
    assert sorted(os.path.basename(p) for p in reg.bad) == \
        ["amplified.yaml", "itself.yaml", "laughs.yaml"]
    assert len(reg.devices) == 50
    assert reg.devices["shared.example.com/device=g49"] == ("/dev/nvidia0", "/dev/nvidia1",
                                                             "/dev/nvidia2")


@pytest.mark.slow  # takes seconds
def test_the_alias_bound_is_gos_ratio() -> None:
    """go-yaml's decode.go: refused once more than 100 of more than 1,000 decoded nodes
    came from aliases and their share passes allowedAliasRatio (99 %, sliding to 10 %)."""
    from exporter.attribution.kubernetes import cdi

    assert cdi.allowed_alias_ratio(1000) == cdi.allowed_alias_ratio(400_000) == 0.99
    assert cdi.allowed_alias_ratio(2_200_000) == pytest.approx(0.545)
    assert cdi.allowed_alias_ratio(4_000_000) == cdi.allowed_alias_ratio(10**9) == 0.10
    # A device is 7 nodes of its own; each alias of the list of E entries ({path: p}: 3
    # nodes each) decodes 3E + 1 nodes of the anchor's tree.
    # 10 aliases of 100 entries: 3,010 of 3,394 nodes aliased (88.7 %): accepted.
    assert len(parse_spec(aliased_yaml_spec(11, 100)) or {}) == 11
    # 1 alias of 30,000 entries: half of the 180,000 nodes: accepted.
    assert len(parse_spec(aliased_yaml_spec(2, 30_000)) or {}) == 2
    # 299 aliases of 1,000 entries: 897,299 of 902,400 (99.4 %): refused.
    with pytest.raises(cdi.SpecTooLarge):
        parse_spec(aliased_yaml_spec(300, 1000))
