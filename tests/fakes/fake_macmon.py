#!/usr/bin/env python3
"""A fake ``macmon`` executable: a real child process that replays recorded macmon lines.

It speaks the part of macmon's command line the exporter uses, ``macmon pipe [-i MS]
[-s N] [--soc-info]``, and behaves as macmon's pipe loop does (vladkens/macmon
src/main.rs): wait one interval (macmon's floor: 100 ms), print one JSON line, flush,
repeat; the ``soc`` object only with ``--soc-info``; when the reader is gone the
write fails (EPIPE) and it exits, as macmon's ``println!`` panics.

Environment:
  FAKE_MACMON_LINES  a file of recorded lines (tests/fixtures/macmon/*.jsonl, see the
                     SOURCES.md there), replayed in a loop. Required.
  FAKE_MACMON_MODE   comma-separated, one mode per run, the last one repeating:
                     replay   (default) replay the lines
                     crash    replay FAKE_MACMON_AFTER lines (default 1), then exit 1
                     hang     replay FAKE_MACMON_AFTER lines, then stay alive, silent
                     garbage  replay FAKE_MACMON_AFTER lines, then print non-JSON lines
                     old      macmon before 0.6.1: reject --soc-info as clap does
                              (usage error, status 2); without it, replay
  FAKE_MACMON_LOG    a file every run appends "<pid> <mode> <start time> <argv>" to:
                     tells the run number to the next run, and the children's pids
                     and start times (time.time()) to a test.
"""

from __future__ import annotations

import json
import os
import sys
import time


def parse_args(argv: list[str]) -> tuple[float, int, bool]:
    interval_ms, samples, soc_info = 1000, 0, False
    args = iter(argv)
    for arg in args:
        if arg in ("-i", "--interval"):
            interval_ms = int(next(args))
        elif arg in ("-s", "--samples"):
            samples = int(next(args))
        elif arg == "--soc-info":
            soc_info = True
        elif arg not in ("pipe", "raw"):
            usage_error(arg)
    return max(interval_ms, 100) / 1000, samples, soc_info


def usage_error(arg: str) -> None:
    sys.stderr.write(f"error: unexpected argument '{arg}' found\n\n"
                     "Usage: macmon pipe [OPTIONS]\n\nFor more information, try '--help'.\n")
    sys.exit(2)


def this_run() -> str:
    """This run's mode; appends this run to FAKE_MACMON_LOG."""
    modes = (os.environ.get("FAKE_MACMON_MODE") or "replay").split(",")
    log = os.environ.get("FAKE_MACMON_LOG")
    runs = 0
    if log:
        try:
            with open(log) as f:
                runs = sum(1 for _ in f)
        except FileNotFoundError:
            pass
    mode = modes[min(runs, len(modes) - 1)]
    if log:
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {mode} {time.time():.3f} {' '.join(sys.argv[1:])}\n")
    return mode


def recorded_lines(soc_info: bool) -> list[str]:
    with open(os.environ["FAKE_MACMON_LINES"]) as f:
        lines = [line.strip() for line in f if line.strip()]
    if soc_info:
        return lines
    out = []
    for line in lines:  # macmon prints "soc" only when asked
        doc = json.loads(line)
        out.append(line if "soc" not in doc else
                   json.dumps({k: v for k, v in doc.items() if k != "soc"},
                              separators=(",", ":")))
    return out


def main() -> None:
    mode = this_run()
    if mode == "old" and "--soc-info" in sys.argv:
        usage_error("--soc-info")
    interval, samples, soc_info = parse_args(sys.argv[1:])
    lines = recorded_lines(soc_info)
    after = int(os.environ.get("FAKE_MACMON_AFTER", "1"))
    printed = 0
    while samples == 0 or printed < samples:
        time.sleep(interval)
        if printed >= after and mode == "crash":
            sys.stderr.write("fake macmon: crashing as FAKE_MACMON_MODE asked\n")
            sys.exit(1)
        if printed >= after and mode == "hang":
            while True:
                time.sleep(3600)
        if printed >= after and mode == "garbage":
            line = "macmon: residency state count (9) does not match DVFS table length"
        else:
            line = lines[printed % len(lines)]
        try:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        except BrokenPipeError:
            os._exit(101)  # macmon: println! panics on EPIPE (exit status 101)
        printed += 1


if __name__ == "__main__":
    main()
