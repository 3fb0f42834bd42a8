"""The flags, and how a ``Config`` is read from them, the environment and the config file.

Owns the flag table (``OPTIONS``; the collector switches ``--[no-]collector.<name>``
come from the backend table, exporter.sources), the argparse parser and its help, and
loading: precedence is flag > environment > file > default. Every key has one name
(``collector.interval``); the flag is ``--collector.interval``, the variable
``GPU_EXPORTER_COLLECTOR_INTERVAL`` and the file key ``collector.interval`` (or
nested: ``collector: {interval: 1s}``). Bad input raises ``ConfigError`` naming the key
and where it came from; exporter.app.cli turns it into one line and exit code 2.
"""

from __future__ import annotations

import argparse
import platform
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from exporter import __version__
from exporter.client.fleet.flags import FLEET_DEFAULTS
from exporter.core.config import (
    ALIASES,
    Config,
    ConfigError,
    LogFormat,
    LogLevel,
    MetricNames,
    bounded_duration,
    load_yaml_mapping,
    parse_bool,
    parse_choice,
    parse_headers,
    parse_listen_address,
    parse_path,
    parse_paths,
    parse_positive_int,
    parse_regex,
    parse_telemetry_path,
    parse_url,
)
from exporter.pipeline.registry import COLLECTORS, TABLE

HOUR = 3600.0
DAY = 24 * HOUR
USAGE_EPILOG = """commands:
  (none)      run the exporter daemon
  snapshot    run one collection and print it as JSON, with each backend's state and the
              reason a backend is off: the first thing to run when a metric is missing.
              With --from URL, print what the running daemon sees (inside a container
              its view of the host differs from a fresh process's)
  top         a full-screen terminal dashboard of a running daemon (--from URL, default
              http://127.0.0.1:9445), refreshed from its /api/v1/history; needs the top
              extra: pip install '.[top]' in the gpu-exporter checkout (the image has it)

Every flag can also be set with GPU_EXPORTER_<NAME> (dots and dashes become underscores,
e.g. GPU_EXPORTER_WEB_LISTEN_ADDRESS=:9445) or in --config.file (YAML, same keys).
Precedence: flag > environment > file > default."""


@dataclass(frozen=True)
class Option:
    key: str
    field: str
    parse: Callable[[str, Any], Any]
    help: str
    metavar: str = ""
    repeated: bool = False
    switch: bool = False  # --key / --no-key on the command line, a boolean elsewhere


def _addresses(key: str, value: Any) -> tuple[str, ...]:
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    addresses = tuple(parse_listen_address(key, str(v)) for v in items if str(v).strip())
    if not addresses:
        raise ConfigError(key, "needs at least one address")
    return addresses


