"""The chapters that nbval executes a second time, on torch's plain CPU kernels: every chapter.

``make nbval`` runs the chapters under ``ATEN_CPU_CAPABILITY=default`` while the strict book build
executes them on this CPU's own kernels (AVX2, AVX-512), so a claim that holds only for one CPU's
rounding fails on any machine. The claims that rest on a long chain of floating-point arithmetic (a
model trained, or a trained model measured) are the ones that could differ between the two paths;
the other chapters' checks (shapes, masks, a layer against ``torch.nn`` at a tolerance of a few
rounding errors) must hold on both as well, and they take seconds. So the list is the book's whole
table of contents, in reading order: a chapter added to ``_toc.yml`` runs under nbval with no list
to update. ``make busy-check`` executes the same chapters beside busy processes.

``tests/test_nbval_chapters.py`` compares the list with ``_toc.yml``.

``--longest-first`` prints them by their time in ``benchmarks/chapter_times.json``, the longest first (a
chapter without a record first of all): pytest runs notebooks in the order named, and with two workers
a long chapter that starts last keeps one core busy alone.

Usage: python -m tools.nbval_chapters [--longest-first]   (prints the chapters' paths, one a line)
"""

from __future__ import annotations

import sys
from pathlib import Path

from tools.chapters import ChapterError, chapter_paths

ROOT = Path(__file__).resolve().parent.parent


def nbval_chapters(root: Path = ROOT) -> list[Path]:
    """Every chapter of ``root/_toc.yml`` under ``chapters/``, in reading order."""
    return chapter_paths(Path(root))


def longest_first(paths: list[Path], seconds: dict[str, float]) -> list[Path]:
    """``paths`` by their ``seconds`` (by chapter name), the longest first; an unrecorded one first."""
    return sorted(paths, key=lambda path: -seconds.get(path.stem, float("inf")))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["--longest-first"]):
        print(f"tools/nbval_chapters.py: expected no argument or --longest-first, got {' '.join(args)}",
              file=sys.stderr)
        return 2
    try:
        paths = nbval_chapters()
    except ChapterError as err:
        print(f"tools/nbval_chapters.py: {err}", file=sys.stderr)
        return 1
    if args:
        from tools.execute_book import recorded_seconds  # noqa: PLC0415

        paths = longest_first(paths, recorded_seconds(ROOT))
    for path in paths:
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
