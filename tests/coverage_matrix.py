"""docs/coverage.md from the golden outputs: which family each vendor and source fills, and
the values each label takes.

    python -m tools.metricsdoc   (writes it, with every other generated doc)

Read from tests/golden/*.prom (every fixture machine's real /metrics) with
prometheus-client's parser, so the page says what the exporter serves on those machines,
no more; tests/test_docs_coverage.py fails when the page and the goldens disagree.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Callable
from functools import cache
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

GOLDEN = Path(__file__).resolve().parent / "golden"
# Columns: the (vendor, source) pairs of the backends. Other sources (health verdicts,
# kubelet/CRI/Slurm joins) are listed per family in the last column.
COLUMNS = [("nvidia", "nvml"), ("nvidia", "nvml_gpm"), ("amd", "sysfs"), ("amd", "amdsmi"),
           ("amd", "fdinfo"), ("intel", "sysfs"), ("intel", "pmu"), ("intel", "level_zero"),
           ("intel", "fdinfo"), ("apple", "macmon")]
# Labels whose values are identities or free text: described, not listed.
FREE = {
    "gpu": "the exporter's GPU index, `0`, `1`, ...",
    "uuid": "the GPU's UUID (NVML, amdsmi, Level Zero), else `pci-<bus id>`",
    "pci_bus_id": "PCI bus id, `0000:03:00.0`",
    "name": "product name; AMD without one: `AMD 0x<device id>`",
    "serial": "board serial, or empty", "vbios_version": "firmware version, or empty",
    "driver_version": "driver version, or empty",
    "compute_capability": "NVIDIA CUDA compute capability, `8.9`, or empty",
    "pid": "process id", "process": "process name (comm)",
    "pod": "pod name", "namespace": "pod namespace", "container": "container name",
    "pod_uid": "pod UID", "claim": "DRA resource claim name",
    "job": "Slurm job id", "version": "exporter version", "python_version": "Python version",
    "link": "NVLink / XGMI link number", "le": "histogram bucket bound",
    "gpu_instance_id": "MIG GPU instance id", "compute_instance_id": "MIG compute instance id",
    "partition_id": "AMD partition index", "remote": "the GPU or switch at a link's far end",
    "xid": "NVIDIA XID number", "fan": "fan index",
    "meaning": "what the XID means in NVIDIA's catalogue, or `unknown` (vendors-nvidia.md)",
}
FREE_PREFIX = ("label_",)  # pod labels, named by --kubernetes.pod-labels


@cache  # one parse of the goldens per test run (the docs tests read them several times)
def _samples() -> list[tuple[str, dict[str, str]]]:
    """(family, labels) of every gpu_* sample, vendor filled in from the golden's gpu_info."""
    out = []
    for path in sorted(GOLDEN.glob("*.prom")):
        families = list(text_string_to_metric_families(path.read_text()))
        vendors = {s.labels.get("gpu"): s.labels.get("vendor", "") for f in families
                   if f.name == "gpu_info" for s in f.samples}
        for family in families:
            if not family.name.startswith("gpu_"):
                continue
            # The parser names a counter's family without _total; the docs use the served name.
            name = family.name + ("_total" if family.type == "counter" else "")
            for sample in family.samples:
                labels = dict(sample.labels)
                labels.setdefault("vendor", vendors.get(labels.get("gpu"), ""))
                out.append((name, labels))
    return out


def matrix() -> str:
    filled: dict[str, set[tuple[str, str]]] = defaultdict(set)
    joined: dict[str, set[str]] = defaultdict(set)  # families of the joins (health, pods)
    for family, labels in _samples():
        source = labels.get("source", "")
        if family.startswith("gpu_exporter_") or not source:
            continue
        if (labels.get("vendor", ""), source) in COLUMNS:
            filled[family].add((labels["vendor"], source))
        else:
            joined[family].add(source)
    lines = ["| family | " + " | ".join(f"{v} `{s}`" for v, s in COLUMNS) + " | other |",
             "|---|" + "---|" * (len(COLUMNS) + 1)]
    for family in sorted(set(filled) | set(joined)):
        marks = ["✓" if c in filled[family] else "" for c in COLUMNS]
        other = ", ".join(f"`{s}`" for s in sorted(joined[family]))
        lines.append(f"| `{family}` | " + " | ".join(marks) + f" | {other} |")
    return "\n".join(lines)


ENGINE_FAMILIES = ("gpu_engine_utilization_ratio", "gpu_engine_busy_seconds_total",
                   "gpu_process_engine_busy_seconds_total")