OPTIONS = (
    Option("web.listen-address", "listen_addresses", _addresses,
           "address to listen on, host:port or unix:/path; repeatable (default :9445)",
           "ADDR", repeated=True),
    Option("web.telemetry-path", "telemetry_path", parse_telemetry_path,
           "path of the metrics endpoint (default /metrics)", "PATH"),
    Option("web.config.file", "web_config_file", parse_path,
           "exporter-toolkit web config: TLS and basic auth (default none)", "FILE"),
    Option("path.sysfs", "sysfs", parse_path, "sysfs mount point (default /sys)", "DIR"),
    Option("path.procfs", "procfs", parse_path, "procfs mount point (default /proc)", "DIR"),
    Option("path.state", "state_dir", parse_path,
           "directory where a run records how it ended, so the next start logs a crash or "
           "restart loop (default systemd's $STATE_DIRECTORY, else none)", "DIR"),
    Option("path.amdgpu-ids", "amdgpu_ids", parse_path,
           "libdrm's amdgpu.ids, the AMD marketing-name table, and no other (default "
           "usr/share/libdrm/amdgpu.ids beside the sysfs root, then /usr/share/libdrm's; "
           "pci.ids and AMD 0x<device> after either)", "FILE"),
    Option("collector.interval", "interval", bounded_duration(0.1, HOUR),
           "fast tier: seconds between samples, 100ms to 1h (default 1s)", "DURATION"),
    Option("collector.slow-interval", "slow_interval", bounded_duration(0.1, DAY),
           "slow tier for expensive calls, 100ms to 24h (default 10s)", "DURATION"),
    Option("collector.processes.interval", "processes_interval", bounded_duration(0.1, DAY),
           "per-process /proc scan interval, 100ms to 24h (default 5s)", "DURATION"),
    Option("collector.processes.budget", "processes_budget", bounded_duration(0.001, HOUR),
           "time one /proc scan may take before it stops early, 1ms to 1h (default 500ms)",
           "DURATION"),
    Option("max-processes-per-gpu", "max_processes_per_gpu", parse_positive_int,
           "cap on per-process series per GPU, largest memory first (default 64)", "N"),
    Option("stale-after", "stale_after", bounded_duration(0.1, DAY),
           "withdraw a backend's series after this long without a completed collection, "
           "100ms to 24h (default 3 x collector.interval)", "DURATION"),
    Option("log.level", "log_level", lambda k, v: parse_choice(k, v, LogLevel),
           "debug, info, warning or error (default info)", "LEVEL"),
    Option("log.format", "log_format", lambda k, v: parse_choice(k, v, LogFormat),
           "json, console or auto: console on a terminal (default auto)", "FORMAT"),
    Option("metric-names", "metric_names", lambda k, v: parse_choice(k, v, MetricNames),
           "gpu, dcgm (dcgm-exporter's DCGM_FI_* names up to its 4.8), dcgm4.9 (its "
           "names from 4.9 on), both (gpu and dcgm) or both-dcgm4.9 (default gpu)", "SCHEME"),
    # The landing page and metric selection (exporter.serve.history, exporter.selection).
    Option("web.history", "web_history", bounded_duration(1.0, DAY),
           "how far back the landing page's charts go, kept in memory: one sample per "
           "collector.interval per GPU, 1s to 24h (default 15m)", "DURATION"),
    Option("collector.metrics.include", "metrics_include", parse_regex,
           "serve only the metric families whose whole name matches this regex "
           "(default all)", "REGEX"),
    Option("collector.metrics.exclude", "metrics_exclude", parse_regex,
           "do not serve the metric families whose whole name matches this regex "
           "(default none)", "REGEX"),
    Option("dcgm.counters", "dcgm_counters", parse_path,
           "with --metric-names dcgm, dcgm4.9 or both: serve only the DCGM_FI_* fields "
           "this dcgm-exporter counters CSV names (default all we can fill)", "FILE"),
    Option("kubernetes.pod-resources-socket", "kubernetes_pod_resources_socket", parse_path,
           "kubelet pod-resources API socket, for device -> pod "
           "(default /var/lib/kubelet/pod-resources/kubelet.sock)", "PATH"),
    Option("kubernetes.cri-socket", "kubernetes_cri_socket", parse_path,
           "CRI runtime socket, for process -> pod (default: the first of containerd's "
           "and CRI-O's standard sockets that exists)", "PATH"),
    Option("kubernetes.device-labels", "kubernetes_device_labels", parse_bool,
           "also put pod/namespace/container on the per-GPU series of an exclusively "
           "allocated GPU (default off)", switch=True),
    Option("kubernetes.interval", "kubernetes_interval", bounded_duration(0.1, HOUR),
           "refresh of the pod and container maps, 100ms to 1h (default 5s)", "DURATION"),
    Option("kubernetes.cdi-spec-dirs", "kubernetes_cdi_spec_dirs", parse_paths,
           "CDI spec directories, comma-separated, for DRA-allocated GPUs "
           "(default /etc/cdi,/var/run/cdi)", "DIRS"),
    Option("kubernetes.pod-labels", "kubernetes_pod_labels", parse_regex,
           "export the pod labels whose names match this regex, from the CRI runtime, as "
           "gpu_kubernetes_pod_labels_info (default off)", "REGEX"),
    Option("slurm.job-mapping-dir", "slurm_job_mapping_dir", parse_path,
           "dcgm-exporter's HPC job mapping directory (a file per GPU index listing its "
           "job ids), served as gpu_slurm_job_info (default off)", "DIR"),
    Option("health.xid-window", "health_xid_window", bounded_duration(1.0, 7 * DAY),
           "how long an NVIDIA XID keeps counting towards the GPU's health verdict, "
           "1s to 7d (default 1h)", "DURATION"),
    Option("macmon.path", "macmon_path", parse_path,
           "Apple Silicon: the macmon executable run as `macmon pipe` (default macmon on PATH)",
           "PATH"),
    # OTLP push (exporter/output/otlp.py, docs/otlp.md): needs the otlp extra.
    Option("otlp.endpoint", "otlp_endpoint", parse_url,
           "push metrics over OTLP/HTTP to this URL too (a URL without a path gets "
           "/v1/metrics); needs the otlp extra (default: no push)", "URL"),
    Option("otlp.interval", "otlp_interval", bounded_duration(0.1, HOUR),
           "seconds between OTLP pushes, 100ms to 1h (default 15s)", "DURATION"),
    Option("otlp.timeout", "otlp_timeout", bounded_duration(0.1, HOUR),
           "time one push may take, retries included (default: OTEL_EXPORTER_OTLP_TIMEOUT "
           "or 10s)", "DURATION"),
    Option("otlp.headers", "otlp_headers", parse_headers,
           "HTTP headers of each push, name=value,... (default: OTEL_EXPORTER_OTLP_HEADERS)",
           "HEADERS"),
    Option("otlp.ca-file", "otlp_ca_file", parse_path,
           "CA certificates that verify an https:// receiver (default: "
           "OTEL_EXPORTER_OTLP_CERTIFICATE or the system's)", "FILE"),
    Option("otlp.only", "otlp_only", parse_bool,
           "push only: bind no port, serve no /metrics (default off)", switch=True),
)
KEYS = {o.key: o for o in OPTIONS}
# --help's groups (argparse argument groups) and README.md's flag tables
# (tools.flagsdoc), in this order: (title, the key prefixes that belong to it; the
# first group whose prefix a key starts with takes it). COLLECTORS are the switches of the
# backend table; CLIENT the flags of `snapshot --from` and `top`.
COLLECTORS_GROUP = "collectors"
CLIENT_GROUP = "snapshot --from and top"
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("serving", ("web.",)),
    ("paths", ("path.",)),
    ("metric selection and names", ("collector.metrics.", "metric-names", "dcgm.")),
    ("collection", ("collector.", "max-processes-per-gpu", "stale-after", "macmon.")),
    (COLLECTORS_GROUP, ()),
    ("health", ("health.",)),
    ("kubernetes and slurm", ("kubernetes.", "slurm.")),
    ("otlp push", ("otlp.",)),
    ("logging", ("log.",)),
    (CLIENT_GROUP, ()),
)


