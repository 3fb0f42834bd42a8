"""Command line: ``main``, the commands and the checks made before anything starts.

The flags, the ``GPU_EXPORTER_*`` environment and ``--config.file`` are read into a
Config by exporter.app.flags (precedence flag > environment > file > default). Bad input
exits 2 with one line naming the key and where it came from; never a traceback.

``main`` parses, then hands the Config to ``exporter.app.daemon.Daemon``, which builds,
starts and stops everything.
"""

from __future__ import annotations

if __name__ == "__main__":  # python -m exporter.app.cli: hold SIGHUP before the heavy imports
    from exporter.app.early import hold_sighup

    hold_sighup()

import argparse
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from exporter.app.flags import (
    DEFAULT_DAEMON,
    FLEET_KEYS,
    build_parser,
    build_top_parser,
    command_of,
    ignored_variables,
    load_args,
)
from exporter.core.config import Config, ConfigError


def unknown_flag(parser: argparse.ArgumentParser, argv: Sequence[str]) -> str | None:
    """The first argument that looks like a flag and is none, with the nearest flag as a
    hint; None when every one is known. Checked before parsing: argparse would take the
    misspelt flag's value for the ``snapshot`` command and say that instead."""
    known = parser._option_string_actions  # every spelling, --no- forms included
    for arg in argv:
        if arg == "--":
            return None
        if not arg.startswith("-") or arg == "-" or re.fullmatch(r"-\d[\d.e]*", arg):
            continue
        name = arg.split("=", 1)[0]
        if name in known:
            continue
        import difflib  # only for a mistyped flag

        close = difflib.get_close_matches(name, [k for k in known if k.startswith("--")], 1)
        return f"unrecognized argument {name}" + (f" (did you mean {close[0]}?)"
                                                   if close else "")
    return None


def missing_paths(config: Config) -> str | None:
    """A --path.sysfs or --path.procfs given that is not a directory: a forgotten
    container mount would otherwise look like a machine without GPUs. The defaults are
    not checked (a Mac has no /sys; the Apple backend does not read it). An
    --otlp.ca-file that is not a file untrusted_file would read (a FIFO would hold the
    push thread in the TLS library's open() for good)."""
    defaults = Config()
    for key, path, default in (("path.sysfs", config.sysfs, defaults.sysfs),
                               ("path.procfs", config.procfs, defaults.procfs)):
        if path != default and not os.path.isdir(path):
            what = "does not exist" if not os.path.lexists(path) else "is not a directory"
            return (f"--{key}: {path} {what} (in a container: is the host's "
                    f"/{key.split('.')[1].removesuffix('fs')} mounted there?)")
    if config.otlp_ca_file is not None:
        from exporter.core import untrusted_file

        try:
            untrusted_file.check(config.otlp_ca_file, untrusted_file.PEM)
        except OSError as e:
            return f"--otlp.ca-file: {e}"
    return None


def _fail(message: str) -> int:
    print(f"gpu-exporter: error: {message}", file=sys.stderr)
    return 2


