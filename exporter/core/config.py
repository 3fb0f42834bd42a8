"""The one frozen Config, and the validators that turn operator input into it.

Every value is validated once, here, with an error that names the key; the rest
of the program trusts the Config it is handed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any, TypeVar

from exporter.core import untrusted_file
from exporter.core.secret import Secret, control_character

# Collector switch defaults and old switch names come from the backend table.
# Old collector switch names that still work: --collector.processes is --collector.fdinfo.
ALIASES: Mapping[str, str] = MappingProxyType({"processes": "fdinfo"})

# Where a kubelet with the default --root-dir (/var/lib/kubelet) serves pod-resources.
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"



class Choice(str, Enum):
    """A flag's closed set of words: compares and prints as its word."""

    def __str__(self) -> str:
        return str.__str__(self)


class LogLevel(Choice):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class LogFormat(Choice):
    AUTO = "auto"  # console on a terminal, else JSON
    JSON = "json"
    CONSOLE = "console"


class MetricNames(Choice):
    """``--metric-names``: which names /metrics serves (docs/dcgm-compat.md)."""

    GPU = "gpu"  # ours
    DCGM = "dcgm"  # dcgm-exporter's DCGM_FI_* names, units and labels, up to its 4.8
    DCGM_4_9 = "dcgm4.9"  # dcgm-exporter 4.9 and later: DCGM 4.7's renamed fields
    BOTH = "both"  # gpu and dcgm
    BOTH_4_9 = "both-dcgm4.9"  # gpu and dcgm4.9

    @property
    def gpu(self) -> bool:
        """Whether our gpu_* per-GPU families are served."""
        return self in (MetricNames.GPU, MetricNames.BOTH, MetricNames.BOTH_4_9)

    @property
    def dcgm(self) -> str | None:
        """The dcgm-exporter generation served (exporter.output.dcgm.generations()), or None."""
        return {MetricNames.DCGM: "dcgm", MetricNames.BOTH: "dcgm",
                MetricNames.DCGM_4_9: "dcgm4.9", MetricNames.BOTH_4_9: "dcgm4.9"}.get(self)



