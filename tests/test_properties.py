"""Property tests (Hypothesis) of the parsers of untrusted input, each against its
contract: it never raises anything but its documented error, and what it returns is
within its bounds. Prometheus API replies, the http_config, CDI specs (JSON and YAML), the
web config, flags, the environment and the config file, the run record, the daemon's JSON
as ``top`` reads it, YAML errors. (The kernel-file parsers have their own; the
history's query parameters and the Service-link variables are in test_query_params.py
and test_service_links.py.) The profile (tests/conftest.py) sets how many examples.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from exporter.app.flags import KEYS, env_name, load_config, read_config_file
from exporter.app.lastrun import parse_record
from exporter.attribution.kubernetes.cdi import MAX_SPEC_DEVICES, SpecTooLarge, parse_spec
from exporter.client.fetch import json_values
from exporter.client.fleet.flags import connect
from exporter.client.fleet.promapi import (
    ConfigError as HTTPConfigError,
)
from exporter.client.fleet.promapi import (
    HTTPClientConfig,
    http_config_from_mapping,
    load_http_config,
    parse_reply,
)
from exporter.core.config import ConfigError, load_yaml
from exporter.core.secret import Secret
from exporter.serve.view import HistoryView
from exporter.serve.webconfig import load_web_config

TOKEN = "s3cr3t-T0KEN"

# ------------------------------------------------------------ strategies

LEAF = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                 st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
JSON = st.recursive(LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=8), inner, max_size=5)),
    max_leaves=25)
NUMBER_TEXT = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr),
                        st.sampled_from(["NaN", "+Inf", "-Inf", "1e400", "0x10", "", " 1",
                                         "1_0", "٣"]),
                        st.integers(-2**80, 2**80).map(str))
SAMPLE = st.one_of(st.tuples(st.one_of(st.floats(allow_nan=True), st.integers(), st.text(
    max_size=3), st.booleans()), st.one_of(NUMBER_TEXT, LEAF)).map(list), JSON)
LABELS = st.one_of(st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=4),
                   JSON)
ITEM = st.one_of(
    st.fixed_dictionaries({"metric": LABELS, "value": SAMPLE}),
    st.fixed_dictionaries({"metric": LABELS, "values": st.one_of(
        st.lists(SAMPLE, max_size=8), JSON)}),
    JSON)
REPLY = st.fixed_dictionaries(
    {"status": st.one_of(st.sampled_from(["success", "error"]), LEAF),
     "data": st.one_of(st.fixed_dictionaries({
         "resultType": st.one_of(st.sampled_from(["vector", "matrix", "scalar", "string"]),
                                 LEAF),
         "result": st.one_of(st.lists(ITEM, max_size=8), SAMPLE)}), JSON)},
    optional={"warnings": st.one_of(st.lists(st.text(max_size=20), max_size=3), JSON),
              "errorType": LEAF, "error": LEAF})


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()


@contextmanager
def _file(data: bytes) -> Iterator[str]:
    """A temporary file holding ``data`` (Hypothesis runs one example many times: the
    function-scoped tmp_path fixture would be shared between them)."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "f.yml")
        with open(path, "wb") as f:
            f.write(data)
        yield path


# ------------------------------------------------------------ Prometheus API replies

@given(st.one_of(REPLY.map(_dumps), JSON.map(_dumps), st.binary(max_size=200)),
       st.integers(1, 5), st.sampled_from([200, 400, 422, 500, 503]))
def test_a_prometheus_reply_is_an_answer_within_its_bounds(body: bytes, max_series: int,
                                                           status: int) -> None:
    answer = parse_reply("up", body, max_series, status)
    assert answer.ok == (answer.error is None)
    if not answer.ok:
        assert isinstance(answer.error, str) and answer.series == answer.ranges == ()
        return
    assert len(answer.series) + len(answer.ranges) <= max_series
    for s in answer.series:
        assert math.isfinite(s.value)
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in s.labels.items())
    for r in answer.ranges:
        assert all(math.isfinite(t) and math.isfinite(v) for t, v in r.points)
    assert answer.dropped >= 0 and answer.held >= 0
    assert all(isinstance(w, str) and len(w) <= 200 for w in answer.warnings)


@given(JSON)
def test_the_value_count_bounds_what_json_decodes(doc: Any) -> None:
    def count(value: Any) -> int:
        if isinstance(value, dict):
            return 1 + sum(1 + count(v) for v in value.values())
        if isinstance(value, list):
            return 1 + sum(count(v) for v in value)
        return 1

    body = _dumps(doc)
    assert json_values(body) >= count(json.loads(body))


@given(st.integers(1, 1000), st.integers(0, 3000))
def test_a_reply_over_the_values_is_refused_not_decoded(max_values: int, n: int) -> None:
    body = _dumps({"status": "success", "data": {"resultType": "vector", "result": [{}] * n}})
    answer = parse_reply("up", body, max_values=max_values)
    assert (answer.error is not None and "JSON values" in answer.error) == \
        (json_values(body) > max_values)


