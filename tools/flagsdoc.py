"""README.md's flag tables, generated from the flag table that --help shows.

``python -m tools.flagsdoc`` rewrites the part of README.md between the
``<!-- flags -->`` and ``<!-- /flags -->`` markers: one table per --help group
(exporter.app.flags.GROUPS), one row per flag, with its default and what it does, in the
words of its help (the "(default ...)" at the end of a help is the default column), plus
the links and details README_NOTES adds. tests/test_flagsdoc.py fails while README.md is
out of date, as tests/test_metricsdoc.py does for the metric docs.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from exporter.app.flags import FLEET_GROUP, GROUPS, build_parser, build_top_parser

BEGIN, END = "<!-- flags -->", "<!-- /flags -->"
# What README.md says of a flag besides its help: links to the page about it, and the
# details a one-line help leaves out. Keyed by flag (tests/test_flagsdoc.py: real flags).
README_NOTES: dict[str, str] = {
    "--web.listen-address": "`:port` is IPv6 and IPv4, `0.0.0.0:port` IPv4 only (a live "
    "socket of another instance is never replaced; the file is removed on exit)",
    "--web.config.file": "[exporter-toolkit format](https://github.com/prometheus/"
    "exporter-toolkit/blob/master/docs/web-configuration.md), every key: "
    "`tls_server_config` (files or inline PEM, client auth, allowed SANs, versions, cipher "
    "suites, curves), `http_server_config` (`headers`: the same security headers as "
    "exporter-toolkit allows; `http2` is accepted but HTTP/1.1 is served), "
    "`basic_auth_users` (bcrypt), `rate_limit`; unknown keys are errors",
    "--web.history": "[docs/live-page.md](docs/live-page.md)",
    "--path.sysfs": "in a container: the host's, mounted read-only",
    "--path.procfs": "in a container: the host's, mounted read-only",
    "--path.state": "the next start logs a crash (signal and frame) and the starts of the "
    "last hour ([docs/troubleshooting.md](docs/troubleshooting.md))",
    "--path.amdgpu-ids": "[docs/vendors-amd.md](docs/vendors-amd.md)",
    "--metric-names": "dcgm-exporter's names, units and labels for every vendor "
    "([docs/dcgm-compat.md](docs/dcgm-compat.md))",
    "--collector.metrics.include": "[docs/metric-selection.md](docs/metric-selection.md); "
    "a selection that hides the exporter's own `gpu_exporter_*` series is warned about",
    "--collector.metrics.exclude": "[docs/metric-selection.md](docs/metric-selection.md)",
    "--dcgm.counters": "[docs/dcgm-compat.md](docs/dcgm-compat.md)",
    "--collector.slow-interval": "NVML PCIe throughput, energy, process utilisation, GPM; "
    "NVLink every 3rd / 6th slow cycle; limits and sizes of amdgpu, i915 and xe",
    "--max-processes-per-gpu": "applied after the per-process rows of every source are "
    "merged; each process left out counts once in `gpu_exporter_processes_truncated_total`",
    "--stale-after": "`gpu_up` 0 stays",
    "--macmon.path": "[docs/vendors-apple.md](docs/vendors-apple.md)",
    "--health.xid-window": "[docs/health.md](docs/health.md)",
    "--kubernetes.pod-resources-socket": "[docs/kubernetes.md](docs/kubernetes.md)",
    "--otlp.endpoint": "[docs/otlp.md](docs/otlp.md)",
    "--from": "[docs/top.md](docs/top.md)",
}
FLEET_NOTES: dict[str, str] = {  # top --prometheus's (its --metric-names is not the daemon's)
    "--prometheus": "[docs/top.md](docs/top.md#the-fleet-from-prometheus)",
}
_DEFAULT = re.compile(r"\s*\(default:? ((?:[^()]|\([^()]*\))*)\)\s*$")


def split_default(help: str) -> tuple[str, str]:
    """A help text -> (what it says, its default): "... (default 1s)" -> ("...", "1s")."""
    match = _DEFAULT.search(help)
    if match is None:
        return help, ""
    return help[:match.start()], match.group(1)


def _flag(action: argparse.Action) -> str:
    names = [o for o in action.option_strings if not o.startswith("--no-")]
    if action.nargs == 0 and any(o.startswith("--no-") for o in action.option_strings):
        return ", ".join(f"`--[no-]{n[2:]}`" for n in names)
    metavar = f" {action.metavar}" if action.metavar else ""
    return ", ".join(f"`{n}{metavar}`" for n in names)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").strip()


def _plain(text: str) -> str:
    """Help text (plain words) as Markdown: ``*`` and ``<`` are not markup."""
    return text.replace("*", "\\*").replace("<", "\\<")


def _default(text: str) -> str:
    """A value as code (``1s``, ``/metrics``); words as words ("3 x collector.interval")."""
    text = _cell(text)
    return f"`{text}`" if text and " " not in text else _plain(text)


def tables() -> str:
    """README.md's flag tables, one per --help group."""
    parser = build_parser()
    groups = {g.title: g for g in parser._action_groups}
    titles = ["options", *(title for title, _ in GROUPS), "other"]
    # top --prometheus's own flags: in top's parser only (the daemon has no use for them)
    groups[FLEET_GROUP] = next(g for g in build_top_parser()._action_groups
                               if g.title == FLEET_GROUP)
    titles.insert(titles.index("other"), FLEET_GROUP)
    out: list[str] = []
    for title in titles:
        group = groups.get(title)
        actions = [a for a in (group._group_actions if group else [])
                   if a.help and a.help != argparse.SUPPRESS and a.option_strings
                   and a.dest not in ("help", "version")]
        if not actions:
            continue
        heading = "general" if title == "options" else title
        out += [f"**{heading}**", "", "| flag | default | |", "|---|---|---|"]
        for a in actions:
            what, default = split_default(str(a.help))
            notes = FLEET_NOTES if title == FLEET_GROUP else README_NOTES
            note = notes.get(a.option_strings[0], "")
            text = "; ".join(t for t in (_plain(what), note) if t)
            out.append(f"| {_flag(a)} | {_default(default)} | {_cell(text)} |")
        out.append("")
    return "\n".join(out)


def readme(text: str) -> str:
    """README.md's text with its flag tables replaced by the generated ones."""
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n\n{tables()}\n{END}{tail}"


def main() -> None:
    path = Path(__file__).resolve().parents[1] / "README.md"
    text = path.read_text()
    new = readme(text)
    if new != text:
        path.write_text(new)
        print("wrote README.md")


if __name__ == "__main__":
    main()