def _quiet_backend_down() -> None:
    """``snapshot``: each backend's state and reason are in the JSON printed; the
    "backend down" log lines would only say it again on stderr."""
    import structlog

    def drop(logger: object, method: str, event: Any) -> Any:
        if event.get("event") == "backend down":
            raise structlog.DropEvent
        return event

    processors = structlog.get_config()["processors"]
    structlog.configure(processors=[drop, *processors])


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    environ = os.environ if environ is None else environ
    parser = build_parser()
    if command_of(argv, parser) == "top":  # a client with flags of its own
        parser = build_top_parser()
    if (unknown := unknown_flag(parser, argv)) is not None:
        return _fail(unknown)
    args = vars(parser.parse_args(argv))
    command = args.pop("command", None) or "run"
    source = args.pop("from", None)
    ca_file = args.pop("tls.ca-file", None)
    insecure = bool(args.pop("tls.insecure-skip-verify", False))
    if command == "top":  # a client of a running daemon: no collection, no config
        fleet = {k: str(args.pop(k)) for k in list(args) if k in FLEET_KEYS}
        prometheus = fleet.pop("prometheus", None)
        if prometheus is None and fleet:
            return _fail(f"--{sorted(fleet)[0]}: only with top --prometheus")
        if prometheus is not None and source is not None:
            return _fail("--from and --prometheus: one daemon or the fleet, not both")
        try:
            if prometheus is not None:
                from exporter.client.fleet import command as fleettop
            else:
                from exporter.client.top.command import main as top
        except ImportError as e:
            return _fail(f"top needs the top extra: pip install '.[top]' in the "
                         f"gpu-exporter checkout ({e})")
        if prometheus is not None:
            from exporter.client.fleet.flags import connect

            try:
                api, query = connect(prometheus, fleet, ca_file, insecure)
            except ConfigError as e:
                return _fail(f"--{e}")
            return fleettop.main(api, query)
        return top(source or DEFAULT_DAEMON, ca_file=ca_file, insecure=insecure)
    # structlog imports rich where it is installed (the top extra) for its console
    # tracebacks, about 5 MiB the daemon has no use for (its logs are logfmt or JSON).
    sys.modules.setdefault("rich", None)  # type: ignore[arg-type]
    if source is not None and command != "snapshot":
        return _fail("--from: only with the snapshot or top command")
    if source is None and (ca_file is not None or insecure):
        return _fail("--tls.ca-file, --tls.insecure-skip-verify: only with snapshot --from or top")
    try:
        config = load_args(args, environ)
    except ConfigError as e:
        return _fail(str(e))
    if (missing := missing_paths(config)) is not None:
        return _fail(missing)
    if config.otlp_only and config.otlp_endpoint is None:
        return _fail("--otlp.only: needs --otlp.endpoint")
    if config.otlp_endpoint is not None and command == "run":
        try:  # the otlp extra: fail now, in one line, not at the first push
            import exporter.output.otlp  # noqa: F401
        except ImportError as e:
            return _fail(f"--otlp.endpoint needs the otlp extra: pip install '.[otlp]' in "
                         f"the gpu-exporter checkout ({e})")
    if source is not None:
        from exporter.client.fetch import fetch_snapshot, redact_url

        try:
            sys.stdout.buffer.write(fetch_snapshot(source, ca_file=ca_file,
                                                   insecure=insecure) + b"\n")
        except OSError as e:
            return _fail(f"--from {redact_url(source)}: {e}")
        return 0

    from exporter.core import logs

    logs.configure(config.log_level, config.log_format)
    if ignored := ignored_variables(environ):  # said once, never silently skipped
        import structlog

        structlog.get_logger(__name__).info(
            "environment: Kubernetes Service-link variables ignored",
            variables=ignored)
    if command == "snapshot":
        _quiet_backend_down()
    from exporter.output.render.selection import load_selection

    try:
        selection = load_selection(config.metrics_include, config.metrics_exclude,
                                   config.metric_names, config.dcgm_counters)
    except (OSError, ValueError) as e:
        return _fail(f"--dcgm.counters: {e}" if isinstance(e, OSError) else str(e))
    from exporter.app.daemon import Daemon

    daemon = Daemon(config, selection)
    daemon.reread = lambda: load_args(args, environ)  # what a SIGHUP reads again
    missing = daemon.check()
    if missing:
        daemon.stop(timeout=0)
        return _fail(missing)
    if command == "snapshot":
        from exporter.serve.snapshot import snapshot_json

        snapshot = daemon.collect_once()
        sys.stdout.buffer.write(snapshot_json(snapshot, indent=2) + b"\n")
        return 0
    from exporter.app.lastrun import RunRecord, state_dir

    directory = state_dir(config.state_dir, environ)
    record = RunRecord(directory) if directory else None
    if record is not None:
        record.start()
    code = daemon.run()
    if record is not None:
        record.stop()  # any orderly return logged its own reason: only a crash skips this
    return code


if __name__ == "__main__":
    sys.exit(main())