# ------------------------------------------------------------ http_config

HTTP_KEYS = ["basic_auth", "authorization", "tls_config", "bearer_token", "bearer_token_file",
             "proxy_url", "oauth2"]
SECTION_KEYS = ["username", "password", "password_file", "type", "credentials",
                "credentials_file", "ca_file", "cert_file", "key_file", "server_name",
                "insecure_skip_verify", "min_version"]
SECTION = st.dictionaries(st.sampled_from(SECTION_KEYS), st.one_of(LEAF, st.text(max_size=20)),
                          max_size=4)
HTTP_CONFIG = st.one_of(st.dictionaries(st.sampled_from(HTTP_KEYS),
                                        st.one_of(SECTION, LEAF), max_size=3), JSON)


@given(HTTP_CONFIG)
def test_an_http_config_is_a_config_or_a_config_error(data: Any) -> None:
    try:
        config = http_config_from_mapping(data)
    except HTTPConfigError:
        return
    assert isinstance(config, HTTPClientConfig)
    config.validate()
    secrets = [config.basic_auth.password if config.basic_auth else Secret(""),
               config.authorization.credentials if config.authorization else Secret("")]
    assert all(isinstance(s, Secret) for s in secrets)
    assert TOKEN not in repr(config) or TOKEN not in repr(data)


PREFIX = st.sampled_from(["", "!", "*", "&", "%", "@", "`", "|", ">", "'", '"', "{", "[",
                          "- ", "? ", "\t", "\\", "#", ": "])
SUFFIX = st.sampled_from(["", "'", '"', "\n  x", ": y", "\t", "}", "]", " #c", "\x00",
                          "\n\t- z", "\\q"])


@given(PREFIX, SUFFIX, st.sampled_from(["basic_auth:\n  username: u\n  password: {}\n",
                                        "authorization:\n  credentials: {}\n",
                                        "bearer_token: {}\n",
                                        "bearer_token: [{}]\n",
                                        "basic_auth: {{username: u, password: {}}}\n"]))
def test_no_http_config_error_shows_the_secret(prefix: str, suffix: str, shape: str) -> None:
    """A password that starts with ! is a YAML tag, one with * an alias: PyYAML's message
    quotes it whole."""
    with _file(shape.format(prefix + TOKEN + suffix).encode()) as path:
        try:
            load_http_config(path)
        except HTTPConfigError as e:
            assert TOKEN not in str(e), str(e)


# ------------------------------------------------------------ CDI specs

CDI_DEVICE = st.fixed_dictionaries({"name": LEAF, "containerEdits": st.one_of(
    st.fixed_dictionaries({"deviceNodes": st.one_of(st.lists(st.fixed_dictionaries(
        {"path": LEAF}), max_size=3), JSON)}), JSON)})
CDI_SPEC = st.fixed_dictionaries({"cdiVersion": LEAF, "kind": st.one_of(
    st.sampled_from(["nvidia.com/gpu", "amd.com/gpu", "x"]), LEAF),
    "devices": st.one_of(st.lists(CDI_DEVICE, max_size=5), JSON)})


def _check_spec(devices: dict[str, tuple[str, ...]] | None) -> None:
    if devices is None:
        return
    assert len(devices) <= MAX_SPEC_DEVICES
    for name, nodes in devices.items():
        assert isinstance(name, str) and isinstance(nodes, tuple)
        assert all(isinstance(n, str) for n in nodes)


@given(st.one_of(CDI_SPEC.map(lambda d: json.dumps(d, allow_nan=True)),
                 st.text(max_size=200)))
def test_a_cdi_json_spec_is_devices_or_none(text: str) -> None:
    try:
        _check_spec(parse_spec(text, json_text=True))
    except SpecTooLarge:
        pass


YAML_BITS = st.sampled_from(["kind: nvidia.com/gpu\n", "devices:\n", "- name: a\n",
                             "  containerEdits:\n", "    deviceNodes:\n",
                             "    - path: /dev/x\n", "&a [*a]\n", "!!python/object:os.system\n",
                             "a: &x [1]\nb: *x\n", "{", "[", "'", "\t", ": ", "? ", "%YAML 1.1\n",
                             "---\n", "...\n", "x" * 50, "\\u0000"])


@given(st.one_of(st.lists(YAML_BITS, max_size=12).map("".join),
                 CDI_SPEC.map(lambda d: json.dumps(d, allow_nan=True)), st.text(max_size=200)))
def test_a_cdi_yaml_spec_is_devices_or_none(text: str) -> None:
    try:
        _check_spec(parse_spec(text))
    except SpecTooLarge:
        pass


# ------------------------------------------------------------ web config, config file, flags

