"""Execute the chapters that train beside one busy process per core, under the book's per-cell limit.

The book must build on a machine slower or busier than the one it was written on. This check makes
this machine such a machine: it starts one busy loop per core (``os.cpu_count()``, as ``nproc``),
executes the chapters of ``tools/nbval_chapters.py`` (those that train; they hold the book's long
cells) under nbval with the per-cell timeout of ``_config.yml``, prints the slowest cells, and stops
the busy loops, however the run ends. ``make busy-check`` runs it; it takes about three times as long
as executing those chapters on an idle machine, and is not part of ``make test``.

Usage: python -m tools.busy_check [--busy N] [--out _build/busy] [CHAPTER.md ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tools.nbval_chapters import arithmetic_chapters
from tools.notebooks import write_notebooks

ROOT = Path(__file__).resolve().parent.parent
BUSY_LOOP = "while True:\n    pass\n"


def cell_timeout(config: Path = ROOT / "_config.yml") -> int:
    """The book's per-cell limit in seconds: ``execute.timeout`` of ``_config.yml``."""
    return int(yaml.safe_load(config.read_text())["execute"]["timeout"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", type=Path, help="chapters (default: tools/nbval_chapters.py's)")
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 1, help="busy processes (default: one per core)")
    parser.add_argument("--out", type=Path, default=ROOT / "_build" / "busy", help="where the notebooks go")
    args = parser.parse_args(argv)
    notebooks = write_notebooks(args.chapters or arithmetic_chapters(), args.out)
    timeout = cell_timeout()
    busy = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(args.busy)]
    print(f"busy-check: {len(busy)} busy processes beside {len(notebooks)} chapters, "
          f"per-cell limit {timeout} s (_config.yml)", flush=True)
    start = time.perf_counter()
    try:
        result = subprocess.run([sys.executable, "-m", "pytest", "--nbval-lax", f"--nbval-cell-timeout={timeout}",
                                 "-p", "no:cacheprovider", "--durations=10", *map(str, notebooks)], cwd=ROOT)
    finally:
        for process in busy:
            process.kill()
        for process in busy:
            process.wait()
    print(f"busy-check: {'passed' if result.returncode == 0 else 'FAILED'} in {time.perf_counter() - start:.0f} s "
          f"beside {len(busy)} busy processes", flush=True)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
