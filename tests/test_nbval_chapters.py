"""nbval (and the busy-machine check) run every chapter of the book, in reading order.

The list of ``tools/nbval_chapters.py`` is compared with ``_toc.yml`` read here on its own, so a chapter
added to the table of contents runs under nbval on torch's plain CPU kernels, whether it trains a
model or not.
"""

import json
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
    assert nbval_chapters.main([]) == 0
    assert capsys.readouterr().out.splitlines() == toc_chapters()


def test_longest_first_orders_by_the_record_and_puts_an_unrecorded_chapter_first(capsys):
    paths = [Path("chapters/a.md"), Path("chapters/b.md"), Path("chapters/c.md"), Path("chapters/d.md")]
    seconds = {"a": 5.0, "b": 300.0, "d": 40.0}
    assert nbval_chapters.longest_first(paths, seconds) == [paths[2], paths[1], paths[3], paths[0]]
    assert nbval_chapters.main(["--longest-first"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert sorted(printed) == sorted(toc_chapters())  # the same chapters, every one
    record = json.loads((ROOT / "benchmarks" / "chapter_times.json").read_text())["seconds"]
    times = [record.get(Path(name).stem, float("inf")) for name in printed]
    assert times == sorted(times, reverse=True)


def test_a_wrong_argument_is_one_line_and_exit_2(capsys):
    assert nbval_chapters.main(["--fastest"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--longest-first" in err and "--fastest" in err