class ConfigError(ValueError):
    """Bad operator input. ``key`` is the flag/env/file key it came from."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


@dataclass(frozen=True)
class Config:
    listen_addresses: tuple[str, ...] = (":9445",)
    telemetry_path: str = "/metrics"
    web_config_file: str | None = None
    sysfs: str = "/sys"
    procfs: str = "/proc"
    amdgpu_ids: str | None = None  # None: usr/share/libdrm/amdgpu.ids beside the sysfs root
    state_dir: str | None = None  # None: systemd's $STATE_DIRECTORY, else no state kept
    interval: float = 1.0  # fast tier, seconds
    slow_interval: float = 10.0  # expensive calls, seconds
    processes_interval: float = 5.0  # per-process /proc scan
    processes_budget: float = 0.5  # seconds one scan may take before it stops early
    # The collector switches the operator gave (exporter.pipeline.registry holds the
    # defaults): True (forced on), False (off), None (auto).
    collectors: Mapping[str, bool | None] = field(default_factory=dict)
    max_processes_per_gpu: int = 64
    stale_after: float | None = None  # None -> 3 x interval
    log_level: LogLevel = LogLevel.INFO
    log_format: LogFormat = LogFormat.AUTO
    config_file: str | None = None
    metric_names: MetricNames = MetricNames.GPU
    # The landing page's ring buffer, and metric selection (exporter.selection): fully
    # anchored regexes over family names; dcgm-exporter's counters CSV in dcgm mode.
    web_history: float = 900.0
    metrics_include: str | None = None
    metrics_exclude: str | None = None
    dcgm_counters: str | None = None
    # None: the kubelet's default socket, and auto builds the backend only where it exists;
    # a socket given says "this is a Kubernetes node": auto builds the backend even while the
    # socket is absent, which then reports down and is retried (pod_resources_socket).
    kubernetes_pod_resources_socket: str | None = None
    kubernetes_cri_socket: str | None = None  # None: the first standard socket that exists
    kubernetes_device_labels: bool = False
    kubernetes_interval: float = 5.0  # refresh of the pod / container maps
    # DRA, pod labels and Slurm jobs (docs/kubernetes.md): CDI spec directories, later wins;
    # a regex of pod label names to export (None: off); dcgm-exporter's HPC job mapping.
    kubernetes_cdi_spec_dirs: tuple[str, ...] = ("/etc/cdi", "/var/run/cdi")
    kubernetes_pod_labels: str | None = None
    slurm_job_mapping_dir: str | None = None
    macmon_path: str = "macmon"
    health_xid_window: float = 3600.0  # seconds an XID counts towards the health verdict

    # OTLP push (docs/otlp.md); None leaves a setting to the SDK's OTEL_EXPORTER_OTLP_* env.
    otlp_endpoint: str | None = None
    otlp_interval: float = 15.0
    otlp_timeout: float | None = None
    otlp_headers: tuple[tuple[str, Secret], ...] | None = None
    otlp_ca_file: str | None = None
    otlp_only: bool = False

    @property
    def pod_resources_socket(self) -> str:
        """The kubelet pod-resources socket: the one given, else the kubelet's default."""
        return self.kubernetes_pod_resources_socket or DEFAULT_POD_RESOURCES_SOCKET

    @property
    def stale_after_seconds(self) -> float:
        return self.stale_after if self.stale_after is not None else 3 * self.interval

    def collector_enabled(self, name: str) -> bool | None:
        """True (forced on), False (off) or None (auto or not given: the registry's
        default applies); an old name (``processes``) is its collector's (``fdinfo``)."""
        return self.collectors.get(ALIASES.get(name, name))