WEB_KEYS = ["tls_server_config", "http_server_config", "basic_auth_users", "rate_limit", "x"]
WEB_SECTION_KEYS = ["cert_file", "key_file", "cert", "key", "client_auth_type",
                    "client_ca_file", "min_version", "max_version", "cipher_suites",
                    "curve_preferences", "http2", "headers", "interval", "burst",
                    "client_allowed_sans", "prefer_server_cipher_suites"]
WEB_CONFIG = st.dictionaries(st.sampled_from(WEB_KEYS), st.one_of(
    st.dictionaries(st.sampled_from(WEB_SECTION_KEYS), JSON, max_size=4), JSON), max_size=3)


@example(b"(:\n?")  # a null key beside a string one: sorted() raised TypeError at start
@example(b"tls_server_config: {1: a, b: c}\n")
@given(st.one_of(WEB_CONFIG.map(lambda d: json.dumps(d, allow_nan=True).encode()),
                 st.lists(YAML_BITS, max_size=8).map(lambda b: "".join(b).encode()),
                 st.binary(max_size=100)))
def test_a_web_config_is_a_config_or_one_config_error(data: bytes) -> None:
    with _file(data) as path:
        try:
            load_web_config(path)
        except ConfigError as e:
            assert str(e).startswith("web.config.file") and "Traceback" not in str(e)


FLAG_KEYS = sorted(KEYS)


@given(st.dictionaries(st.sampled_from(FLAG_KEYS), st.text(max_size=30), max_size=3))
def test_the_environment_is_a_config_or_one_config_error(values: dict[str, str]) -> None:
    environ = {env_name(k): v for k, v in values.items()
               if not k.endswith("file") and "path" not in k}  # no file read outside
    try:
        load_config([], environ)
    except ConfigError:
        pass


@given(st.lists(st.tuples(st.sampled_from([k for k in FLAG_KEYS if not k.endswith("file")
                                            and "path" not in k]),
                          st.text(max_size=20)), max_size=3))
def test_flags_are_a_config_a_config_error_or_argparses_exit_2(pairs: list[tuple[str, str]]
                                                               ) -> None:
    import contextlib
    import io

    argv = [f"--{key}={value}" for key, value in pairs]
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            load_config(argv, {})
        except ConfigError:
            pass
        except SystemExit as e:  # argparse: a switch given a value, a malformed flag
            assert e.code == 2


@given(st.dictionaries(st.sampled_from([*FLAG_KEYS, "collector", "unknown.key"]),
                       st.one_of(JSON, st.text(max_size=20)), max_size=3))
def test_a_config_file_is_keys_or_one_config_error(data: dict[str, Any]) -> None:
    with _file(json.dumps(data, allow_nan=True).encode()) as path:
        try:
            read_config_file(path, "config.file")
        except ConfigError:
            pass


FLEET_FLAGS = ["prometheus.refresh-interval", "prometheus.timeout", "prometheus.max-series",
               "metric-names", "prometheus.node-label", "prometheus.selector"]


@given(st.text(max_size=40), st.dictionaries(st.sampled_from(FLEET_FLAGS),
                                             st.text(max_size=20), max_size=3))
def test_the_fleet_flags_are_a_client_or_one_config_error(url: str,
                                                          flags: dict[str, str]) -> None:
    try:
        connect(url, flags)
    except ConfigError as e:
        assert str(e)


# ------------------------------------------------------------ files and replies read back

@given(st.one_of(JSON.map(_dumps), st.binary(max_size=100),
                 st.fixed_dictionaries({}, optional={"pid": LEAF, "started": LEAF,
                                                     "clean": LEAF, "starts": JSON}).map(_dumps)))
def test_a_run_record_is_fields_of_their_types_or_a_reason(raw: bytes) -> None:
    record, why = parse_record(raw)
    assert isinstance(why, str) and (record == {} or not why)
    if "pid" in record:
        assert type(record["pid"]) is int and record["pid"] > 0
    if "started" in record:
        assert math.isfinite(record["started"])


@given(st.one_of(JSON, st.fixed_dictionaries({}, optional={
    "now": LEAF, "interval": LEAF, "window": LEAF, "capacity": LEAF, "series": JSON,
    "gpus": JSON, "processes": JSON, "devices": JSON, "backends": JSON, "otlp": JSON})))
def test_the_daemons_json_reads_as_a_view_never_an_exception(doc: Any) -> None:
    view = HistoryView.from_json(doc)
    assert math.isfinite(view.now) and view.capacity >= 0
    assert len(view.gpus) <= 64 and len(view.series) <= 16


@given(st.lists(YAML_BITS, max_size=10).map("".join), PREFIX)
def test_a_yaml_error_is_one_line_without_the_secret(text: str, prefix: str) -> None:
    with _file(f"{text}\npassword: {prefix}{TOKEN}\n{text}".encode()) as path:
        try:
            load_yaml(path)
        except (OSError, ValueError) as e:
            assert TOKEN not in str(e) and "\n" not in str(e)