def group_of(key: str) -> str:
    """The --help group of an OPTIONS key ("" where no group's prefix matches)."""
    return next((title for title, prefixes in GROUPS if key.startswith(prefixes)), "")
# Every collector switch key (old names included) -> the collector it switches.
COLLECTOR_KEYS = {f"collector.{name}": name for name in COLLECTORS} | {
    f"collector.{old}": name for old, name in ALIASES.items()}


def env_name(key: str) -> str:
    return "GPU_EXPORTER_" + re.sub(r"[.\-]", "_", key).upper()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpu-exporter", usage="gpu-exporter [snapshot|top] [flags]",
        description="Prometheus exporter for NVIDIA, AMD, Intel and Apple GPUs, per GPU and per "
        "process.", epilog=USAGE_EPILOG, formatter_class=_HelpFormatter,
        argument_default=argparse.SUPPRESS,
        allow_abbrev=False)  # --web.l would change meaning as flags are added
    p.add_argument("--version", action="version",
                   version=f"gpu-exporter {__version__} (python {platform.python_version()})")
    p.add_argument("command", nargs="?", choices=("snapshot", "top"), metavar="snapshot|top",
                   default=None, help="run one collection and print it as JSON, or watch a "
                   "running daemon in the terminal (see below)")
    p.add_argument("--config.file", dest="config.file", metavar="FILE",
                   help="YAML file with the same keys as the flags (default none)")
    groups = {title: p.add_argument_group(title) for title, _ in GROUPS}
    for title, _ in GROUPS:
        if title == COLLECTORS_GROUP:
            for row in TABLE:
                default = {None: "auto", True: "on", False: "off"}[row.default] + row.auto
                old = [f"collector.{o}" for o, name in ALIASES.items() if name == row.key]
                _add_switch(groups[title], f"collector.{row.key}",
                            f"{row.help} (default: {default})", *old)
        for o in OPTIONS:
            if group_of(o.key) == title:
                _add_option(groups[title], o)
    add_client_flags(groups[CLIENT_GROUP])
    # A flag whose prefix no group has (tests/test_flagsdoc.py fails on one) still parses.
    other = [o for o in OPTIONS if not group_of(o.key)]
    if other:
        rest = p.add_argument_group("other")
        for o in other:
            _add_option(rest, o)
    return p


