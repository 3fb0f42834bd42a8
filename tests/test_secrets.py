"""Secrets never shown: the ``Secret`` type, header values refused with an error that
does not quote them, and every output of ``top --prometheus``'s secret paths (the
configuration errors, the answers a view draws, the client's ``repr``) grepped for the
secret. Secret files that are FIFOs or devices are refused, never waited on."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from exporter.client.fleet.flags import connect
from exporter.client.fleet.promapi import (
    Authorization,
    BasicAuth,
    ConfigError,
    HTTPClientConfig,
    PrometheusAPI,
    http_config_from_mapping,
    load_http_config,
)
from exporter.core import config as core_config
from exporter.core.secret import REDACTED, Secret, SecretError, header_value
from tests.test_fleet_client import OK, answering, serving

TOKEN = "tok-3f9a-never-shown"


def test_a_secret_prints_as_redacted_in_every_form() -> None:
    s = Secret(TOKEN)
    for shown in (str(s), repr(s), f"{s}", f"{s!r}", f"{s:>40}", "{}".format(s), format(s),  # noqa: UP032
                  repr(Authorization(credentials=s)), repr(BasicAuth("u", s)),
                  str([s]), str({"k": s})):
        assert TOKEN not in shown and "secret" in shown
    assert s.reveal() == TOKEN and s == Secret(TOKEN) and bool(s) and not Secret("")
    with pytest.raises(TypeError):
        import pickle

        pickle.dumps(s)


@pytest.mark.parametrize("bad, name", [("\n", "line feed"), ("\r", "carriage return"),
                                       ("\x00", "U+0000"), ("\x7f", "U+007F")])
def test_a_header_value_with_a_control_character_is_refused_without_it(bad: str,
                                                                       name: str) -> None:
    with pytest.raises(SecretError) as e:
        header_value("the token", "Bearer", Secret(TOKEN[:5] + bad + TOKEN[5:]))
    assert name in str(e.value) and TOKEN[:5] not in str(e.value)
    assert header_value("x", "Bearer", Secret("a\tb")) == "Bearer a\tb"


def _outputs(api: PrometheusAPI) -> list[str]:
    """What a view can show of a client: its answers' errors and its own repr."""
    out = [repr(api.config), api.display]
    for call in (lambda: api.query("up"), lambda: api.query_range("up", 0, 60, 15)):
        answer = call()
        out += [str(answer.error), repr(answer)]
    return out


def test_a_token_file_with_a_line_break_is_an_answer_without_the_token(tmp_path: Path) -> None:
    """Before: ValueError out of query() ("never raises"), and the view's error line
    (nodes._run's catch-all) held the token in clear."""
    token = tmp_path / "token"
    token.write_text(f"{TOKEN}\ninjected: header\n")
    with serving(answering(OK)) as s:
        api, _ = connect(s.url, {"prometheus.bearer-token-file": str(token)})
        outputs = _outputs(api)
    assert s.seen == []  # nothing sent with a header that would split
    assert "line feed" in outputs[2], outputs
    assert not any(TOKEN in o for o in outputs), outputs


def test_inline_credentials_with_a_line_break_are_refused_at_load(tmp_path: Path) -> None:
    path = tmp_path / "http.yml"
    path.write_text(f'authorization:\n  credentials: "{TOKEN}\\nX-Evil: 1"\n')
    with pytest.raises(ConfigError) as e:
        load_http_config(path)
    assert "line feed" in str(e.value) and TOKEN not in str(e.value)
    with pytest.raises(ConfigError) as e2:
        http_config_from_mapping({"bearer_token": f"{TOKEN}\r\n"})
    assert TOKEN not in str(e2.value)


@pytest.mark.parametrize("text", [
    f"basic_auth:\n  username: ops\n  password: {TOKEN}: x\n",  # a colon in a plain scalar
    f"basic_auth:\n  username: ops\n  password: '{TOKEN}\n",  # an unclosed quote
    f"authorization:\n\tcredentials: {TOKEN}\n",  # a tab
    f"bearer_token: [{TOKEN}\n",  # an unclosed flow sequence
    f"basic_auth:\n  username: ops\n  password: !{TOKEN}'\n",  # a tag, quoted whole
    f"bearer_token: *{TOKEN}\n",  # an alias, quoted whole
], ids=["colon", "quote", "tab", "flow", "tag", "alias"])
def test_a_malformed_http_config_is_named_without_its_lines(tmp_path: Path, text: str) -> None:
    """PyYAML's message quotes the line it stopped at: the password's line, on stderr."""
    path = tmp_path / "http.yml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_http_config(path)
    message = str(e.value)
    assert message.startswith(f"{path} is not valid YAML: ") and "line" in message
    assert TOKEN not in message and "\n" not in message
    with pytest.raises(core_config.ConfigError) as e2:  # --config.file, --web.config.file
        core_config.load_yaml_mapping("web.config.file", str(path))
    assert TOKEN not in str(e2.value)