_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def format_duration(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds >= 1:
        return f"{seconds:g}s"
    return f"{seconds * 1000:g}ms"


def bounded_duration(low: float, high: float) -> Callable[[str, object], float]:
    """A duration parser that also says which range is allowed: a collection interval of
    a nanosecond burns a CPU, one of ``inf`` stops the threads while serving stale data."""

    def parse(key: str, value: object) -> float:
        seconds = parse_duration(key, value)
        if not low <= seconds <= high:
            raise ConfigError(key, f"must be between {format_duration(low)} and "
                                   f"{format_duration(high)}, got {value!r}")
        return seconds

    return parse


def parse_duration(key: str, value: object) -> float:
    """``500ms``, ``1s``, ``1m30s``, ``2h`` (Prometheus style) or a bare number of seconds."""
    if isinstance(value, bool):
        raise ConfigError(key, f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = str(value).strip()
        try:
            seconds = float(text)
        except ValueError:
            pos, seconds = 0, 0.0
            for m in _DURATION_RE.finditer(text):
                if m.start() != pos:
                    break
                seconds += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
                pos = m.end()
            if pos != len(text) or not text:
                raise ConfigError(
                    key, f"not a duration: {text!r} (use e.g. 500ms, 1s, 1m30s)"
                ) from None
    if not seconds > 0 or not math.isfinite(seconds):
        raise ConfigError(key, f"must be greater than zero and finite, got {value!r}")
    return seconds


def parse_listen_address(key: str, value: str) -> str:
    """``host:port``, ``:port``, ``[v6]:port`` or ``unix:/path``."""
    text = value.strip()
    if text.startswith("unix:"):
        if len(text) <= len("unix:"):
            raise ConfigError(key, "unix socket address needs a path: unix:/run/gpu-exporter.sock")
        return text
    host, sep, port = text.rpartition(":")
    if not sep:
        raise ConfigError(key, f"not host:port: {value!r}")
    if host.startswith("["):
        if not host.endswith("]") or host == "[]":
            raise ConfigError(key, f"bad IPv6 address: {value!r}")
    elif ":" in host:
        raise ConfigError(key, f"IPv6 hosts need brackets, e.g. [::1]:9445: {value!r}")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(key, f"bad port in {value!r}")
    return text


def split_listen_address(address: str) -> tuple[str, int]:
    """A validated ``host:port`` -> (host, port); an empty host listens on all addresses."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def parse_positive_int(key: str, value: object) -> int:
    if isinstance(value, bool):
        raise ConfigError(key, f"not a positive integer: {value!r}")
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ConfigError(key, f"not a positive integer: {value!r}") from None
    if number < 1:
        raise ConfigError(key, f"must be at least 1, got {number}")
    return number


C = TypeVar("C", bound=Choice)


def parse_choice(key: str, value: object, choices: type[C]) -> C:
    text = str(value).strip().lower()
    for choice in choices:
        if choice.value == text:
            return choice
    raise ConfigError(key, f"must be one of {', '.join(c.value for c in choices)}; "
                           f"got {value!r}")


def parse_bool(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(key, f"not a boolean: {value!r} (use true or false)")


def parse_path(key: str, value: object) -> str:
    text = str(value).strip()
    if not text:
        raise ConfigError(key, "must not be empty")
    return text


def parse_paths(key: str, value: object) -> tuple[str, ...]:
    """A comma-separated list (or a YAML list) of paths, in order."""
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    paths = tuple(str(v).strip() for v in items if str(v).strip())
    if not paths:
        raise ConfigError(key, "needs at least one path")
    return paths


def parse_regex(key: str, value: object) -> str:
    """A regular expression (Python ``re`` syntax), checked here so a typo exits at start."""
    text = str(value)
    try:
        re.compile(text)
    except re.error as e:
        raise ConfigError(key, f"not a regular expression: {e}") from None
    return text


# A plain URL path: no route pattern ("{x:path}" would match every path), query or
# fragment, no spaces. RFC 3986 path characters.
_PLAIN_PATH_RE = re.compile(r"(/[A-Za-z0-9._~!$&'()*+,;=:@%-]*)+\Z")


def parse_telemetry_path(key: str, value: object) -> str:
    text = str(value).strip()
    if not text.startswith("/") or text in ("/", "/-/healthy", "/-/ready", "/snapshot",
                                                "/api/v1/history", "/static/app.js",
                                                "/static/app.css"):
        raise ConfigError(key, f"must be a path starting with / and not a built-in one: {value!r}")
    if not _PLAIN_PATH_RE.match(text):
        raise ConfigError(key, f"must be a plain path (letters, digits, / . - _ ~), "
                               f"not a pattern: {value!r}")
    return text


MAX_YAML_DEPTH = 64  # nesting levels; a configuration needs a handful
MAX_YAML_NODES = 100_000  # values once every alias is expanded


def _bounded_loader() -> type:
    """yaml.SafeLoader with nesting depth and alias expansion bounded.

    An alias is cheap to parse but is walked once per use by whatever reads the
    result: nine levels of ten aliases are 10^9 values from under 1 KiB of YAML
    (a "billion laughs"), and 100k levels of nesting exhaust the recursion limit. The
    composer here counts, for each value, how many values it stands for with its
    aliases expanded, and stops at MAX_YAML_NODES or MAX_YAML_DEPTH.
    """
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        def __init__(self, stream: Any) -> None:
            super().__init__(stream)
            self._depth = 0
            self._total = 0
            self._sizes: dict[int, int] = {}

        def compose_node(self, parent: Any, index: Any) -> Any:
            self._depth += 1
            try:
                if self._depth > MAX_YAML_DEPTH:
                    raise yaml.YAMLError(f"nested deeper than {MAX_YAML_DEPTH} levels")
                node = super().compose_node(parent, index)
            finally:
                self._depth -= 1
            size = self._sizes.get(id(node))
            if node is None:
                return node
            if size is None:  # a new node, not an alias: its children are counted
                children = node.value if isinstance(node.value, list) else []
                size = 1 + sum(self._sizes.get(id(c), 1) for child in children
                               for c in (child if isinstance(child, tuple) else (child,)))
                self._sizes[id(node)] = size
                self._total += 1
            else:  # an alias stands for everything under the node it names
                self._total += size
            if self._total > MAX_YAML_NODES:
                raise yaml.YAMLError(f"more than {MAX_YAML_NODES} values once aliases are "
                                     "expanded")
            return node

    return BoundedLoader


def parse_url(key: str, value: object) -> str:
    text = str(value).strip()
    if not re.match(r"https?://[^/\s]+", text):
        raise ConfigError(key, f"must be an http:// or https:// URL, got {value!r}")
    return text


def parse_headers(key: str, value: object) -> tuple[tuple[str, Secret], ...]:
    """``k=v,k2=v2``, the form of OTEL_EXPORTER_OTLP_HEADERS; names are HTTP tokens. The
    values are Secrets (an Authorization header is the common one): an error names the
    pair, never a value, and a control character in one is refused."""
    headers = []
    for n, item in enumerate(str(value).split(","), 1):
        name, sep, v = item.partition("=")
        if not sep or not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", name.strip()):
            raise ConfigError(key, f"not name=value pairs separated by commas (pair {n} "
                                   "is not one)")
        bad = control_character(v.strip())
        if bad is not None:
            raise ConfigError(key, f"the value of {name.strip()} contains {bad}")
        headers.append((name.strip(), Secret(v.strip())))
    return tuple(headers)


def yaml_problem(e: Exception) -> str:
    """A YAML error in one line, without the text of the file: PyYAML's own message
    quotes the lines around the fault, which may hold a password or a key."""
    import yaml

    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        # The problem quotes a tag or an alias whole ("the tag '!hunter2'", in either
        # quotes): a password that starts with ! or * is one. A quoted character ('%')
        # says what to fix and is kept.
        problem = re.sub(r"(['\"]).{3,}\1", "(not shown)", e.problem or e.context or "malformed",
                         flags=re.DOTALL)
        return f"{problem}{where}"
    if isinstance(e, yaml.reader.ReaderError):  # a control character: its code, its place
        code = e.character if isinstance(e.character, int) else ord(e.character)
        return f"a character YAML does not allow (U+{code:04X}) at character {e.position}"
    if isinstance(e, RecursionError):
        return "nested too deeply"
    return str(e) if type(e) is yaml.YAMLError else type(e).__name__  # the bounds' own


def load_yaml(path: str, kind: untrusted_file.Kind = untrusted_file.CONFIG) -> Any:
    """A YAML file read under ``kind``'s rules (exporter.core.untrusted_file) and parsed
    with nesting and aliases bounded; OSError (the file, untrusted_file's rules) or
    ValueError (``<path> is not valid YAML: ...``, never the file's text)."""
    import yaml  # only when a file is given: keeps the daemon's resident size down

    text = untrusted_file.read_text(path, kind)
    try:
        return yaml.load(text, Loader=_bounded_loader())  # noqa: S506 (a SafeLoader)
    except (yaml.YAMLError, RecursionError) as e:
        raise ValueError(f"{path} is not valid YAML: {yaml_problem(e)}") from None


def load_yaml_mapping(key: str, path: str) -> dict[str, Any]:
    """A YAML file that must hold a mapping; any problem is a ConfigError naming ``key``."""
    try:
        data = load_yaml(path) or {}
    except OSError as e:
        raise ConfigError(key, f"cannot read {e}") from None
    except ValueError as e:
        raise ConfigError(key, str(e)) from None
    if not isinstance(data, dict):
        raise ConfigError(key, f"{path} must be a YAML mapping")
    return data