def _add_option(group: argparse._ArgumentGroup, o: Option) -> None:
    if o.switch:
        _add_switch(group, o.key, o.help)
    else:
        group.add_argument(f"--{o.key}", dest=o.key, metavar=o.metavar, help=o.help,
                           action="append" if o.repeated else "store")


DEFAULT_DAEMON = "http://127.0.0.1:9445"
TOP_EPILOG = """keys (? in top lists them too):
  ← → Tab n p        select the previous / next GPU (0-9: that GPU)
  ↑ ↓ j k            scroll the processes; PgUp PgDn space: a page; Home End: ends
  s S r              sort processes by memory, utilisation, pid, user, command; reverse
  b                  the backends and their state instead of the processes
  l                  layout: auto, one row per GPU, a panel per GPU
  q Ctrl-C           quit
with --prometheus, on the node list:
  ↑ ↓ j k            select a node; PgUp PgDn space: a page; Home End: ends
  Enter →            the node's GPUs and processes (the keys above); Esc Backspace: back

needs the top extra: pip install '.[top]' in the checkout; docs/top.md"""
FLEET_GROUP = "top --prometheus"


def add_client_flags(group: argparse._ActionsContainer) -> None:
    """The flags of a client of a running daemon (``snapshot --from``, ``top``): one
    definition for the daemon's parser and top's own."""
    group.add_argument("--from", dest="from", metavar="URL",
                       help=f"the daemon: http://host:port (default {DEFAULT_DAEMON} for "
                       "top), https://user:password@host:9445 for basic auth, or "
                       "unix:/run/gpu-exporter.sock")
    group.add_argument("--tls.ca-file", dest="tls.ca-file", metavar="FILE",
                       help="https:// or unix: only: the CA that signed the daemon's "
                       "certificate, or Prometheus' for top's fleet view (default: the "
                       "system's CAs)")
    group.add_argument("--tls.insecure-skip-verify", dest="tls.insecure-skip-verify",
                       action="store_true", help="do not verify the daemon's (or "
                       "Prometheus') certificate")