@pytest.mark.parametrize("where", ["bearer_token_file", "credentials_file", "password_file",
                                   "--prometheus.bearer-token-file"])
def test_a_secret_file_that_is_a_fifo_is_an_error_at_once(tmp_path: Path, where: str) -> None:
    """Before: open() waited for a writer forever, the view on "Loading..." past
    --prometheus.timeout with no request sent."""
    fifo = tmp_path / "secret"
    os.mkfifo(fifo)
    config = {
        "bearer_token_file": HTTPClientConfig(authorization=Authorization(
            credentials_file=str(fifo))),
        "credentials_file": HTTPClientConfig(authorization=Authorization(
            credentials_file=str(fifo))),
        "password_file": HTTPClientConfig(basic_auth=BasicAuth("ops", password_file=str(fifo))),
    }.get(where)
    outcome: list[str] = []

    def attempt() -> None:
        if config is None:
            try:
                connect("http://127.0.0.1:9", {"prometheus.bearer-token-file": str(fifo)})
            except core_config.ConfigError as e:
                outcome.append(str(e))
        else:
            answer = PrometheusAPI("http://127.0.0.1:9", config, timeout=30).query("up")
            outcome.append(str(answer.error))

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(3)
    if thread.is_alive():  # blocked in open(): be the writer that frees it, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(3)
        pytest.fail("blocked in open() on the FIFO")
    assert "a FIFO; a regular file is needed" in outcome[0], outcome


def test_an_http_config_that_is_a_device_is_refused_at_once() -> None:
    started = time.monotonic()
    with pytest.raises(core_config.ConfigError, match="/dev/zero: a device"):
        connect("http://127.0.0.1:9", {"prometheus.http-config": "/dev/zero"})
    assert time.monotonic() - started < 1


def _paths(tmp_path: Path) -> list[tuple[str, dict[str, Any]]]:
    """Every way a secret reaches the client, each made to fail some way."""
    bad_file = tmp_path / "bad-token"
    bad_file.write_text(f"{TOKEN}\nX: y")
    good_file = tmp_path / "good-token"
    good_file.write_text(TOKEN)
    broken = tmp_path / "broken.yml"
    broken.write_text(f"basic_auth: {{username: u, password: '{TOKEN}\n")
    unknown = tmp_path / "unknown.yml"
    unknown.write_text(f"basic_auth: {{username: u, password: {TOKEN}}}\noauth2: {{}}\n")
    url = "http://127.0.0.1:9"
    return [
        (url, {"prometheus.bearer-token-file": str(bad_file)}),
        (url, {"prometheus.bearer-token-file": str(good_file)}),  # nothing listening
        (url, {"prometheus.http-config": str(broken)}),
        (url, {"prometheus.http-config": str(unknown)}),
        (f"http://ops:{TOKEN}@127.0.0.1:9", {}),
        (f"http://ops:{TOKEN}@[::1", {}),  # a bad URL with a password in it
        (url, {"prometheus.bearer-token-file": str(good_file),
               "prometheus.http-config": str(unknown)}),
    ]


def test_no_output_of_the_secret_paths_holds_the_secret(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    shown: list[str] = []
    for url, flags in _paths(tmp_path):
        try:
            api, _ = connect(url, flags)
        except core_config.ConfigError as e:
            shown.append(str(e))
            continue
        shown += _outputs(api)
    captured = capsys.readouterr()
    shown += [captured.out, captured.err]
    assert all(TOKEN not in s for s in shown), [s for s in shown if TOKEN in s]
    assert any(REDACTED in s for s in shown)  # the client's repr: the type at work


@pytest.mark.parametrize("value", [f"Authorization=Bearer {TOKEN},novalue",
                                   f"x-tenant={TOKEN}\nX-Evil: 1", f"a={TOKEN},=b"])
def test_an_otlp_header_error_does_not_show_the_values(value: str) -> None:
    """--otlp.headers usually holds an Authorization header: the error quoted it whole."""
    with pytest.raises(core_config.ConfigError) as e:
        core_config.parse_headers("otlp.headers", value)
    assert TOKEN not in str(e.value)
    headers = core_config.parse_headers("otlp.headers", f"Authorization=Bearer {TOKEN}")
    assert TOKEN not in repr(headers) and headers[0][1].reveal() == f"Bearer {TOKEN}"
