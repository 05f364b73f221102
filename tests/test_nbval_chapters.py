"""nbval (and the busy-machine check) run every chapter of the book, in reading order.

The list of ``tools/nbval_chapters.py`` is compared with ``_toc.yml`` read here on its own, so a chapter
added to the table of contents runs under nbval on torch's plain CPU kernels, whether it trains a
model or not.
"""

from pathlib import Path

import yaml

from tools import nbval_chapters

ROOT = Path(__file__).resolve().parent.parent


def toc_chapters() -> list[str]:
    """The ``chapters/`` entries of ``_toc.yml``: its root, then each part's chapters, as written."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]] + [entry["file"] for part in toc["parts"] for entry in part["chapters"]]
    return [f"{name}.md" for name in files if name.startswith("chapters/")]


def test_nbval_runs_every_chapter_of_the_toc_in_reading_order():
    listed = [path.relative_to(ROOT).as_posix() for path in nbval_chapters.nbval_chapters()]
    assert listed == toc_chapters()
    assert len(listed) == len(list((ROOT / "chapters").glob("*.md"))) > 40


def test_the_command_prints_the_list(capsys):
    assert nbval_chapters.main() == 0
    assert capsys.readouterr().out.splitlines() == toc_chapters()