def add_fleet_flags(group: argparse._ActionsContainer) -> None:
    """``top --prometheus``'s own flags (its connection besides --tls.ca-file and
    --tls.insecure-skip-verify, what it asks, its bounds): exporter.client.fleet.command."""
    group.add_argument("--prometheus", dest="prometheus", metavar="URL",
                       help="show the fleet from the Prometheus (or Thanos, Mimir, "
                       "VictoriaMetrics) API at URL that scrapes the exporters, "
                       "https://user:password@host:9090 for basic auth, instead of one "
                       "daemon (default none)")
    group.add_argument("--prometheus.http-config", dest="prometheus.http-config",
                       metavar="FILE", help="Prometheus' http_config YAML (what promtool's "
                       "--http.config.file reads): basic_auth, authorization, bearer_token, "
                       "tls_config; the flags below add to it (default none)")
    group.add_argument("--prometheus.bearer-token-file", dest="prometheus.bearer-token-file",
                       metavar="FILE", help="send Authorization: Bearer with the token in "
                       "FILE, read at each request (default none)")
    group.add_argument("--tls.cert-file", dest="tls.cert-file", metavar="FILE",
                       help="with --prometheus: the client certificate to present, with "
                       "--tls.key-file (default none)")
    group.add_argument("--tls.key-file", dest="tls.key-file", metavar="FILE",
                       help="with --prometheus: the client certificate's key (default none)")
    group.add_argument("--tls.server-name", dest="tls.server-name", metavar="NAME",
                       help="with --prometheus: the name to verify Prometheus' certificate "
                       "against and to send as SNI (default the URL's host)")
    group.add_argument("--metric-names", dest="metric-names", metavar="SCHEME",
                       help="the names the exporters' series have in Prometheus: gpu (ours), "
                       "dcgm (exporters run with --metric-names dcgm, or dcgm-exporter up to "
                       "4.8), dcgm4.9 (--metric-names dcgm4.9, or dcgm-exporter 4.9 and "
                       "later), both or both-dcgm4.9 (read as gpu) (default gpu)")
    group.add_argument("--prometheus.selector", dest="prometheus.selector",
                       metavar="MATCHERS", help="label matchers added to every selector, "
                       "e.g. 'job=\"gpu-exporter\"' or 'cluster=\"a\"' (default none)")
    group.add_argument("--prometheus.node-label", dest="prometheus.node-label",
                       metavar="LABEL", help="the label that names a node (default "
                       "instance)")
    group.add_argument("--prometheus.refresh-interval", dest="prometheus.refresh-interval",
                       metavar="DURATION", help="how often what is on the screen is loaded "
                       f"again, 1s to 1h (default {FLEET_DEFAULTS['prometheus.refresh-interval']})")
    group.add_argument("--prometheus.timeout", dest="prometheus.timeout", metavar="DURATION",
                       help="the most one query may take, connection to last byte; also "
                       f"sent as the query's timeout, 1s to 5m (default "
                       f"{FLEET_DEFAULTS['prometheus.timeout']})")
    group.add_argument("--prometheus.max-series", dest="prometheus.max-series", metavar="N",
                       help="the most series one answer may hold (also sent as the query's "
                       "limit); an answer cut there is said on the screen (default "
                       f"{FLEET_DEFAULTS['prometheus.max-series']})")


def _fleet_keys() -> frozenset[str]:
    p = argparse.ArgumentParser(add_help=False)
    add_fleet_flags(p)
    return frozenset(a.dest for a in p._actions)


FLEET_KEYS = _fleet_keys()  # the dests of top --prometheus's own flags


def build_top_parser() -> argparse.ArgumentParser:
    """``gpu-exporter top``'s own parser: its help lists its options only."""
    p = argparse.ArgumentParser(
        prog="gpu-exporter top", usage="gpu-exporter top [--from URL | --prometheus URL] "
        "[--tls.ca-file FILE] [--tls.insecure-skip-verify] [flags]",
        description="A full-screen terminal dashboard of a running gpu-exporter: every "
        "GPU's state, values and health, and the selected GPU's processes, refreshed from "
        "its /api/v1/history every collection interval. With --prometheus, the fleet: "
        "a row per node, most waste first, and a node's GPUs and processes.",
        epilog=TOP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=argparse.SUPPRESS, allow_abbrev=False)
    p.add_argument("command", choices=("top",), metavar="top", help=argparse.SUPPRESS)
    p.add_argument("--version", action="version",
                   version=f"gpu-exporter {__version__} (python {platform.python_version()})")
    add_client_flags(p)
    add_fleet_flags(p.add_argument_group(FLEET_GROUP))
    return p


def command_of(argv: Sequence[str], parser: argparse.ArgumentParser) -> str | None:
    """The command word of ``argv`` (the first argument that is neither a flag nor a
    flag's value), before anything is parsed: ``top`` has a parser of its own."""
    takes_value = {option for option, action in parser._option_string_actions.items()
                   if action.nargs != 0}
    value = False
    for arg in argv:
        if value:
            value = False
        elif arg == "--":
            return None
        elif arg.startswith("-"):
            value = "=" not in arg and arg in takes_value
        else:
            return arg
    return None


