#!/usr/bin/env python3
"""Cost of reading one large CDI spec file: CPU time and peak RSS, before and after.

Writes CDI specs in the NVIDIA DRA driver's device-spec shape (``k8s.gpu.nvidia.com/
device``, MIG-like device names, each with its ``/dev/nvidia<minor>`` and a capability
node) into a temp dir, then loads each in a fresh child process (so peak RSS is that
load's alone) and prints, per case, the CPU time of the load, the peak RSS the load
added over the child's RSS before it (modules imported, file not read; the peak is
reset through ``/proc/self/clear_refs``), the RSS still held after it, and the devices
kept:

- ``before``: what the exporter did: the whole file (under the old 4 MiB cap) through
  ``yaml.safe_load`` (pure-Python YAML, tried first even for ``.json``), the devices
  kept;
- ``after``: ``CdiRegistry`` as it is now (exporter.attribution.kubernetes.cdi): ``.json`` through
  the json module, ``.yaml`` through libyaml where PyYAML has it, refused by size (a
  ``stat``) or device count before anything is kept.

Cases: ``--devices`` (default 45,708 devices, ~4.2 MB of JSON, just under the old 4 MiB
cap: the figure of the report this was measured for), and the worst specs still
accepted now (the device cap, names padded to just under the byte cap; JSON and YAML),
and a directory of such JSON specs up to the registry's total device cap (after only:
what the registry can hold at most), and YAML specs whose 4,096 devices alias one list
of 30,000 or 77,000 device nodes (320 KiB and 496 KiB: under both caps), ``unbounded``
(the registry without its alias bound) against ``after``.
``--rounds`` (default 3) loads per case; medians printed. Usage:
``python bench/cdi_spec_parse.py [--devices 45708] [--rounds 3] [--skip-before]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter.attribution.kubernetes import cdi  # noqa: E402

CHILD = r"""
import json, os, resource, sys, time
sys.path.insert(0, sys.argv[3])
import yaml
from exporter.attribution.kubernetes import cdi
mode, path = sys.argv[1], sys.argv[2]
def status_kb(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key))
def reset_peak():
    try:  # Linux: writing 5 to clear_refs resets the peak (VmHWM) to the current RSS
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False
import gc
gc.collect()
reset = reset_peak()
base = status_kb("VmRSS:")
t = time.process_time()
if mode == "before":
    if os.stat(path).st_size > 4 * 1024 * 1024:
        kept = None
    else:
        with open(path, encoding="utf-8", errors="replace") as f:
            doc = yaml.safe_load(f.read())
        kept = {f"{doc['kind']}={d['name']}": tuple(n["path"] for n in
                d["containerEdits"]["deviceNodes"]) for d in doc["devices"]}
        del doc
else:
    if mode == "unbounded":  # the registry as it was before YAML aliases were bounded
        cdi.excessive_aliasing = lambda node: False
    reg = cdi.CdiRegistry([os.path.dirname(path)])
    errors = reg.refresh()
    kept = dict(reg.devices) if not errors else None
cpu = time.process_time() - t
peak = status_kb("VmHWM:") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
after = status_kb("VmRSS:")
print(json.dumps({"cpu_s": cpu, "peak_rss_mb": (peak - base) / 1024,
                  "kept_rss_mb": (after - base) / 1024, "kept": len(kept) if kept else 0}))
"""


def spec(devices: int, pad: int = 0) -> dict[str, object]:
    return {"cdiVersion": "0.5.0", "kind": "k8s.gpu.nvidia.com/device", "devices": [
        {"name": f"gpu-{i}" + "-" * pad, "containerEdits": {"deviceNodes": [
            {"path": f"/dev/nvidia-cap{i % 1000}"}]}} for i in range(devices)]}


def yaml_text(doc: dict[str, object]) -> str:
    lines = [f"cdiVersion: {doc['cdiVersion']}", f"kind: {doc['kind']}", "devices:"]
    for d in doc["devices"]:  # type: ignore[attr-defined]
        lines += [f"  - name: {d['name']}", "    containerEdits:", "      deviceNodes:"]
        lines += [f"        - path: {n['path']}" for n in d["containerEdits"]["deviceNodes"]]
    return "\n".join(lines) + "\n"


def aliased_yaml(devices: int, nodes: int) -> str:
    """Every device's deviceNodes an alias of one list of ``nodes`` aliases of one node."""
    listed = ", ".join(["&p {path: /dev/nvidia0}"] + ["*p"] * (nodes - 1))
    return "\n".join(["cdiVersion: 0.5.0", "kind: k8s.gpu.nvidia.com/device", "devices:",
                      f"- {{name: g0, containerEdits: {{deviceNodes: &n [{listed}]}}}}",
                      *(f"- {{name: g{d}, containerEdits: {{deviceNodes: *n}}}}"
                        for d in range(1, devices))]) + "\n"


