"""The environment a kubelet gives the pod: Service-link variables are not flags.

``kubelet_service_env`` is tests/kubelet.py's model of the kubelet's ``FromServices``
(kubernetes ``pkg/kubelet/envvars/envvars.go``): for every Service of the pod's namespace
with a cluster IP, ``<NAME>_SERVICE_HOST``, ``<NAME>_SERVICE_PORT`` and the Docker-link
set (``<NAME>_PORT=tcp://...`` and the rest). The shipped chart and manifests create a
Service named ``gpu-exporter`` beside the pod, so every pod of theirs got
``GPU_EXPORTER_PORT=tcp://...``: before this, every such pod exited with status 2.
tests/test_deploy_pod_journey.py starts the built image under these variables.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.app.flags import (
    COLLECTOR_KEYS,
    KEYS,
    env_name,
    ignored_variables,
    is_service_link,
    load_config,
)
from tests.daemon import running, values_of
from tests.kubelet import service_env
from tests.test_cli import cli, one_line_error

Port = tuple[int, str, str]  # (port, name, protocol); name "" only for a lone first port
kubelet_service_env = service_env  # the model lives in tests/kubelet.py, with the kubelet's


SERVICES = [
    ("gpu-exporter", "10.96.0.10", [(9445, "metrics", "TCP")]),  # the chart's and manifests'
    ("gpu-exporter", "fd00:10:96::a", [(9445, "metrics", "TCP")]),  # an IPv6 cluster
    ("gpu-exporter", "10.96.0.11", [(9445, "", "TCP")]),  # one unnamed port
    ("gpu-exporter-metrics", "10.96.0.12", [(80, "http-metrics", "TCP"), (53, "dns", "UDP"),
                                            (9, "sctp-x", "SCTP")]),
    ("gpu-exporter-port", "10.96.0.13", [(9445, "port", "TCP")]),
    ("gpu-exporter-service", "10.96.0.14", [(443, "https", "TCP")]),
    ("gpu-exporter-collector-interval", "10.96.0.15", [(1, "interval", "TCP")]),
]


def test_the_model_gives_what_the_kubelet_documents_for_redis_master() -> None:
    """The example of the Kubernetes docs ("Discovering services"), to the variable."""
    assert kubelet_service_env("redis-master", "10.0.0.11", [(6379, "", "TCP")]) == {
        "REDIS_MASTER_SERVICE_HOST": "10.0.0.11",
        "REDIS_MASTER_SERVICE_PORT": "6379",
        "REDIS_MASTER_PORT": "tcp://10.0.0.11:6379",
        "REDIS_MASTER_PORT_6379_TCP": "tcp://10.0.0.11:6379",
        "REDIS_MASTER_PORT_6379_TCP_PROTO": "tcp",
        "REDIS_MASTER_PORT_6379_TCP_PORT": "6379",
        "REDIS_MASTER_PORT_6379_TCP_ADDR": "10.0.0.11",
    }


@pytest.mark.parametrize(("service", "ip", "ports"), SERVICES)
def test_service_link_variables_of_any_service_are_not_flags(
        service: str, ip: str, ports: list[Port]) -> None:
    env = kubelet_service_env(service, ip, ports)
    assert any(name.startswith("GPU_EXPORTER_") for name in env)
    config = load_config([], {**env, "GPU_EXPORTER_COLLECTOR_INTERVAL": "2s"})
    assert config.interval == 2.0  # a real variable beside them still counts
    assert config.listen_addresses == (":9445",)  # and theirs set nothing


@pytest.mark.parametrize(("service", "ip", "ports"), SERVICES[:1])
def test_a_typo_beside_the_service_links_still_exits_2_with_one_line(
        service: str, ip: str, ports: list[Port]) -> None:
    env = kubelet_service_env(service, ip, ports)
    one_line_error(cli(env={**env, "GPU_EXPORTER_COLECTOR_INTERVAL": "2s"}),
                   "GPU_EXPORTER_COLECTOR_INTERVAL: unknown variable")
    assert cli("--version", env=env).returncode == 0


def test_no_flag_variable_has_a_service_link_shape() -> None:
    """The rule cannot swallow a flag: no flag's variable looks like a link variable, for
    any value (the shapes are tried with a value of every kind a link variable has)."""
    values = ["10.0.0.1", "9445", "tcp://10.0.0.1:9445", "tcp", "/a/b", "x"]
    for key in (*KEYS, *COLLECTOR_KEYS, "config.file"):
        name = env_name(key)
        assert not any(is_service_link(name, v) for v in values[:5]), name
        assert not re.search(r"_(SERVICE_HOST|SERVICE_PORT|PORT|NAME|ENV)(_|$)", name), name


@pytest.mark.parametrize(("name", "value"), [
    ("GPU_EXPORTER_PORT", "9445"),  # a port variable holds a URL, never a bare number
    ("GPU_EXPORTER_SERVICE_HOST", "my host"),
    ("GPU_EXPORTER_PORT_9445_TCP_PROTO", "http"),
    ("GPU_EXPORTER_SERVICE_PORT_METRICS", "tcp://10.0.0.1:1"),
    ("GPU_EXPORTER_PORT_9445_TCP_ADDR", "localhost"),
])
def test_a_variable_with_a_link_name_but_another_value_is_still_an_error(
        name: str, value: str) -> None:
    one_line_error(cli(env={name: value}), f"{name}: unknown variable")


@pytest.mark.slow
def test_the_daemon_starts_and_serves_under_the_kubelets_variables(tmp_path: Path) -> None:
    """The whole environment of the chart's pod (every Service above at once): it serves."""
    env: dict[str, str] = {}
    for service, ip, ports in SERVICES[:1] + SERVICES[3:]:
        env.update(kubelet_service_env(service, ip, ports))
    env.update(kubelet_service_env("kubernetes", "10.96.0.1", [(443, "https", "TCP")]))
    no_gpu = ["--path.sysfs", str(tmp_path), "--path.procfs", str(tmp_path)]
    with running(no_gpu, tmp_path, env=env) as daemon:
        assert values_of(daemon.get().text, "gpu_exporter_up") == [1.0]
        (line,) = daemon.records("environment: Kubernetes Service-link variables ignored")
    assert line["variables"] == sorted(n for n in env if n.startswith("GPU_EXPORTER_"))