class _Switch(argparse.Action):
    """``--key`` stores True, ``--no-key`` False; the last one given wins."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, not (option_string or "").startswith("--no-"))


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows a switch as ``--[no-]collector.nvidia``."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, _Switch):
            return ", ".join(f"--[no-]{o[2:]}" for o in action.option_strings
                             if not o.startswith("--no-"))
        return super()._format_action_invocation(action)


def _add_switch(p: argparse.ArgumentParser | argparse._ArgumentGroup, key: str, help: str,
                *aliases: str) -> None:
    names = [f"--{prefix}{k}" for k in (key, *aliases) for prefix in ("", "no-")]
    p.add_argument(*names, dest=key, action=_Switch, nargs=0, help=help)


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings -> dotted keys. A key can be a switch and a prefix at once
    (``collector: {processes: {interval: 3s}}``): a mapping is always a prefix."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def read_config_file(path: str, origin: str) -> dict[str, Any]:
    flat = _flatten(load_yaml_mapping(origin, path))
    for key in flat:
        if key not in KEYS and key not in COLLECTOR_KEYS:
            raise ConfigError(f"{path}: {key}", "unknown key")
    return flat


ENV_PREFIX = "GPU_EXPORTER_"


# The variables a kubelet gives every container for every Service of its namespace
# (kubernetes pkg/kubelet/envvars/envvars.go, FromServices): the Service name upper-cased
# with "-" as "_", then SERVICE_HOST (the cluster IP), SERVICE_PORT (the first port),
# SERVICE_PORT_<port name>, and the Docker-link set (makeLinkVariables) PORT (the first
# port's URL), PORT_<port>_<PROTO> (its URL), ..._PROTO, ..._PORT and ..._ADDR. A Service
# named like ours (the chart's and the manifests' own) gives GPU_EXPORTER_SERVICE_HOST,
# GPU_EXPORTER_PORT, ... These name no flag: they are told apart by name and value
# together, each value in the exact form the kubelet writes (Docker's own legacy links,
# <ALIAS>_NAME and <ALIAS>_ENV_<VAR>, are never set by a kubelet: not skipped).
_LINK_PREFIX = re.compile(r"[A-Z][A-Z0-9_]*")  # a Service name (DNS-1035), as a variable
_LINK_SUFFIX = re.compile(
    r"_(?:(?P<host>SERVICE_HOST)|SERVICE_PORT(?:_[A-Z0-9_]+)?|(?P<url>PORT)"
    r"|PORT_(?P<port>[1-9][0-9]{0,4})_(?P<proto>TCP|UDP|SCTP)(?:_(?P<field>PROTO|PORT|ADDR))?)")


def _cluster_ip(text: str) -> bool:
    """An IPv4 or IPv6 address as a Service's ``spec.clusterIP`` holds it."""
    import ipaddress

    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return "%" not in text  # a zone (fe80::1%eth0) is never a cluster IP


def _port(text: str) -> bool:
    return re.fullmatch(r"[1-9][0-9]{0,4}", text) is not None and int(text) <= 65535


def _link_url(text: str, port: str | None = None, proto: str | None = None) -> bool:
    """``<proto>://<ip>:<port>`` as Go's net.JoinHostPort writes it (IPv6 in brackets)."""
    match = re.fullmatch(r"(tcp|udp|sctp)://(?:\[([0-9a-fA-F:.]+)\]|([0-9.]+)):([0-9]+)", text)
    if match is None or not _port(match[4]) or (port is not None and match[4] != port):
        return False
    if proto is not None and match[1] != proto.lower():
        return False
    ip = match[2] or match[3]
    return _cluster_ip(ip) and (":" in ip) == (match[2] is not None)


def _link_suffixes(name: str) -> list[re.Match[str]]:
    """Every way ``name`` reads as a Service name plus a link suffix (a Service may be
    named ``x-port`` or ``x-service``: each split is tried)."""
    out = []
    for i, c in enumerate(name):
        if c == "_" and _LINK_PREFIX.fullmatch(name[:i]):
            match = _LINK_SUFFIX.fullmatch(name, i)
            if match is not None:
                out.append(match)
    return out


def is_service_link(name: str, value: str) -> bool:
    """Whether ``name=value`` is a variable the kubelet sets for a Service: its name's
    shape and its value's exact form (never a flag: no flag's variable has these names)."""
    return any(_link_value(match, value) for match in _link_suffixes(name))


