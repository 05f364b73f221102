"""Each chapter's execution time, from the durations pytest prints for nbval, for the preface's table.

``make test`` executes every chapter under nbval, one cell a test; run with ``--durations=0``, pytest
prints every cell's time (``12.34s call  _build/nbval/attention.ipynb::Cell 7``). This sums them per
chapter and writes ``benchmarks/chapter_times.json`` with the machine and the command, which the
preface (``preface.md``) reads to say how long each chapter takes to run.

Usage: python -m tools.chapter_times LOG [--out benchmarks/chapter_times.json] [--command TEXT]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
from collections import defaultdict
from pathlib import Path

from benchmarks.machine import cpu_name
from tools.chapters import reading_order

ROOT = Path(__file__).resolve().parent.parent
#: One line of pytest's --durations report for a cell of nbval: seconds, phase, notebook, cell.
DURATION = re.compile(r"^\s*(?P<seconds>\d+(?:\.\d+)?)s\s+(?:call|setup|teardown)\s+\S*?(?P<name>[\w-]+)\.ipynb::Cell \d+")


def chapter_seconds(log: str) -> dict[str, float]:
    """{chapter name: seconds of its cells} from pytest's --durations lines in ``log``."""
    seconds: dict[str, float] = defaultdict(float)
    for line in log.splitlines():
        match = DURATION.match(line)
        if match:
            seconds[match["name"]] += float(match["seconds"])
    return dict(seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path, help="the output of pytest --nbval-lax --durations=0 over the chapters")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "chapter_times.json")
    parser.add_argument("--command", default="", help="the command that produced the log, for the record")
    args = parser.parse_args(argv)
    try:
        seconds = chapter_seconds(args.log.read_text())
    except OSError as err:
        print(f"chapter_times: cannot read the log {args.log}: {err.strerror}", file=sys.stderr)
        return 2
    chapters = [Path(name).stem for name in reading_order(ROOT)]
    missing = [name for name in chapters if name not in seconds]
    if missing:
        print(f"chapter_times: the log has no durations for {len(missing)} chapter(s): {', '.join(missing)} "
              "(run pytest with --durations=0 over every chapter)", file=sys.stderr)
        return 2
    record = {
        "machine": f"{cpu_name()}, {os.cpu_count()} cores",
        "date": datetime.date.today().isoformat(),
        "command": args.command,
        "seconds": {name: round(seconds[name], 1) for name in chapters},
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"chapter_times: {len(chapters)} chapters, {sum(record['seconds'].values()) / 60:.1f} min in all -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