@pytest.mark.parametrize(("name", "value"), [
    # Docker's legacy links: a kubelet never sets them, and a typo looked like one.
    ("GPU_EXPORTER_WEB_CONFIG_FILE_NAME", "/etc/gpu-exporter/web.yml"),
    ("GPU_EXPORTER_NAME", "/gpu-exporter"),
    ("GPU_EXPORTER_ENV_FOO", "bar"),
    ("GPU_EXPORTER_WEB_CONFIG_FILE_ENV_X", "1"),
])
def test_docker_legacy_link_shapes_are_errors(name: str, value: str) -> None:
    """GPU_EXPORTER_WEB_CONFIG_FILE_NAME=<web config with basic auth> gave a daemon serving
    /metrics with 200 and no auth, and nothing in its log."""
    one_line_error(cli(env={name: value}), f"{name}: unknown variable")


@pytest.mark.parametrize(("name", "value"), [
    ("GPU_EXPORTER_WEB_LISTEN_ADDRESS_PORT", ":9445"),
    ("GPU_EXPORTER_WEB_CONFIG_FILE_SERVICE_PORT", "09445"),  # a leading zero: not Go's Itoa
    ("GPU_EXPORTER_WEB_CONFIG_FILE_SERVICE_HOST", "/etc/web.yml"),
    ("GPU_EXPORTER_LOG_LEVEL_PORT_80_TCP", "tcp://10.0.0.1:81"),  # the port of the name
    ("GPU_EXPORTER_LOG_LEVEL_PORT_80_TCP_PROTO", "udp"),
])
def test_a_flags_name_plus_a_link_suffix_must_hold_the_links_exact_value(name: str,
                                                                         value: str) -> None:
    one_line_error(cli(env={name: value}), "with the suffix _")


@pytest.mark.parametrize("value", [
    "999.1.1.1", "10.0.0", "fe80::1%eth0", "10.0.0.1 ", "x",
])
def test_a_service_host_is_an_ip_address(value: str) -> None:
    assert not is_service_link("GPU_EXPORTER_SERVICE_HOST", value)


@pytest.mark.parametrize("value", [
    "tcp://10.0.0.1:99999", "tcp://10.0.0.1:0", "tcp://fd00::1:80", "tcp://[10.0.0.1]:80",
    "http://10.0.0.1:80", "TCP://10.0.0.1:80", "tcp://10.0.0.1:080", "tcp://10.0.0.1",
])
def test_a_port_url_is_exactly_what_the_kubelet_writes(value: str) -> None:
    assert not is_service_link("GPU_EXPORTER_PORT", value)
    assert is_service_link("GPU_EXPORTER_PORT", "tcp://[fd00::1]:80")


def test_the_ignored_variables_are_named() -> None:
    env = {**kubelet_service_env("gpu-exporter", "10.96.0.10", [(9445, "metrics", "TCP")]),
           "GPU_EXPORTER_LOG_LEVEL": "debug", "OTHER_SERVICE_HOST": "10.0.0.1"}
    assert ignored_variables(env) == sorted(n for n in env if n.startswith("GPU_EXPORTER_")
                                            and n != "GPU_EXPORTER_LOG_LEVEL")
    assert load_config([], env).log_level == "debug"


_SERVICE_NAME = st.from_regex(r"[a-z]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
_IP = st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)).map(str)
_PORTS = st.lists(st.tuples(st.integers(1, 65535),
                            st.from_regex(r"[a-z]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True),
                            st.sampled_from(["TCP", "UDP", "SCTP"])),
                  min_size=1, max_size=4, unique_by=lambda p: (p[0], p[2]))


@given(_SERVICE_NAME, _IP, _PORTS)
def test_every_variable_the_kubelet_writes_is_a_link(service: str, ip: str,
                                                     ports: list[Port]) -> None:
    env = kubelet_service_env("gpu-exporter-" + service, ip, ports)
    assert all(is_service_link(name, value) for name, value in env.items()), env
    assert ignored_variables(env) == sorted(env)


@given(st.from_regex(r"GPU_EXPORTER_[A-Z0-9_]{0,40}", fullmatch=True), st.text(max_size=60))
def test_the_environment_check_never_raises_anything_but_a_config_error(name: str,
                                                                        value: str) -> None:
    from exporter.core.config import ConfigError

    try:
        load_config([], {name: value})
    except ConfigError as e:
        assert str(e).startswith(name) or name in str(e)
