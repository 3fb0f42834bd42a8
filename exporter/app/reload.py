"""Live reload: SIGHUP re-reads the web config and ``--config.file``; a changed web
config (or its certificate and key files) is picked up when a connection arrives.

What changes live: the basic-auth users and their hashes, the TLS certificate and key
(as exporter-toolkit reloads its web config), ``log.level``,
``max-processes-per-gpu`` and the metric selection (``collector.metrics.include``/
``exclude``, ``dcgm.counters``: the counters file is read again on every SIGHUP, the
renderer swaps to the new selection at once). Everything else that differs is named in
the same one log line as needing a restart and keeps its old value. A file that does not load keeps
every old setting, and ``gpu_exporter_config_last_reload_successful`` says 0 until a
reload succeeds, as in Prometheus. Switching TLS or basic auth on or off needs a
restart: the server's middlewares and listeners are built at start.

The work runs on a thread of its own: the signal handler and the connection hook only
set a flag and wake it (a signal handler that took a lock held by the code it
interrupted would deadlock the event loop).
"""

from __future__ import annotations

import dataclasses
import os
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

from exporter.core import logs
from exporter.core.config import Config, ConfigError
from exporter.output.render.selection import Selection, load_selection
from exporter.serve.webconfig import WebConfig, load_web_config, tls_context

log = structlog.get_logger(__name__)

# Config fields applied without a restart (``apply`` gets the new Config): those the Hub
# and the logs take, and those a Selection is made of (exporter.output.render.selection).
HUB_LIVE = ("log_level", "max_processes_per_gpu")
SELECTION = ("metrics_include", "metrics_exclude", "dcgm_counters")
LIVE = (*HUB_LIVE, *SELECTION)
# WebConfig fields replaced live; the others need a restart. The certificate's own:
TLS_FILES = ("cert_file", "key_file", "cert_pem", "key_pem")
WEB_LIVE = ("basic_auth_users", *TLS_FILES, "warnings")
CHECK_EVERY = 1.0  # seconds between two looks at the web config's files


