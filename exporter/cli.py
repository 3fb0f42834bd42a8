"""Command line: flags, ``GPU_EXPORTER_*`` environment, ``--config.file`` YAML.

Precedence is flag > environment > file > default. Every key has one name
(``collector.interval``); the flag is ``--collector.interval``, the variable
``GPU_EXPORTER_COLLECTOR_INTERVAL`` and the file key ``collector.interval`` (or
nested: ``collector: {interval: 1s}``). Bad input exits 2 with one line naming
the key and where it came from; never a traceback.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from exporter import __version__
from exporter.config import (
    COLLECTORS,
    LOG_FORMATS,
    LOG_LEVELS,
    METRIC_NAMES,
    Config,
    ConfigError,
    bounded_duration,
    load_yaml_mapping,
    parse_bool,
    parse_choice,
    parse_headers,
    parse_listen_address,
    parse_path,
    parse_positive_int,
    parse_telemetry_path,
    parse_url,
)

HOUR = 3600.0
DAY = 24 * HOUR
USAGE_EPILOG = """commands:
  (none)      run the exporter daemon
  snapshot    run one collection and print it as JSON, with each backend's state and the
              reason a backend is off: the first thing to run when a metric is missing.
              With --from URL, print what the running daemon sees (inside a container
              its view of the host differs from a fresh process's)

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
    Option("path.amdgpu-ids", "amdgpu_ids", parse_path,
           "libdrm's amdgpu.ids, the AMD marketing-name table (default "
           "usr/share/libdrm/amdgpu.ids beside the sysfs root)", "FILE"),
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
    Option("log.level", "log_level", lambda k, v: parse_choice(k, v, LOG_LEVELS),
           "debug, info, warning or error (default info)", "LEVEL"),
    Option("log.format", "log_format", lambda k, v: parse_choice(k, v, LOG_FORMATS),
           "json, console or auto: console on a terminal (default auto)", "FORMAT"),
    Option("metric-names", "metric_names", lambda k, v: parse_choice(k, v, METRIC_NAMES),
           "gpu (default), dcgm (dcgm-exporter's DCGM_FI_* names) or both", "SCHEME"),
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
    Option("macmon.path", "macmon_path", parse_path,
           "Apple Silicon: the macmon executable run as `macmon pipe` (default macmon on PATH)",
           "PATH"),
    # OTLP push (exporter/otlp.py, docs/otlp.md): needs the otlp extra.
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
COLLECTOR_HELP = {
    "nvidia": "NVIDIA GPUs through NVML",
    "amd": "AMD GPUs through amdgpu sysfs and hwmon",
    "intel": "Intel GPUs through i915/xe sysfs and hwmon",
    "processes": "per-process GPU use from /proc/<pid>/fdinfo",
    "gpm": "NVIDIA GPM profiling metrics (Hopper and later)",
    "apple": "Apple Silicon GPUs through macmon (auto: on macOS when macmon is found)",
    "level-zero": "Intel GPUs through Level Zero Sysman",
    "amdsmi": "AMD GPUs through the amdsmi library",
    "kubernetes": "pod attribution from the kubelet and the CRI runtime",
}
KEYS = {o.key: o for o in OPTIONS}
COLLECTOR_KEYS = {f"collector.{name}": name for name in COLLECTORS}


def env_name(key: str) -> str:
    return "GPU_EXPORTER_" + re.sub(r"[.\-]", "_", key).upper()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpu-exporter", usage="gpu-exporter [snapshot] [flags]",
        description="Prometheus exporter for NVIDIA, AMD, Intel and Apple GPUs, per GPU and per "
        "process.", epilog=USAGE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=argparse.SUPPRESS)
    p.add_argument("--version", action="version",
                   version=f"gpu-exporter {__version__} (python {platform.python_version()})")
    p.add_argument("command", nargs="?", choices=("snapshot",), metavar="snapshot", default=None,
                   help="run one collection and print it as JSON (see below)")
    p.add_argument("--from", dest="from", metavar="URL",
                   help="snapshot only: print the running daemon's /snapshot instead "
                   "(e.g. http://127.0.0.1:9445; user:password@ for basic auth)")
    p.add_argument("--config.file", dest="config.file", metavar="FILE",
                   help="YAML file with the same keys as the flags")
    for o in OPTIONS:
        if o.switch:
            _add_switch(p, o.key, o.help)
        else:
            p.add_argument(f"--{o.key}", dest=o.key, metavar=o.metavar, help=o.help,
                           action="append" if o.repeated else "store")
    for key, name in COLLECTOR_KEYS.items():
        default = {None: "auto", True: "on", False: "off"}[COLLECTORS[name]]
        _add_switch(p, key, f"enable {COLLECTOR_HELP[name]} (default: {default})")
    return p


