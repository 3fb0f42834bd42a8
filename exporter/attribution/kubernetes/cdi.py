"""CDI spec files on the node: a fully qualified CDI device name -> its device nodes.

A DRA driver hands the kubelet, per allocated device, CDI device names
(``vendor.com/class=name``); the runtime resolves them through the spec files in the
CDI spec directories. We read the same files to learn which ``/dev`` nodes a claim's
device puts into the container, and from those which GPU it is
(exporter.attribution.kubernetes.dra).

The format is the CNCF container-device-interface ``SPEC.md`` (cncf-tags/
container-device-interface): a JSON or YAML document with ``cdiVersion``, ``kind``
(``vendor.com/class``), ``devices[].name`` and ``devices[].containerEdits.deviceNodes[]``
(``path`` in the container, optional ``hostPath``), plus spec-wide ``containerEdits``
that apply to every device of the spec (never a GPU of its own: left out). The
directories are ``--kubernetes.cdi-spec-dirs``, by default ``/etc/cdi`` and
``/var/run/cdi`` (the default ``cdi_spec_dirs`` of containerd and CRI-O); as in the
reference cache (``pkg/cdi/cache.go``), a later directory wins over an earlier one for
the same device name, and one name defined twice in one directory is a conflict that
resolves to nothing.

Files are re-read only when their mtime, size or inode changed; a file that cannot be read
or parsed is counted (``cdi_spec_unreadable``) and its devices are unknown, never
kept from an older version.

Cost: a ``.json`` spec is parsed by the json module, a ``.yaml``/``.yml`` one by libyaml
(PyYAML's C loader; pure-Python YAML only where PyYAML was built without it). A spec
larger than ``MAX_JSON_BYTES`` (1 MiB) / ``MAX_YAML_BYTES`` (512 KiB), refused on its
``stat`` before it is read, or listing more than ``MAX_SPEC_DEVICES`` (4,096) devices,
refused before any is kept, is counted (``cdi_spec_too_large``) and its devices are
unknown; so is a spec whose devices would take the registry past ``MAX_TOTAL_DEVICES``
(16,384, in directory and file-name order), until the file changes. Only the device ->
node paths map is kept, never the parsed document.

YAML aliases multiply a spec without growing its bytes (4,096 devices each aliasing one
30,000-entry ``deviceNodes`` list is 291 KiB of YAML and 123 million node paths), so a
YAML spec is bounded by the tree its aliases expand to, with the rule of Go's YAML
decoder (go-yaml's ``allowedAliasRatio``, the fix of CVE-2019-11253, which the CDI
reference library reads its specs through): walking the tree as the decoder does, once
more than 100 of more than 1,000 nodes come from alias expansion and their share is over
99 % (sliding to 10 % between 400,000 and 4,000,000 nodes), or an anchor holds itself,
the spec is refused (``cdi_spec_too_large``). What the container runtime refuses to read
we refuse too, after at most that walk: bench/cdi_spec_parse.py measured the 320 KiB
spec above at 10 s of CPU and 950 MB without the bound, 0.5 s and 23 MB with it (a
496 KiB one: 26 s and 2.4 GB, 0.75 s and 34 MB).
bench/cdi_spec_parse.py measures the worst spec still accepted (4,096 devices, just under
the byte cap): about 0.03 s CPU and 6 MB peak RSS for JSON, 0.6 s and 22 MB for YAML
(libyaml), where a 4.19 MB JSON spec of 45,708 devices (now refused on its ``stat``) cost
14 to 35 s of CPU and ~400 MB through pure-Python YAML. NVIDIA's full-node spec is about
100 KB.
"""

from __future__ import annotations

import errno
import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import yaml

from exporter.core import untrusted_file
from exporter.core.labels import ErrorReason

