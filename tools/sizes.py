"""List the package's modules over 300 lines and the chapters over 900: advice, never a failure.

A module of one idea reads in a sitting (``__init__.py``, which only re-exports, aside), and so does a
chapter; one that has grown past its size is worth a look: split into modules of one idea each, or
into chapters, or cut repetition. ``make lint`` prints this list after ruff. The sizes are advice, so
the command always exits 0: a long module or chapter is a reason to think, not a broken build.

Usage: python -m tools.sizes
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULE_LINES = 300
CHAPTER_LINES = 900


def line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def oversized(root: Path = ROOT) -> list[tuple[str, int, int]]:
    """(path under ``root``, lines, the size) of every module and chapter longer than its size."""
    root = Path(root)
    modules = sorted(p for p in (root / "transformer").rglob("*.py") if p.name != "__init__.py")
    chapters = sorted((root / "chapters").glob("*.md"))
    return [(path.relative_to(root).as_posix(), lines, limit)
            for paths, limit in ((modules, MODULE_LINES), (chapters, CHAPTER_LINES))
            for path in paths if (lines := line_count(path)) > limit]


def advice(found: list[tuple[str, int, int]]) -> list[str]:
    """One line of advice for each of ``oversized``'s findings, or one line saying there are none."""
    if not found:
        return [f"sizes: every module within {MODULE_LINES} lines, every chapter within {CHAPTER_LINES}"]
    def hint(path: str) -> str:
        return "split it into modules of one idea each" if path.endswith(".py") else "split it, or cut repetition"

    return [f"sizes: {path} has {lines} lines, more than {limit} ({hint(path)}; advice, not an error)"
            for path, lines, limit in found]


def main() -> int:
    print("\n".join(advice(oversized())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
