"""A pytest plugin: keep what nbval executed, so that the book's build need not execute it again.

``make test`` used to execute every chapter twice: once under nbval (on torch's plain kernels,
``tools/nbval_chapters.py``) and once more for the strict book build. With this plugin nbval's run
writes each notebook whose cells all passed, with the outputs its cells printed and drew, into a
folder (``--nbval-save DIR``, ``DIR/<chapter>.ipynb``); ``tools/execute_book.py --executed DIR`` then
puts those outputs into the build's cache, and the strict build reads them. A notebook with a failing
cell is not written (its chapter would be executed again by the build, and fail there too).

nbval keeps a cell's outputs as it reads them from the kernel (``IPyNbCell.test_outputs``: streams
joined, displays and results with their data and metadata, which MyST-NB's ``glue`` reads); the plugin
sets them on the cell of the notebook nbval read, numbers the cells in order, and records the
notebook's execution time (the sum of its cells') in its metadata as ``nbval_seconds``. It works under
pytest-xdist (``--dist loadfile``: a notebook's cells run in one worker, which writes it).

Usage: python -m pytest --nbval-lax -p tools.nbval_save --nbval-save DIR NOTEBOOK.ipynb ...
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

#: The metadata key of a saved notebook that holds its cells' execution time, in seconds.
SECONDS_KEY = "nbval_seconds"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("nbval").addoption(
        "--nbval-save", metavar="DIR", type=Path, default=None,
        help="write each notebook whose cells all passed, with their outputs, into DIR (tools/nbval_save.py)")


class _Notebook:
    """One notebook's run so far: its cells that passed, whether one failed, the seconds spent."""

    def __init__(self, parent) -> None:
        self.parent = parent
        self.passed = 0
        self.failed = False
        self.seconds = 0.0


def _runs(config: pytest.Config) -> dict[str, _Notebook]:
    runs = getattr(config, "_nbval_save_runs", None)
    if runs is None:
        runs = config._nbval_save_runs = {}  # type: ignore[attr-defined]
    return runs


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Record each nbval cell's outcome; keep a passing cell's outputs on the notebook nbval read."""
    outcome = yield
    if item.config.getoption("nbval_save") is None or not hasattr(item, "test_outputs"):
        return
    report = outcome.get_result()
    run = _runs(item.config).setdefault(str(item.parent.path), _Notebook(item.parent))
    if report.when == "call" and report.passed and item.test_outputs is not None:
        run.passed += 1
        run.seconds += report.duration
        item.cell.outputs = [nbformat.from_dict(dict(output)) for output in item.test_outputs]
        item.cell.execution_count = run.passed
        for output in item.cell.outputs:
            if output.output_type == "execute_result":
                output.execution_count = run.passed
    elif report.failed or report.skipped:
        run.failed = True


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write every notebook whose code cells all ran and passed."""
    folder = session.config.getoption("nbval_save")
    if folder is None:
        return
    for path, run in _runs(session.config).items():
        cells = [cell for cell in run.parent.nb.cells if cell.cell_type == "code"]
        if run.failed or run.passed != len(cells):
            continue
        folder.mkdir(parents=True, exist_ok=True)
        notebook = run.parent.nb
        notebook.metadata[SECONDS_KEY] = round(run.seconds, 3)
        nbformat.write(notebook, str(folder / Path(path).name))