def at_caps(limit: int, render: object) -> dict[str, object]:
    """The worst spec still accepted: MAX_SPEC_DEVICES devices whose names are padded
    until the file is just under ``limit`` bytes."""
    n = cdi.MAX_SPEC_DEVICES
    pad = max(0, (limit - len(render(spec(n)))) // n - 1)  # type: ignore[operator]
    return spec(n, pad)


def run(mode: str, path: Path, rounds: int) -> dict[str, float]:
    results = []
    for _ in range(rounds):
        out = subprocess.run([sys.executable, "-c", CHILD, mode, str(path), str(ROOT)],
                             capture_output=True, text=True, check=True, timeout=600)
        results.append(json.loads(out.stdout))
    return {k: statistics.median(r[k] for r in results) for k in results[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", type=int, default=45_708)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-before", action="store_true",
                    help="leave out the pure-Python YAML loads (about 15 s each at 4 MB)")
    args = ap.parse_args()
    dumps = json.dumps
    with tempfile.TemporaryDirectory() as tmp:
        cases = []
        big = Path(tmp, "big") / "k8s.gpu.nvidia.com-device_big.json"
        big.parent.mkdir()
        big.write_text(dumps(spec(args.devices)))
        cases.append((f"{args.devices} devices, JSON", big))
        n = cdi.MAX_SPEC_DEVICES
        at_cap = Path(tmp, "json") / "k8s.gpu.nvidia.com-device_cap.json"
        at_cap.parent.mkdir()
        at_cap.write_text(dumps(at_caps(cdi.MAX_JSON_BYTES, dumps)))
        cases.append((f"{n} devices, JSON at both caps", at_cap))
        yaml_cap = Path(tmp, "yaml") / "k8s.gpu.nvidia.com-device_cap.yaml"
        yaml_cap.parent.mkdir()
        yaml_cap.write_text(yaml_text(at_caps(cdi.MAX_YAML_BYTES, yaml_text)))
        cases.append((f"{n} devices, YAML at both caps", yaml_cap))
        full = Path(tmp, "full")
        full.mkdir()
        for k in range(cdi.MAX_TOTAL_DEVICES // n):
            doc = at_caps(cdi.MAX_JSON_BYTES, dumps)
            doc["kind"] = f"k8s.gpu{k}.nvidia.com/device"
            (full / f"spec{k}.json").write_text(dumps(doc))
        cases.append((f"{cdi.MAX_TOTAL_DEVICES} devices, {k + 1} JSON specs", full / "spec0.json"))
        aliased = []
        for nodes in (30_000, 77_000):
            path = Path(tmp, f"alias{nodes}") / "k8s.gpu.nvidia.com-device_alias.yaml"
            path.parent.mkdir()
            path.write_text(aliased_yaml(n, nodes))
            cases.append((f"{n} devices x {nodes} aliased nodes", path))
            aliased.append(path)
        print(f"caps now: JSON {cdi.MAX_JSON_BYTES} B, YAML {cdi.MAX_YAML_BYTES} B, "
              f"{cdi.MAX_SPEC_DEVICES} devices; libyaml: {cdi.LIBYAML}")
        print(f"{'case':34} {'bytes':>9} {'mode':9} {'cpu s':>8} {'peak MB':>8} "
              f"{'kept MB':>8} {'devices':>7}")
        for name, path in cases:
            size = os.path.getsize(path)
            if path.parent == full:
                size = sum(os.path.getsize(p) for p in full.iterdir())
            modes = ("unbounded", "after") if path in aliased else ("before", "after")
            for mode in modes:
                if mode == "before" and (args.skip_before or path.parent == full):
                    continue
                r = run(mode, path, args.rounds)
                print(f"{name:34} {size:9d} {mode:9} {r['cpu_s']:8.3f} "
                      f"{r['peak_rss_mb']:8.1f} {r['kept_rss_mb']:8.1f} {int(r['kept']):7d}")


if __name__ == "__main__":
    main()