def engines() -> str:
    """The ``engine`` values each (vendor, source) serves, per engine family."""
    seen: dict[tuple[str, str], dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for family, labels in _samples():
        if family in ENGINE_FAMILIES and "engine" in labels:
            seen[(labels.get("vendor", ""), labels.get("source", ""))][family].add(
                labels["engine"])
    lines = ["| vendor `source` | " + " | ".join(f"`{f}`" for f in ENGINE_FAMILIES) + " |",
             "|---|" + "---|" * len(ENGINE_FAMILIES)]
    for vendor, source in sorted(seen):
        cells = [", ".join(f"`{e}`" for e in sorted(seen[(vendor, source)][f]))
                 for f in ENGINE_FAMILIES]
        lines.append(f"| {vendor} `{source}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def label_values() -> str:
    values: dict[str, set[str]] = defaultdict(set)
    for _, labels in _samples():
        for name, value in labels.items():
            values[name].add(value)
    lines = ["| label | values |", "|---|---|"]
    for name in sorted(values):
        if name in FREE:
            text = FREE[name]
        elif name.startswith(FREE_PREFIX):
            text = "a pod label's value"
        else:
            text = ", ".join(f"`{v}`" for v in sorted(values[name]) if v) or "(empty)"
        lines.append(f"| `{name}` | {text} |")
    return "\n".join(lines)


def page() -> str:
    return f"""# Coverage: which source fills which family

Generated from the golden outputs of the test fixture machines (`python -m
tests.coverage_matrix > docs/coverage.md`; a test fails when it is out of date). A mark
means at least one fixture machine of that vendor serves the family with that `source`
label; an empty cell means no fixture does (the hardware or driver has no such value, or
the exporter does not read it from that source). "other" names the sources that join
other data to a GPU (health verdicts, Kubernetes, Slurm). `gpu_exporter_*` self-metrics
are left out: every backend has them. The series are documented in [metrics.md](metrics.md).

{matrix()}

## Profiling (the `nvml_gpm` column)

`gpu_sm_active_ratio`, `gpu_sm_occupancy_ratio`, `gpu_tensor_active_ratio`,
`gpu_dram_active_ratio`, `gpu_graphics_engine_active_ratio` and the `gpu_fp*_active_ratio`
families come from NVML's GPM, which NVIDIA GPUs have from Hopper on. On Volta to Ada these
counters exist only through DCGM's profiling module (the `DCGM_FI_PROF_*` fields of
dcgm-exporter, read by NVIDIA's host engine), which this exporter does not use: there is no
series for them on those GPUs, and none on AMD, Intel or Apple. What is served instead:
`gpu_utilization_ratio` (the time a kernel ran), `gpu_memory_utilization_ratio` (the
memory controller's busy time), `gpu_engine_utilization_ratio` and the per-process SM
utilisation; in dcgm mode `DCGM_FI_PROF_GR_ENGINE_ACTIVE` is filled from the closest of
them, labelled with its `source` ([dcgm-compat.md](dcgm-compat.md)).

## Engines

Each source names engines as its driver or library does, mapped onto one vocabulary:
`gfx`/`render` (3D and general work; amdgpu calls it gfx, i915/xe render), `compute`,
`copy`/`dma` (copy engines; amdgpu calls them dma, i915/xe copy), `decoder`, `encoder`,
`video` (a combined media engine where the source does not split decode and encode),
`video_enhance`, `jpeg`, `ofa` (NVIDIA optical flow). The table shows which names each
source serves, and in which family.

A time counter (`gpu_engine_busy_seconds_total`) exists only where the source counts
busy time; the exporter does not invent one by integrating samples. amdgpu's sysfs gives
`gpu_busy_percent`, a sample with no counter behind it, so AMD's device-level `gfx` has a
utilisation and no busy counter. The fdinfo sum of `gfx` time is not served beside it:
one engine has one source in both engine families, so a driver's own figure and a sum of
its clients never disagree on one dashboard. The time each process spent on `gfx` is in
`gpu_process_engine_busy_seconds_total` (`fdinfo`). NVML's encoder, decoder, JPEG and OFA
utilisations are samples too: no counter for them either.

{engines()}

## Label values

The values each label takes on the fixture machines. Labels marked as identities or
free text take one value per GPU, process or pod.

{label_values()}
"""


# -- docs/cardinality.md's two tables -------------------------------------------------------
NODES, GPUS = 1000, 8  # the fleet the second table sizes
PROCESSES = (0, 4, 64)  # its columns: processes per GPU


def series_counts(machine: str) -> tuple[int, int]:
    """(series of the largest GPU, series of the largest process) of a golden's ``gpu_*``
    families (the exporter's own left out)."""
    per_gpu: dict[str, int] = defaultdict(int)
    per_process: dict[tuple[str, str], int] = defaultdict(int)
    for family in text_string_to_metric_families((GOLDEN / f"{machine}.prom").read_text()):
        for s in family.samples:
            if not s.name.startswith("gpu_") or s.name.startswith("gpu_exporter_"):
                continue
            if "pid" in s.labels:
                per_process[(s.labels["gpu"], s.labels["pid"])] += 1
            else:
                per_gpu[s.labels.get("gpu", "")] += 1
    return max(per_gpu.values()), max(per_process.values(), default=0)


def _table_rows(text: str, header: str, row: Callable[[str, list[str]], list[str]]) -> str:
    """``text`` with each row of the table after ``header`` rewritten by ``row(machine,
    cells)``: the machine names (first column) and any text cells stay."""
    head, rest = text.split(header, 1)
    lines = rest.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("|")) + 2
    for i in range(start, len(lines)):
        if not lines[i].startswith("|"):
            break
        cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
        lines[i] = "| " + " | ".join(row(cells[0].strip("`"), cells)) + " |"
    return head + header + "\n".join(lines)


def cardinality(text: str) -> str:
    """docs/cardinality.md with its counts and fleet sums taken from the goldens."""
    def per(machine: str, cells: list[str]) -> list[str]:
        return [*cells[:2], *(str(n) for n in series_counts(machine))]

    def fleet(machine: str, cells: list[str]) -> list[str]:
        gpu, process = series_counts(machine)
        return [cells[0], *(f"{(gpu + n * process) * NODES * GPUS:,}" for n in PROCESSES)]

    text = _table_rows(text, "## Series per GPU and per process", per)
    return _table_rows(text, f"## Fleet sizing: {NODES:,} nodes x {GPUS} GPUs", fleet)


if __name__ == "__main__":
    sys.stdout.write(page())
