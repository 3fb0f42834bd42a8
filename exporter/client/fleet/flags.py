"""``gpu-exporter top --prometheus``'s flags: their defaults (for --help, README's tables
and the client) and ``connect``, which turns them into the Prometheus API client and what
to ask. No terminal library here: exporter.app.flags reads the defaults, and a bad flag
is refused before the terminal is touched."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.core import untrusted_file
from exporter.core.config import (
    ConfigError,
    MetricNames,
    bounded_duration,
    parse_choice,
    parse_positive_int,
)

if TYPE_CHECKING:
    from exporter.client.fleet.promapi import PrometheusAPI

# The timeout and series cap are exporter.client.fleet.promapi's (tests/test_top_fleet.py keeps
# them equal; promapi is not imported for them: the daemon's flags read this module).
FLEET_DEFAULTS = {"prometheus.refresh-interval": "10s", "prometheus.timeout": "30s",
                  "prometheus.max-series": "20000", "metric-names": "gpu",
                  "prometheus.node-label": "instance", "prometheus.selector": ""}
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


@dataclass(frozen=True)
class Query:
    """What to ask and how often: the vocabulary the exporters serve, the label that
    names a node, extra matchers for every selector, the refresh interval."""

    names: MetricNames = MetricNames.GPU
    node_label: str = "instance"
    matchers: str = ""
    refresh: float = 10.0


def connect(url: str, flags: Mapping[str, str], ca_file: str | None = None,
            insecure: bool = False) -> tuple[PrometheusAPI, Query]:
    """``top --prometheus``'s flags (keys as in exporter.app.flags, values as given) ->
    the API client and what to ask. ConfigError (one line, naming the flag) for any
    flag, file or URL that cannot be used."""
    from exporter.client.fleet.promapi import (
        Authorization,
        HTTPClientConfig,
        PrometheusAPI,
        load_http_config,
    )

    given = {**FLEET_DEFAULTS, **flags}
    refresh = bounded_duration(1.0, 3600.0)("prometheus.refresh-interval",
                                            given["prometheus.refresh-interval"])
    timeout = bounded_duration(1.0, 300.0)("prometheus.timeout", given["prometheus.timeout"])
    max_series = parse_positive_int("prometheus.max-series", given["prometheus.max-series"])
    names = parse_choice("metric-names", given["metric-names"], MetricNames)
    node_label = given["prometheus.node-label"].strip()
    if not LABEL_NAME.fullmatch(node_label):
        raise ConfigError("prometheus.node-label", f"not a label name: {node_label!r}")
    matchers = given["prometheus.selector"].strip().strip(",")
    if "{" in matchers or "}" in matchers:
        raise ConfigError("prometheus.selector", "label matchers without braces, e.g. "
                          f"job=\"gpu-exporter\"; got {matchers!r}")
    config = HTTPClientConfig()
    key = "prometheus.http-config"
    try:
        if flags.get(key):
            config = load_http_config(flags[key])
        key = "prometheus.bearer-token-file"
        if flags.get(key):
            if config.authorization is not None or config.basic_auth is not None:
                raise ValueError("and the http_config's credentials: one or the other")
            config = dataclasses.replace(config, authorization=Authorization(
                credentials_file=flags[key]))
        tls = config.tls_config
        tls = dataclasses.replace(
            tls, cert_file=flags.get("tls.cert-file") or tls.cert_file,
            key_file=flags.get("tls.key-file") or tls.key_file,
            server_name=flags.get("tls.server-name") or tls.server_name,
            ca_file=ca_file or tls.ca_file,
            insecure_skip_verify=insecure or tls.insecure_skip_verify)
        for flag, path, kind in (
                ("tls.ca-file", tls.ca_file, untrusted_file.PEM),
                ("tls.cert-file", tls.cert_file, untrusted_file.PEM),
                ("tls.key-file", tls.key_file, untrusted_file.PEM),
                ("prometheus.bearer-token-file", flags.get("prometheus.bearer-token-file", ""),
                 untrusted_file.SECRET)):
            if path:
                key = flag
                untrusted_file.check(path, kind)  # a FIFO, a device, a huge file: refused
        config = dataclasses.replace(config, tls_config=tls)
        key = "prometheus"
        api = PrometheusAPI(url, config, timeout=timeout, max_series=max_series)
    except (ValueError, OSError) as e:  # ssl.SSLError is an OSError: a CA or key file
        raise ConfigError(key, str(e)) from None
    return api, Query(names, node_label, matchers, refresh)