def _link_value(match: re.Match[str], value: str) -> bool:
    if match["host"]:
        return _cluster_ip(value)
    if match["url"]:
        return _link_url(value)
    port, proto, field = match["port"], match["proto"], match["field"]
    if port is None:  # SERVICE_PORT, SERVICE_PORT_<name>
        return _port(value)
    if field is None:
        return _link_url(value, port, proto)
    if field == "PROTO":
        return value == proto.lower()
    if field == "PORT":
        return value == port
    return _cluster_ip(value)


def _known_variables() -> dict[str, str]:
    """Every variable that names a key -> the key."""
    return {env_name(key): key for key in (*KEYS, *COLLECTOR_KEYS, "config.file")}


def ignored_variables(environ: Mapping[str, str]) -> list[str]:
    """The ``GPU_EXPORTER_*`` variables skipped as the kubelet's Service links, sorted:
    the daemon names them in one line at start."""
    known = _known_variables()
    return [name for name in sorted(environ) if name.startswith(ENV_PREFIX)
            and name not in known and is_service_link(name, environ[name])]


def _check_environment(environ: Mapping[str, str]) -> None:
    """A ``GPU_EXPORTER_*`` variable that names no key is a typo: an error, as in the file.
    The kubelet's Service-link variables (``is_service_link``) are not typos: skipped. A
    variable named as a flag's plus a link suffix whose value is not the link's exact form
    is a flag's variable gone wrong (``..._ADDRESS_PORT=:9445``): said so."""
    known = _known_variables()
    for name in sorted(environ):
        if name.startswith(ENV_PREFIX) and name not in known:
            if is_service_link(name, environ[name]):
                continue
            var = max((v for v in known if name.startswith(v + "_")), key=len, default=None)
            if var is not None and _link_suffixes(name):
                raise ConfigError(name, f"unknown variable: {var} (--{known[var]}) with the "
                                  f"suffix {name.removeprefix(var)} of a Kubernetes Service "
                                  "link, but its value is not that link's")
            switch = ENV_PREFIX + name.removeprefix(ENV_PREFIX + "NO_")
            if name.startswith(ENV_PREFIX + "NO_") and switch in known:
                # --no-collector.x is a command-line form only: a variable holds a value.
                raise ConfigError(name, f"unknown variable: use {switch}=false")
            raise ConfigError(name, "unknown variable (every GPU_EXPORTER_* names a flag; "
                                    "see gpu-exporter --help)")


def load_config(argv: Sequence[str], environ: Mapping[str, str]) -> Config:
    return load_args(vars(build_parser().parse_args(list(argv))), environ)


def load_args(args: dict[str, Any], environ: Mapping[str, str]) -> Config:
    """The Config from parsed flags (``vars`` of ``build_parser``'s namespace), the
    environment and the config file either names."""
    _check_environment(environ)
    config_file = args.get("config.file") or environ.get(env_name("config.file"))
    from_file = read_config_file(config_file, "config.file") if config_file else {}

    values: dict[str, Any] = {"config_file": config_file}
    collectors = dict(COLLECTORS)

    def given(keys: Sequence[str]) -> tuple[str, Any] | None:
        """(origin, raw value) of the first of ``keys`` set, flag > env > file."""
        for key in keys:
            if key in args:
                return f"--{key}", args[key]
        for key in keys:
            if env_name(key) in environ:
                return env_name(key), environ[env_name(key)]
        for key in keys:
            if key in from_file:
                return f"{config_file}: {key}", from_file[key]
        return None

    for key, option in KEYS.items():
        if (found := given([key])) is not None:
            values[option.field] = option.parse(*found)
    for name in COLLECTORS:
        keys = [k for k, n in COLLECTOR_KEYS.items() if n == name]  # its own key first
        if (found := given(keys)) is not None:
            collectors[name] = parse_bool(*found)
    values["collectors"] = collectors
    config = Config(**values)
    if config.web_config_file is not None:
        from exporter.serve.webconfig import load_web_config

        load_web_config(config.web_config_file)  # validate now: fail before binding
    return config