class Reloader:
    """The settings being served, and the thread that replaces them."""

    def __init__(self, config: Config, web: WebConfig | None, reread: Callable[[], Config],
                 apply: Callable[[Config], None], selection: Selection | None = None,
                 select: Callable[[Selection], None] | None = None) -> None:
        self.config = config
        # The metric selection being served, and who serves it (Renderer.select).
        self.selection = selection or Selection(config.metrics_include, config.metrics_exclude)
        self.select = select
        self.web = web
        self.reread = reread  # flags, environment and --config.file again -> Config
        self.apply = apply
        self.passwords: Any = None  # the server's PasswordChecker, with basic auth
        self._context = tls_context(web) if web is not None and web.tls else None
        self.successful = True
        self.success_at = time.time()
        self._signature = self._files()
        self._checked = time.monotonic()
        self._wanted: set[str] = set()
        self._wake = threading.Event()
        self._stop = False
        self.thread = threading.Thread(target=self._run, name="reload", daemon=True)

    # -- what the server reads -------------------------------------------------------------
    def context(self) -> ssl.SSLContext | None:
        """The TLS context for the next connection."""
        return self._context

    def status(self) -> tuple[bool, float]:
        return self.successful, self.success_at

    # -- triggers (signal handler, event loop): set a flag, never block ---------------------
    def request(self, reason: str) -> None:
        self._wanted.add(reason)
        self._wake.set()

    def on_connection(self) -> None:
        """A connection arrived: reload the web config if its files changed (one look a
        second at most: a few stat() calls)."""
        now = time.monotonic()
        if self.config.web_config_file is None or now - self._checked < CHECK_EVERY:
            return
        self._checked = now
        if self._files() != self._signature:
            self.request("web")

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """The thread ends once a reload in progress is done (waited for up to ``timeout``)."""
        self._stop = True
        self._wake.set()
        if self.thread.ident is not None:
            self.thread.join(timeout)

    # -- the reload thread ----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stop:
                return
            wanted, self._wanted = self._wanted, set()
            try:
                self.reload(full="sighup" in wanted)
            except Exception as e:  # noqa: BLE001 - a bug here must not end all later reloads
                self.successful = False
                log.error("configuration reload failed: old settings kept", error=repr(e),
                          exc_info=True)

    def _files(self) -> tuple[tuple[str, int, int, int] | None, ...]:
        """(path, inode, size, mtime) of the web config and the files it names."""
        web = self.web
        paths = [self.config.web_config_file] + ([web.cert_file, web.key_file] if web else [])
        out: list[tuple[str, int, int, int] | None] = []
        for path in paths:
            try:
                st = os.stat(path) if path else None
            except OSError:
                st = None
            out.append(None if st is None or path is None else
                       (path, st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(out)

    def reload(self, full: bool = True) -> bool:
        """Re-read the web config, and with ``full`` the flags/environment/config file.
        One log line; the old settings stay where anything fails to load."""
        before, self._signature = self._signature, self._files()  # later changes: next time
        changed: list[str] = []
        restart: list[str] = []
        try:
            config = self.reread() if full else self.config
            web = load_web_config(config.web_config_file) \
                if config.web_config_file is not None else None
            context = self._web_changes(web, before != self._signature, changed, restart)
            self._config_changes(config, changed, restart)
            selection = self._selection(config, full, changed)
        except (ConfigError, ssl.SSLError, OSError, ValueError) as e:  # ValueError: a CSV
            self.successful = False
            log.error("configuration reload failed: old settings kept", error=str(e))
            self.apply(self.config)  # the same settings, served with the new status
            return False
        # Everything loaded: now replace, all at once.
        if web is not None and self.web is not None:
            self.web = dataclasses.replace(self.web, **{f: getattr(web, f) for f in WEB_LIVE})
            if self.passwords is not None and "basic_auth_users" in changed:
                self.passwords.replace_users(web.basic_auth_users)
            if context is not None:
                self._context = context
        live = {f: getattr(config, f) for f in LIVE}
        self.config = dataclasses.replace(self.config, **live)
        self.successful, self.success_at = True, time.time()
        if selection is not None:
            self.selection = selection
            if self.select is not None:
                self.select(selection)
        self.apply(self.config)
        log.info("configuration reloaded", trigger="SIGHUP" if full else "web config changed",
                 changed=changed, needs_restart=restart)
        self._signature = self._files()  # the new web config may name other files
        return True

    def _web_changes(self, web: WebConfig | None, files_changed: bool, changed: list[str],
                     restart: list[str]) -> ssl.SSLContext | None:
        """Names what differs; a new TLS context (the old settings, the new certificate
        and key) when TLS is on."""
        old = self.web
        if (old is None) != (web is None):
            restart.append("web.config.file")
            return None
        if old is None or web is None:
            return None
        for f in dataclasses.fields(WebConfig):
            if f.name in WEB_LIVE or getattr(old, f.name) == getattr(web, f.name):
                continue
            restart.append(f"web config {f.name}")
        if old.basic_auth_users != web.basic_auth_users:
            if old.basic_auth_users and web.basic_auth_users and self.passwords is not None:
                changed.append("basic_auth_users")
            else:  # switching auth on or off: the middleware is built at start
                restart.append("basic_auth_users")
        if old.tls != web.tls:
            restart.append("tls_server_config")
            return None
        if not web.tls:
            return None
        if files_changed or any(getattr(old, f) != getattr(web, f) for f in TLS_FILES):
            changed.append("tls certificate")
        return tls_context(dataclasses.replace(old, **{f: getattr(web, f) for f in WEB_LIVE}))

    def _selection(self, config: Config, full: bool, changed: list[str]) -> Selection | None:
        """A new Selection when include/exclude changed or a counters file is read again
        (its content may have changed under the same name); None: keep the old one.
        Raises what load_selection raises, so a bad file keeps the old selection."""
        moved = any(getattr(self.config, f) != getattr(config, f) for f in SELECTION)
        if not moved and not (full and config.dcgm_counters is not None):
            return None
        selection = load_selection(config.metrics_include, config.metrics_exclude,
                                   self.config.metric_names,  # needs a restart
                                   config.dcgm_counters)
        old = self.selection.dcgm_fields
        if not moved and selection.dcgm_fields == old:
            return None
        if selection.dcgm_fields != old and "dcgm.counters" not in changed:
            changed.append("dcgm.counters")  # the same file name, new content
        return selection

    def _config_changes(self, config: Config, changed: list[str], restart: list[str]) -> None:
        """Named as the user writes them: ``log.level``, ``collector.interval``."""
        from exporter.app.flags import KEYS

        key_of = {o.field: o.key for o in KEYS.values()}
        for f in dataclasses.fields(Config):
            old, new = getattr(self.config, f.name), getattr(config, f.name)
            if f.name == "web_config_file" or old == new:
                continue
            if f.name == "collectors":
                restart.extend(f"collector.{name}" for name in sorted(new)
                               if old.get(name) != new.get(name))
                continue
            (changed if f.name in LIVE else restart).append(key_of.get(f.name, f.name))


def apply_live(hub: Any) -> Callable[[Config], None]:
    """What a reload changes in a running daemon: the log level, the Hub's process cap;
    then a snapshot is published, so the cap and the reload gauges are served at once."""

    def apply(config: Config) -> None:
        logs.set_level(config.log_level)
        hub.config = dataclasses.replace(
            hub.config, max_processes_per_gpu=config.max_processes_per_gpu)
        hub.request_publish()

    return apply
