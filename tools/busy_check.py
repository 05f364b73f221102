"""Execute the book's chapters beside one busy process per core, under the book's per-cell limit.

The book must build on a machine slower or busier than the one it was written on. This check makes
this machine such a machine: it starts one busy loop per core (``os.cpu_count()``, as ``nproc``),
executes the chapters of ``tools/nbval_chapters.py`` (every chapter; those that train hold the book's
long cells) one by one under nbval with the per-cell timeout of ``_config.yml``, printing each
chapter's time and slowest cells as it ends, and stops the busy loops, however the run ends.
``make busy-check`` runs it; it takes about three times as long as executing the chapters on an idle
machine, and is not part of ``make test``.

Usage: python -m tools.busy_check [--busy N] [--out _build/busy] [CHAPTER.md ...]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from xml.etree import ElementTree

import yaml

from tools.nbval_chapters import nbval_chapters
from tools.notebooks import write_notebooks

ROOT = Path(__file__).resolve().parent.parent
BUSY_LOOP = "while True:\n    pass\n"


def cell_timeout(config: Path = ROOT / "_config.yml") -> int:
    """The book's per-cell limit in seconds: ``execute.timeout`` of ``_config.yml``."""
    return int(yaml.safe_load(config.read_text())["execute"]["timeout"])


def slowest_cells(junit: Path, count: int) -> list[tuple[float, str]]:
    """The ``count`` slowest cells of one nbval run, from its JUnit XML: (seconds, test name)."""
    cases = ElementTree.parse(junit).getroot().iter("testcase")
    return sorted(((float(case.get("time", 0)), case.get("name", "")) for case in cases), reverse=True)[:count]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", type=Path, help="chapters (default: tools/nbval_chapters.py's)")
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 1, help="busy processes (default: one per core)")
    parser.add_argument("--out", type=Path, default=ROOT / "_build" / "busy", help="where the notebooks go")
    args = parser.parse_args(argv)
    notebooks = write_notebooks(args.chapters or nbval_chapters(), args.out)
    timeout = cell_timeout()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill still stops the busy loops (finally)
    busy = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(args.busy)]
    print(f"busy-check: {len(busy)} busy processes beside {len(notebooks)} chapters, "
          f"per-cell limit {timeout} s (_config.yml)", flush=True)
    start, failed, cells = time.perf_counter(), [], []
    try:
        for notebook in notebooks:  # one run each, so that every chapter's timings are printed as it ends
            junit = notebook.with_suffix(".xml")
            began = time.perf_counter()
            result = subprocess.run([sys.executable, "-m", "pytest", "--nbval-lax", f"--nbval-cell-timeout={timeout}",
                                     "-p", "no:cacheprovider", "-q", f"--junitxml={junit}", str(notebook)], cwd=ROOT)
            slowest = slowest_cells(junit, 3) if junit.exists() else []
            cells += [(seconds, f"{notebook.stem} {name}") for seconds, name in slowest]
            print(f"busy-check: {notebook.stem}: {'passed' if result.returncode == 0 else 'FAILED'} in "
                  f"{time.perf_counter() - began:.0f} s; slowest cells: "
                  + ", ".join(f"{name} {seconds:.0f} s" for seconds, name in slowest), flush=True)
            if result.returncode != 0:
                failed.append(notebook.stem)
    finally:
        for process in busy:
            process.kill()
        for process in busy:
            process.wait()
    print(f"busy-check: {'FAILED: ' + ', '.join(failed) if failed else 'passed'} in "
          f"{time.perf_counter() - start:.0f} s beside {len(busy)} busy processes; the slowest cells:", flush=True)
    for seconds, name in sorted(cells, reverse=True)[:5]:
        print(f"  {seconds:6.0f} s  {name}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
