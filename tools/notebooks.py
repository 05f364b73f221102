"""Write ``.ipynb`` copies of the chapters into a build folder.

The copies are what nbval executes and what a reader can open in a plain
Jupyter. They never go beside the ``.md`` files: a paired ``x.ipynb`` next to
``x.md`` would be a duplicate document in the book.

Usage: python -m tools.notebooks [--out _build/notebooks] [CHAPTER.md ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jupytext

from tools.chapters import ChapterError, chapter_paths, read_chapter

ROOT = Path(__file__).resolve().parent.parent


def write_notebooks(chapters: list[Path], out: Path) -> list[Path]:
    """Convert each chapter to ``out/<name>.ipynb``; return the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in chapters:
        nb = read_chapter(path)
        target = out / (path.stem + ".ipynb")
        jupytext.write(nb, target, fmt="ipynb")
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", type=Path, help="chapters to convert (default: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "_build" / "notebooks")
    args = parser.parse_args(argv)
    chapters = args.chapters or chapter_paths(ROOT)
    if not chapters:
        print("no chapters found under chapters/", file=sys.stderr)
        return 1
    try:
        written = write_notebooks(chapters, args.out)
    except ChapterError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for target in written:
        print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