DEFAULT_DIRS = ("/etc/cdi", "/var/run/cdi")
# NVIDIA's full-node spec is ~100 KB, a claim's spec a few KB: larger is no spec we need,
# and the caps keep one parse well inside the pod's memory (the module's docstring).
MAX_JSON_BYTES = 1024 * 1024
MAX_YAML_BYTES = 512 * 1024
SPEC_JSON = untrusted_file.Kind("CDI spec", MAX_JSON_BYTES)
SPEC_YAML = untrusted_file.Kind("CDI spec", MAX_YAML_BYTES)
MAX_SPEC_DEVICES = 4096
MAX_TOTAL_DEVICES = 16384  # over every spec file: what the registry keeps
SUFFIXES = (".json", ".yaml", ".yml")
UNREADABLE, TOO_LARGE = ErrorReason.CDI_SPEC_UNREADABLE, ErrorReason.CDI_SPEC_TOO_LARGE
LIBYAML = hasattr(yaml, "CSafeLoader")
_YAML_LOADER: Any = yaml.CSafeLoader if LIBYAML else yaml.SafeLoader


class SpecTooLarge(ValueError):
    """More devices than MAX_SPEC_DEVICES, or YAML aliases that expand too far."""


# go-yaml's decode.go: the share of decoded nodes that may come from alias expansion.
ALIAS_RATIO_LOW, ALIAS_RATIO_HIGH = 400_000, 4_000_000


def allowed_alias_ratio(decodes: int) -> float:
    """99 % up to 400,000 decoded nodes, 10 % from 4,000,000, linear between."""
    if decodes <= ALIAS_RATIO_LOW:
        return 0.99
    if decodes >= ALIAS_RATIO_HIGH:
        return 0.10
    return 0.99 - 0.89 * (decodes - ALIAS_RATIO_LOW) / (ALIAS_RATIO_HIGH - ALIAS_RATIO_LOW)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def excessive_aliasing(root: yaml.Node) -> bool:
    """Whether decoding ``root``'s tree with its aliases expanded breaks Go's rule (the
    module's docstring), or an anchor holds itself. The composed tree holds an alias as
    the anchored node itself: a node met again in document order is an alias there."""
    aliased: set[tuple[int, int]] = set()  # (parent id, child index): an alias slot
    seen: set[int] = set()
    todo: list[tuple[yaml.Node, int, int]] = [(root, 0, -1)]
    while todo:  # in document order, each node's tree once: which slots are aliases
        node, parent, index = todo.pop()
        if id(node) in seen:
            aliased.add((parent, index))
            continue
        seen.add(id(node))
        children = _children(node)
        todo.extend((children[i], id(node), i) for i in range(len(children) - 1, -1, -1))
    if not aliased:
        return False
    decodes = aliases = 0
    path: set[int] = set()  # the nodes being decoded: one met again holds itself
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 0, False)]
    while stack:
        node, depth, leaving = stack.pop()
        if leaving:
            path.discard(id(node))
            continue
        if id(node) in path:
            return True
        decodes += 1
        aliases += depth > 0
        if aliases > 100 and decodes > 1000 and aliases / decodes > \
                allowed_alias_ratio(decodes):
            return True
        children = _children(node)
        if not children:
            continue
        path.add(id(node))
        stack.append((node, depth, True))
        for i in range(len(children) - 1, -1, -1):
            if (id(node), i) in aliased:  # the alias node, then its anchor's tree
                decodes += 1
                aliases += depth > 0
                stack.append((children[i], depth + 1, False))
            else:
                stack.append((children[i], depth, False))
    return False