def _add_switch(p: argparse.ArgumentParser, key: str, help: str) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument(f"--{key}", dest=key, action="store_const", const=True, help=help)
    group.add_argument(f"--no-{key}", dest=key, action="store_const", const=False,
                       help=argparse.SUPPRESS)


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


def _check_environment(environ: Mapping[str, str]) -> None:
    """A ``GPU_EXPORTER_*`` variable that names no key is a typo: an error, as in the file."""
    known = {env_name(key) for key in (*KEYS, *COLLECTOR_KEYS, "config.file")}
    for name in sorted(environ):
        if name.startswith(ENV_PREFIX) and name not in known:
            raise ConfigError(name, "unknown variable (every GPU_EXPORTER_* names a flag; "
                                    "see gpu-exporter --help)")


def load_config(argv: Sequence[str], environ: Mapping[str, str]) -> Config:
    return _load(vars(build_parser().parse_args(list(argv))), environ)


def _load(args: dict[str, Any], environ: Mapping[str, str]) -> Config:
    _check_environment(environ)
    config_file = args.get("config.file") or environ.get(env_name("config.file"))
    from_file = read_config_file(config_file, "config.file") if config_file else {}

    values: dict[str, Any] = {"config_file": config_file}
    collectors = dict(COLLECTORS)
    for key in [*KEYS, *COLLECTOR_KEYS]:
        if key in args:
            origin, raw = f"--{key}", args[key]
        elif env_name(key) in environ:
            origin, raw = env_name(key), environ[env_name(key)]
        elif key in from_file:
            origin, raw = f"{config_file}: {key}", from_file[key]
        else:
            continue
        if key in COLLECTOR_KEYS:
            collectors[COLLECTOR_KEYS[key]] = parse_bool(origin, raw)
        else:
            values[KEYS[key].field] = KEYS[key].parse(origin, raw)
    values["collectors"] = collectors
    config = Config(**values)
    if config.web_config_file is not None:
        from exporter.webconfig import load_web_config

        load_web_config(config.web_config_file)  # validate now: fail before binding
    return config


