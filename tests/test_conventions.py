"""The book's conventions, checked on every chapter: figures, exercises (issue 23), code a page can show (issue 48).

A chapter's length is advice, not a check: ``make lint`` lists the chapters over 900 lines (``tools/sizes.py``).
"""

import ast
import re
from pathlib import Path

import pytest

from tools.chapters import chapter_paths, is_tagged, read_chapter

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = chapter_paths(ROOT)


def _ids(paths):
    return [path.stem for path in paths]


def _code_cells(path: Path):
    return [cell for cell in read_chapter(path).cells if cell.cell_type == "code"]


def _drawing_functions(cells) -> set[str]:
    """Names of the functions a chapter defines that end in ``plt.show()``: calling one draws a figure."""
    names = set()
    for cell in cells:
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:  # IPython magics: not a drawing cell
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and "plt.show()" in ast.unparse(node):
                names.add(node.name)
    return names


def _draws(cell, drawing: set[str]) -> bool:
    """Whether the cell draws a figure at top level: ``plt.show()``, or a call of a drawing function."""
    try:
        tree = ast.parse(cell.source)
    except SyntaxError:
        return False
    for statement in tree.body:
        if isinstance(statement, (ast.FunctionDef, ast.ClassDef)):
            continue
        for node in ast.walk(statement):
            if isinstance(node, ast.Call):
                called = ast.unparse(node.func)
                if called == "plt.show" or called in drawing:
                    return True
    return False


@pytest.mark.parametrize("path", CHAPTERS, ids=_ids(CHAPTERS))
def test_every_figure_has_a_caption_and_a_name_and_folds_its_code(path):
    cells = _code_cells(path)
    drawing = _drawing_functions(cells)
    for cell in cells:
        if not _draws(cell, drawing):
            continue
        figure = cell.metadata.get("mystnb", {}).get("figure", {})
        where = f"{path.name}: the cell starting {cell.source.strip().splitlines()[0]!r}"
        assert figure.get("caption", "").strip(), f"{where} draws a figure without a caption"
        assert re.fullmatch(r"fig-[a-z0-9-]+", figure.get("name", "")), f"{where} draws a figure without a fig- name"
        assert is_tagged(cell, "hide-input"), f"{where} draws a figure; tag it hide-input"


@pytest.mark.parametrize("path", CHAPTERS, ids=_ids(CHAPTERS))
def test_every_named_figure_is_referenced(path):
    text = path.read_text()
    for name in re.findall(r"^\s*name: (fig-[a-z0-9-]+)\s*$", text, flags=re.MULTILINE):
        assert re.search(rf"\{{numref\}}`[^`]*{re.escape(name)}>?`", text), f"{path.name}: {name} is never referenced"


@pytest.mark.parametrize("path", CHAPTERS, ids=_ids(CHAPTERS))
def test_exercises_have_solutions_that_are_checked(path):
    text = path.read_text()
    if "\n## Exercises" not in text:
        pytest.fail(f"{path.name} has no Exercises section")
    exercises = text.split("\n## Exercises", 1)[1]
    count = len(re.findall(r"^\d+\. ", exercises, flags=re.MULTILINE))
    solutions = exercises.count(":class: dropdown") + len(re.findall(r"^# Solution to exercise", exercises, re.MULTILINE))
    assert count >= 1, f"{path.name}: no numbered exercises"
    assert solutions >= count, f"{path.name}: {count} exercises but {solutions} solutions"
    # The page shows each hidden cell and each dropdown as one solution behind a click
    # (tests/browser/test_site.py asks for two): two solutions in one cell count once there.
    hidden = exercises.count(":class: dropdown") + len(re.findall(r"^:?tags: \[hide-cell\]", exercises, re.MULTILINE))
    assert hidden >= 2, f"{path.name}: {hidden} hidden solution(s) on the page, the site test asks for two"
    for cell in _code_cells(path):
        if cell.source.lstrip().startswith("# Solution"):
            assert "assert" in cell.source, f"{path.name}: a solution cell that checks nothing: {cell.source[:80]!r}"


@pytest.mark.parametrize("path", CHAPTERS, ids=_ids(CHAPTERS))
def test_title_has_no_math(path):
    # The sidebar prints every chapter's title on every page, and Sphinx loads MathJax only on pages
    # whose own text has math: a `$...$` title stays raw TeX on the pages without any.
    title = next(line for line in path.read_text().splitlines() if line.startswith("# "))
    assert "$" not in title and "\\(" not in title, (
        f"{path.name}'s title {title!r} has math; write it in text (e.g. *n* × *n*), "
        "since the sidebar shows it on pages that do not load MathJax"
    )


#: The book's code column fits about 88 characters at 1280 px; a longer line scrolls sideways.
CODE_COLUMNS = 88
#: The share of code lines that may be wider: literals without a space (a hash, a URL) that
#: ``python -m tools.format_chapters`` cannot cut. The issue allows 2 %; on 2026-11-30 there were none.
WIDE_SHARE = 0.002


def test_chapter_code_fits_the_page():
    lines = [(path.name, line) for path in CHAPTERS for cell in _code_cells(path) for line in cell.source.splitlines()]
    wide = [(name, line) for name, line in lines if len(line) > CODE_COLUMNS]
    share = len(wide) / len(lines)
    worst = sorted({name for name, _ in wide}, key=lambda name: -sum(n == name for n, _ in wide))[:5]
    assert share <= WIDE_SHARE, (
        f"{len(wide)} of {len(lines)} chapter code lines ({share:.1%}) are wider than {CODE_COLUMNS} columns, "
        f"more than {WIDE_SHARE:.0%} (most in {worst}); run `python -m tools.format_chapters`"
    )


#: Tags under which a cell's code is not on the page, or folded away.
HIDDEN_CODE = {"remove-input", "remove-cell", "hide-input", "hide-cell"}


def test_no_glue_call_is_shown_on_a_page():
    # glue() only hands a number to the text; on the page it is build plumbing (reader-html:38).
    # ``python -m tools.format_chapters --tag-plumbing`` moves each call into a remove-input cell,
    # or says why it stays (it reads a clock, or what it reads changes later in its cell).
    shown = []
    for path in CHAPTERS:
        for cell in _code_cells(path):
            if HIDDEN_CODE & set(cell.metadata.get("tags", [])):
                continue
            try:
                tree = ast.parse(cell.source)
            except SyntaxError:
                continue
            if any(isinstance(node, ast.Call) and ast.unparse(node.func) == "glue" for node in ast.walk(tree)):
                shown.append(f"{path.name}: {cell.source.splitlines()[0]}")
    assert not shown, f"{len(shown)} shown cells call glue(): {shown[:5]}"


def test_every_folded_code_cell_says_what_it_holds():
    # MyST-NB labels every folded cell "Show code cell source"; stacked, such bars say nothing
    # (reader-html:38). ``python -m tools.format_chapters --label-code`` labels each by its code.
    unlabelled = [f"{path.name}: {cell.source.splitlines()[0]}" for path in CHAPTERS for cell in _code_cells(path)
                  if {"hide-input", "hide-cell"} & set(cell.metadata.get("tags", []))
                  and not cell.metadata.get("mystnb", {}).get("code_prompt_show")]
    assert not unlabelled, f"{len(unlabelled)} folded cells without a label: {unlabelled[:5]}"