def _load_yaml(text: str) -> Any:
    """A YAML document, refused (SpecTooLarge) when its aliases expand too far."""
    loader = _YAML_LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if "*" in text and excessive_aliasing(node):
            raise SpecTooLarge("excessive aliasing")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def parse_spec(text: str, json_text: bool = False
               ) -> dict[str, tuple[str, ...]] | None:
    """A spec document -> qualified device name -> device node paths; None when malformed.

    ``json_text``: the file is ``.json``: parsed as JSON only. Otherwise YAML (1.1, a
    superset of the JSON that specs use). Raises SpecTooLarge for more than
    MAX_SPEC_DEVICES devices or YAML aliases that expand too far; nothing else.
    """
    try:
        doc: Any = json.loads(text) if json_text else _load_yaml(text)
    except SpecTooLarge:
        raise
    except (ValueError, yaml.YAMLError, RecursionError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str):
        return None
    kind, devices = doc["kind"], doc.get("devices")
    del doc  # only what is copied out below is kept
    if "/" not in kind or not isinstance(devices, list):
        return None
    if len(devices) > MAX_SPEC_DEVICES:
        raise SpecTooLarge(len(devices))
    out: dict[str, tuple[str, ...]] = {}
    for device in devices:
        if not isinstance(device, dict) or not isinstance(device.get("name"), str):
            return None
        edits = device.get("containerEdits") or {}
        nodes = (edits.get("deviceNodes") or []) if isinstance(edits, dict) else None
        if not isinstance(nodes, list):
            return None
        paths = []
        for node in nodes:
            path = node.get("path") if isinstance(node, dict) else None
            if not isinstance(path, str):
                return None
            paths.append(path)
        out[f"{kind}={device['name']}"] = tuple(paths)
    return out


@dataclass(frozen=True)
class _File:
    stamp: tuple[int, int, int]  # mtime (ns), size, inode: writers rename a new file in
    devices: Mapping[str, tuple[str, ...]] | None  # None: refused (``error`` says why)
    error: ErrorReason = UNREADABLE


class CdiRegistry:
    """The spec directories' devices, refreshed cheaply (``stat`` per file) each cycle."""

    def __init__(self, dirs: Sequence[str]) -> None:
        self.dirs = tuple(dirs)
        self._files: dict[str, _File] = {}
        self.devices: Mapping[str, tuple[str, ...]] = MappingProxyType({})
        self.bad: tuple[str, ...] = ()  # unreadable spec files, for the log

    def refresh(self) -> Counter[ErrorReason]:
        """Re-scan the directories; returns errors of this scan."""
        errors: Counter[ErrorReason] = Counter()
        seen: dict[str, _File] = {}
        merged: dict[str, tuple[str, ...]] = {}
        bad = []
        kept = 0
        for directory in self.dirs:
            here: dict[str, tuple[str, ...] | None] = {}
            for path in _spec_files(directory):
                entry = self._load(path)
                count = len(entry.devices) if entry.devices is not None else 0
                if kept + count > MAX_TOTAL_DEVICES:
                    # Not kept (its map dropped); refused until the file changes.
                    entry = _File(entry.stamp, None, TOO_LARGE)
                else:
                    kept += count
                seen[path] = entry
                if entry.devices is None:
                    errors[entry.error] += 1
                    bad.append(path)
                    continue
                for name, nodes in entry.devices.items():
                    # Defined twice in one directory: a conflict, resolved to nothing.
                    here[name] = None if name in here else nodes
            for name, found in here.items():
                if found is None:
                    merged.pop(name, None)
                    errors[ErrorReason.CDI_DEVICE_CONFLICT] += 1
                else:
                    merged[name] = found  # a later directory wins
        self._files = seen
        self.devices = MappingProxyType(merged)
        self.bad = tuple(bad)
        return errors

    def _load(self, path: str) -> _File:
        try:
            st = os.stat(path)
        except OSError:
            return _File((0, -1, 0), None)
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        old = self._files.get(path)
        if old is not None and old.stamp == stamp:
            return old
        kind = SPEC_JSON if path.endswith(".json") else SPEC_YAML
        try:  # a FIFO is refused, a file over the size (or grown past it) too
            text = untrusted_file.read_text(path, kind, errors="replace")
        except untrusted_file.UnreadableFile as e:
            return _File(stamp, None, TOO_LARGE if e.errno == errno.EFBIG else UNREADABLE)
        try:
            devices = parse_spec(text, path.endswith(".json"))
        except SpecTooLarge:
            return _File(stamp, None, TOO_LARGE)
        return _File(stamp, None if devices is None else MappingProxyType(devices))


def _spec_files(directory: str) -> Iterable[str]:
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return ()  # an absent directory holds no specs (the node may have one of the two)
    return [os.path.join(directory, n) for n in names if n.endswith(SUFFIXES)
            and os.path.isfile(os.path.join(directory, n))]
