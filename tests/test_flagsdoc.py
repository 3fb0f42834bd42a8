"""--help in groups, and README.md's flag tables generated from the same flag table
(exporter.app.flags, tools.flagsdoc): a flag added to one is in the other."""

from __future__ import annotations

import re
from pathlib import Path

from exporter.app.flags import GROUPS, KEYS, OPTIONS, build_parser, build_top_parser, group_of
from exporter.pipeline.registry import TABLE
from tools.flagsdoc import README_NOTES, readme, split_default

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_flag_tables_are_generated_from_the_flag_table() -> None:
    """Fails while README.md is out of date: run python -m tools.flagsdoc."""
    text = README.read_text()
    assert readme(text) == text, "README.md's flag tables are stale: " \
        "python -m tools.flagsdoc"


def test_every_flag_is_in_readme_and_every_note_is_a_flag() -> None:
    text = README.read_text()
    parser = build_parser()
    flags = {o for p in (parser, build_top_parser()) for a in p._actions
             for o in a.option_strings
             if not o.startswith("--no-") and o not in ("-h", "--help", "--version")}
    shown = set(re.findall(r"`(--(?:\[no-\])?[a-z0-9.-]+)", text))
    shown = {f.replace("--[no-]", "--") for f in shown}
    assert flags - shown == set()
    # The flags the README table used to leave out, now there.
    assert {"--web.history", "--collector.metrics.include", "--collector.metrics.exclude",
            "--dcgm.counters", "--otlp.endpoint", "--otlp.only"} <= shown
    assert set(README_NOTES) <= flags


def test_every_flag_has_a_group_and_a_default() -> None:
    assert [o.key for o in OPTIONS if not group_of(o.key)] == []
    for o in OPTIONS:
        assert split_default(o.help)[1], o.key
    assert split_default("fast tier, 100ms to 1h (default 1s)") == ("fast tier, 100ms to 1h",
                                                                      "1s")
    assert split_default("(default: the first of (a) and b)")[1] == "the first of (a) and b"


def help_sections() -> dict[str, str]:
    """--help's text by group title."""
    text = build_parser().format_help()
    parts = re.split(r"^(\S[^\n]*):\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_help_is_grouped_daemon_otlp_kubernetes_and_the_client_flags_apart() -> None:
    sections = help_sections()
    titles = [t for t, _ in GROUPS]
    assert [t for t in sections if t in titles] == titles  # every group, in order
    assert "other" not in sections

    def flags(title: str) -> set[str]:
        return set(re.findall(r"--(?:\[no-\])?([a-z0-9.-]+)", sections[title]))

    for key in KEYS:
        assert key in flags(group_of(key)), key
    assert {f"collector.{row.key}" for row in TABLE} <= flags("collectors")
    assert flags("snapshot --from and top") == {"from", "tls.ca-file",
                                                 "tls.insecure-skip-verify"}
    assert all(k.startswith("otlp.") for k in flags("otlp push"))
    assert not any(k.startswith(("otlp.", "kubernetes.", "from")) for k in flags("serving"))
