"""One row of the hardware matrix from the logs ``bench/h100.sh matrix-start`` leaves.

    python3 bench/matrix_table.py DIR
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def main(d: Path) -> int:
    gpus = [line for line in read(d / "gpus.log").splitlines()[1:] if re.match(r"\d+,", line)]
    name = gpus[0].split(",")[1].strip() if gpus else "?"
    loops = re.findall(r"loop (.+?): (\d+) of (\d+) crashed", read(d / "repro.log"))
    wrap = " / ".join(f"{c} of {n}" for _label, c, n in loops) or "?"
    summary = re.findall(r"=+ (.*?) in [\d.]+s", read(d / "hardware.log"))
    hw = summary[-1] if summary else "?"
    row = next((json.loads(line[5:]) for line in read(d / "soak.log").splitlines()
                if line.startswith("SOAK ")), None)
    rc = read(d / "soak.rc").strip() or "?"
    print("| GPUs | field-values loop crashed, nvidia-ml-py / exporter | tests/hardware | soak "
          "| died | checks | misses mem/power/util | NVLink up per GPU (ours=smi) | NVLink "
          "B/s before -> during P2P | RSS MiB | fds | CPU % of a core | ERROR lines |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    if row is None:
        print(f"| {len(gpus)} x {name} | {wrap} | {hw} | no result (pytest exit {rc}) "
              "| see soak.log | | | | | | | | |")
        return 1
    links = ", ".join(f"{a}={b}" for a, b in row["links"].values())
    m = row["misses"]
    print(f"| {row['gpus']} x {name} | {wrap} | {hw} | {row['seconds']:.0f} s, pytest exit "
          f"{rc} | {'yes' if row['died'] else 'no'} | {row['checks']} | "
          f"{m['memory']}/{m['power']}/{m['util']} | {links} | {row['nvlink_before']:.3g} -> "
          f"{row['nvlink_during']:.3g} | {row['rss_mib'][0]} -> {row['rss_mib'][1]} | "
          f"{row['fds'][0]} -> {row['fds'][1]} | {row['cpu_pct']} | {row['error_lines']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