def _fail(message: str) -> int:
    print(f"gpu-exporter: error: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    environ = os.environ if environ is None else environ
    args = vars(build_parser().parse_args(argv))
    command = args.pop("command", None) or "run"
    source = args.pop("from", None)
    if source is not None and command != "snapshot":
        return _fail("--from: only with the snapshot command")
    try:
        config = _load(args, environ)
    except ConfigError as e:
        return _fail(str(e))
    if config.otlp_only and config.otlp_endpoint is None:
        return _fail("--otlp.only: needs --otlp.endpoint")
    if config.otlp_endpoint is not None and command == "run":
        try:  # the otlp extra: fail now, in one line, not at the first push
            import exporter.otlp  # noqa: F401
        except ImportError as e:
            return _fail(f"--otlp.endpoint needs the otlp extra: pip install "
                         f"'gpu-exporter[otlp]' ({e})")
    if source is not None:
        from exporter.snapshot import fetch_snapshot

        try:
            sys.stdout.buffer.write(fetch_snapshot(source) + b"\n")
        except OSError as e:
            return _fail(f"--from {source}: {e}")
        return 0

    from exporter import logs
    from exporter.backends import build_backends
    from exporter.collector import Hub

    logs.configure(config.log_level, config.log_format)
    backends = build_backends(config)
    missing = _forced_but_unavailable(config, backends)
    if missing:
        return _fail(missing)
    hub = Hub(config, backends)
    if command == "snapshot":
        from exporter.snapshot import snapshot_json

        snapshot = hub.collect_once()
        hub.stop(timeout=0)
        sys.stdout.buffer.write(snapshot_json(snapshot, indent=2) + b"\n")
        return 0
    return run_daemon(config, hub)


def _forced_but_unavailable(config: Config, backends: Sequence[Any]) -> str | None:
    """A collector switched on by the operator must work at start, not act as auto.

    Its backend is opened once (and closed) before serving: a missing library, driver
    or device is then an error, with the backend's own reason.
    """
    from exporter.backends import BackendUnavailable

    for backend in backends:
        if config.collector_enabled(backend.name.replace("_", "-")) is not True:
            continue
        try:
            backend.open()
        except BackendUnavailable as e:
            return f"--collector.{backend.name.replace('_', '-')} is on but unavailable: {e}"
        except Exception as e:  # noqa: BLE001 - the same: say it in one line
            return f"--collector.{backend.name.replace('_', '-')} is on but failed: {e!r}"
        finally:
            try:
                backend.close()
            except Exception:  # noqa: BLE001
                pass
    return None


M_ARENA_MAX = -8  # glibc's mallopt() parameter (malloc.h)


def limit_malloc_arenas(arenas: int = 2) -> None:
    """At most ``arenas`` glibc malloc arenas, before any thread starts.

    glibc gives each thread that allocates its own arena (up to 8 x cores), and each
    keeps pages resident: 5 MiB of the daemon's RSS on the H100 (bench/memory.py). The
    same as MALLOC_ARENA_MAX=2, which the unit, image and chart also set; here it holds
    for a plain ``pip install`` too. An explicit MALLOC_ARENA_MAX wins. No-op off glibc.
    """
    if "MALLOC_ARENA_MAX" in os.environ or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.mallopt(M_ARENA_MAX, arenas)
    except (OSError, AttributeError):
        pass


def raise_open_files_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit: connections must not starve the backends."""
    try:
        import resource
    except ImportError:  # not on this platform
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError):
            pass


def run_daemon(config: Config, hub: Any) -> int:
    import signal

    import structlog

    from exporter.render import Renderer, RenderOptions
    from exporter.server import bind_sockets, build_app, close_sockets, serve, unix_files
    from exporter.webconfig import load_web_config

    log = structlog.get_logger("exporter.cli")
    limit_malloc_arenas()
    options = RenderOptions(
        pod_labels=any(b.name == "kubernetes" for b in hub.backends),
        device_pod_labels=config.kubernetes_device_labels, metric_names=config.metric_names)
    pusher = None
    if config.otlp_endpoint is not None:
        from exporter.otlp import Pusher, run_push_only

        pusher = Pusher(config, hub, options)
        if config.otlp_only:
            return run_push_only(hub, pusher)
    web = load_web_config(config.web_config_file) if config.web_config_file else None
    for warning in web.warnings if web else ():
        log.warning("web config", note=warning)
    raise_open_files_limit()
    try:
        sockets = bind_sockets(config.listen_addresses)
    except OSError as e:
        print(f"gpu-exporter: error: cannot listen on {e.strerror or e}", file=sys.stderr)
        return 1
    files = unix_files(sockets)
    if hasattr(signal, "SIGHUP"):
        # The configuration is read at start; a SIGHUP (a log rotation, a terminal that
        # closed) must not kill the daemon silently.
        signal.signal(signal.SIGHUP, lambda *_: log.info(
            "SIGHUP ignored", hint="configuration is read at start: restart to apply changes"))
    # Render ahead only the snapshot that precedes a scrape: one collection interval.
    renderer = Renderer(lead=config.interval, options=options)
    if pusher is not None:
        renderer.otlp = pusher.status
        renderer.cpu_threads["otlp"] = [pusher.thread]
        pusher.start()
    try:
        serve(config, build_app(config, hub, renderer, web), web, sockets)
    finally:
        if pusher is not None:
            pusher.stop()
        close_sockets(sockets, files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
