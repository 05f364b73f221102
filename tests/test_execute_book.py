"""`make book`'s executor (tools/execute_book.py): a chapter is executed again when, and only when,
its key changes (the chapter, the package, the files its cells read, the requirements)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_exporter import HEADER, code
from tools import execute_book
from tools.execute_book import chapter_key, inputs_digest
from tools.nbval_save import SECONDS_KEY
from tools.notebooks import write_notebooks

ROOT = Path(__file__).resolve().parent.parent


def chapter(source: str) -> str:
    """A chapter of one code cell (the exporter tests' header)."""
    return HEADER.format(extra="") + "\n# A chapter\n\n" + code(source)


@pytest.fixture
def book(tmp_path):
    """A book with two chapters, a package, data, a model, benchmark records, requirements and other files."""
    for name, text in {
        "chapters/a.md": chapter("x = 1\nprint(x)"),
        "chapters/b.md": chapter("y = 2"),
        "transformer/nn/layer.py": "LAYER = 1\n",
        "data/lines.txt": "one\n",
        "models/m/results.json": "{}\n",
        "benchmarks/speed_results.json": "{}\n",
        "requirements.txt": "torch==1\n",
        "requirements-export.txt": "pyyaml==6\n",
        "pyproject.toml": "[project]\n",
        "package-lock.json": "{}\n",
        "README.md": "# The book\n",
        "tests/test_x.py": "def test_x(): pass\n",
        "tools/export.py": "\n",
        "_toc.yml": "root: chapters/a\n",
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    shutil.copy(ROOT / "_config.yml", tmp_path / "_config.yml")
    return tmp_path


def keys(book: Path) -> dict[str, str]:
    inputs = inputs_digest(book)
    return {name: chapter_key(book / "chapters" / name, inputs) for name in ("a.md", "b.md")}


def test_the_key_is_stable_and_differs_between_chapters(book):
    assert keys(book) == keys(book) and len(set(keys(book).values())) == 2


def test_editing_a_chapter_changes_its_key_only(book):
    before = keys(book)
    (book / "chapters" / "a.md").write_text((book / "chapters" / "a.md").read_text() + "\nA sentence more.\n")
    after = keys(book)
    assert after["a.md"] != before["a.md"] and after["b.md"] == before["b.md"]


@pytest.mark.parametrize("name", ["transformer/nn/layer.py", "transformer/nn/new.py", "data/lines.txt",
                                  "models/m/results.json", "benchmarks/speed_results.json", "requirements.txt",
                                  "requirements-export.txt", "pyproject.toml", "package-lock.json"])
def test_the_package_the_files_read_and_the_requirements_change_every_key(book, name):
    before = keys(book)
    path = book / name
    path.write_text((path.read_text() if path.exists() else "") + "# changed\n")
    after = keys(book)
    assert after["a.md"] != before["a.md"] and after["b.md"] != before["b.md"]


def test_a_renamed_package_file_changes_every_key(book):
    before = keys(book)
    (book / "transformer" / "nn" / "layer.py").rename(book / "transformer" / "nn" / "layers.py")
    assert keys(book)["a.md"] != before["a.md"]


@pytest.mark.parametrize("name", ["README.md", "tests/test_x.py", "tools/export.py", "_toc.yml", "_config.yml",
                                  "transformer/nn/__pycache__/layer.cpython-311.pyc",
                                  "transformer.egg-info/PKG-INFO", "_build/html/index.html"])
def test_nothing_else_changes_a_key(book, name):
    before = keys(book)
    path = book / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text((path.read_text() if path.exists() else "") + "# changed\n")
    assert keys(book) == before


@pytest.mark.slow
def test_chapters_are_executed_once_per_change_and_a_failing_one_is_named(book, capsys, monkeypatch):
    monkeypatch.setenv("JUPYTER_PATH", str(ROOT / "tools" / "jupyter"))  # the book's kernel
    cache = book / "_build" / ".jupyter_cache"
    chapters = [book / "chapters" / "a.md", book / "chapters" / "b.md"]
    assert execute_book.execute_book(chapters, cache, jobs=2, timeout=60, root=book) == []
    assert "2 of 2 executed" in capsys.readouterr().out
    assert execute_book.execute_book(chapters, cache, jobs=2, timeout=60, root=book) == []
    assert "all 2 chapters up to date" in capsys.readouterr().out

    (book / "chapters" / "b.md").write_text(chapter("assert 1 + 1 == 3, 'arithmetic'"))
    assert execute_book.execute_book(chapters, cache, jobs=2, timeout=60, root=book) == ["chapters/b.md"]
    out = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)  # without the traceback's colours
    assert "1 of 2 chapters to execute" in out and "chapters/b.md FAILED" in out and "AssertionError: arithmetic" in out

    from jupyter_cache import get_cache

    records = get_cache(str(cache)).list_cache_records()
    assert [Path(r.uri).name for r in records] == ["a.md"]  # b's earlier outputs are dropped
    outputs = get_cache(str(cache)).get_cache_bundle(records[0].pk).nb.cells[0].outputs
    assert outputs[0]["text"] == "1\n"


def test_a_kernel_is_stopped_once_its_last_cell_has_answered(book, monkeypatch):
    """A graceful shutdown waits for the kernel's interpreter to tear down (with torch loaded, seconds a
    chapter); the executor kills it instead once every output is in hand, as nbval does: the kernel's
    exit handlers, which a graceful shutdown runs, never run."""
    monkeypatch.setenv("JUPYTER_PATH", str(ROOT / "tools" / "jupyter"))
    torn_down = book / "torn-down"
    (book / "chapters" / "a.md").write_text(chapter(
        f"import atexit, pathlib\natexit.register(pathlib.Path({str(torn_down)!r}).touch)\nprint('done')"))
    notebook, _, error = execute_book._execute(str(book / "chapters" / "a.md"), 60, book)
    (cell,) = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert error is None and cell.outputs[0]["text"] == "done\n"
    assert not torn_down.exists()


def run_nbval(book: Path, names: list[str], save: Path) -> subprocess.CompletedProcess:
    """nbval over the chapters' notebooks, as `make nbval` runs it, keeping what passed in ``save``."""
    notebooks = write_notebooks([book / "chapters" / name for name in names], book / "_build" / "nbval")
    (book / "pytest.ini").write_text("[pytest]\n")
    env = {**os.environ, "JUPYTER_PATH": str(ROOT / "tools" / "jupyter"), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "pytest", "--nbval-lax", "-p", "tools.nbval_save",
                           "--nbval-save", str(save), "-p", "no:cacheprovider", "-q", "--rootdir", str(book),
                           "-c", str(book / "pytest.ini"), *map(str, notebooks)],
                          cwd=book, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # pytest and three kernels in a process, then two more kernels
def test_nbval_keeps_the_notebooks_that_passed_and_the_build_caches_them_without_executing(book, capsys,
                                                                                          monkeypatch):
    (book / "chapters" / "b.md").write_text(chapter("assert 1 + 1 == 3, 'arithmetic'"))
    (book / "chapters" / "c.md").write_text(chapter("from IPython.display import display\n"
                                                   "display({'text/plain': 'shown'}, raw=True)\n3 * 7"))
    save = book / "_build" / "nbval-executed"
    run = run_nbval(book, ["a.md", "b.md", "c.md"], save)
    assert run.returncode == 1 and "arithmetic" in run.stdout, run.stdout + run.stderr  # b failed
    assert sorted(p.name for p in save.iterdir()) == ["a.ipynb", "c.ipynb"]  # b, which failed, is not kept
    import nbformat

    kept = nbformat.read(str(save / "c.ipynb"), as_version=4)
    outputs = kept.cells[[c.cell_type for c in kept.cells].index("code")].outputs
    assert [o.output_type for o in outputs] == ["display_data", "execute_result"]
    assert outputs[0].data["text/plain"] == "shown" and outputs[1].data["text/plain"] == "21"
    assert kept.metadata[SECONDS_KEY] >= 0

    # the build caches a and c from nbval's run (a after an edit of the chapter is executed again)
    monkeypatch.setenv("JUPYTER_PATH", str(ROOT / "tools" / "jupyter"))
    (book / "chapters" / "a.md").write_text(chapter("x = 2\nprint(x)"))
    chapters = [book / "chapters" / name for name in ("a.md", "b.md", "c.md")]
    cache = book / "_build" / ".jupyter_cache"
    (book / "chapters" / "b.md").write_text(chapter("y = 2"))
    assert execute_book.execute_book(chapters, cache, jobs=1, timeout=60, root=book, executed=save) == []
    out = capsys.readouterr().out
    assert "1 of 3 chapters taken from nbval's run" in out and "2 of 3 chapters to execute" in out
    from jupyter_cache import get_cache

    store = get_cache(str(cache))
    by_name = {Path(r.uri).name: r for r in store.list_cache_records()}
    assert sorted(by_name) == ["a.md", "b.md", "c.md"]
    cached = [c for c in store.get_cache_bundle(by_name["c.md"].pk).nb.cells if c.cell_type == "code"]
    assert cached[0].outputs == outputs  # nbval's outputs, as kept
    assert by_name["c.md"].data["book_key"] == chapter_key(chapters[2], inputs_digest(book))
    ran = [c for c in store.get_cache_bundle(by_name["a.md"].pk).nb.cells if c.cell_type == "code"]
    assert ran[0].outputs[0]["text"] == "2\n"  # the edited a, executed here
    assert execute_book.execute_book(chapters, cache, jobs=1, timeout=60, root=book, executed=save) == []
    assert "all 3 chapters up to date" in capsys.readouterr().out


def test_executed_must_be_a_folder(tmp_path, capsys):
    assert execute_book.main(["--executed", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--executed" in err and "missing" in err
