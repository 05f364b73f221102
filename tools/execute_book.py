"""Execute the book's chapters into the build's cache: side by side, and once per change.

``jupyter-book build`` with ``execute_notebooks: cache`` (``make book``) takes a chapter's outputs
from the build's jupyter-cache, ``_build/.jupyter_cache``, when the cache holds the chapter's code,
and executes the chapters it misses one after another. This command fills that cache first:

- side by side: ``--jobs`` chapters at a time (``make book``: one a core, ``nproc``), each kernel on
  one thread when more than one runs (``OMP_NUM_THREADS=1``, which torch and ``free_cores()`` honour),
  the longest first (by their last execution's time), so that a long chapter does not start last;
- once per change: a chapter's cache record carries a key, a hash of the chapter's file and of what
  its cells read (``KEY_INPUTS``: the package, the data, the models and benchmark records, the
  requirements). A chapter whose record carries the current key is not executed again, so a
  second ``make book`` with nothing changed executes nothing, and an edit of one chapter executes
  that chapter (an edit of the package or of the requirements, every chapter).

A failing cell fails the command, naming the chapter and printing the cell's traceback, once the
other chapters have run (as the build's ``--keep-going``); the chapter's earlier outputs are dropped
from the cache, so no build reads them. Cells are executed as the build executes them: the notebook
read by MyST-NB's reader (the cache matches notebooks by their code cells), in the chapter's folder,
under the per-cell limit of ``_config.yml``.

A chapter that nbval has just executed need not be executed again: ``--executed DIR`` takes the
outputs nbval's run kept (``tools/nbval_save.py``, ``DIR/<chapter>.ipynb``, written only when every
cell passed) and caches them under the chapter's key, as if executed here, when the saved notebook's
code cells are the chapter's, character for character; any other chapter is executed. ``make test``
so executes each chapter once, under nbval on torch's plain kernels, and its strict build reads them.

Usage: python -m tools.execute_book [--jobs N] [--cache _build/.jupyter_cache] [--executed DIR] [CHAPTER.md ...]
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import suppress
from pathlib import Path

import yaml

from tools.busy_check import cell_timeout
from tools.chapters import ChapterError, chapter_paths

ROOT = Path(__file__).resolve().parent.parent
#: What a chapter's outputs depend on besides the chapter itself: the package its cells import, the
#: files they read (``data/``, ``models/``, the records under ``benchmarks/``), and the requirements,
#: Python's and npm's (which pins the SpamAssassin corpus under ``node_modules/``). Nothing else
#: (another chapter, the tests, the README) makes a chapter execute again.
KEY_INPUTS = ("transformer", "data", "models", "benchmarks", "requirements.txt", "requirements-export.txt",
              "pyproject.toml", "package.json", "package-lock.json")
#: Files under KEY_INPUTS that no chapter reads: Python's bytecode caches and pip's metadata.
_SKIPPED = ("__pycache__", ".egg-info")


def inputs_digest(root: Path = ROOT) -> str:
    """A hash of every file under ``KEY_INPUTS`` (its path and its bytes), the same for every chapter."""
    digest = hashlib.sha256()
    for name in KEY_INPUTS:
        top = Path(root) / name
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file()) if top.is_dir() else []
        for path in files:
            if any(part.endswith(_SKIPPED) for part in path.relative_to(root).parts) or path.suffix == ".pyc":
                continue
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def chapter_key(chapter: Path, inputs: str) -> str:
    """The key of one chapter's outputs: its file's bytes and ``inputs`` (``inputs_digest``)."""
    return hashlib.sha256(inputs.encode() + b"\0" + Path(chapter).read_bytes()).hexdigest()


def read_notebook(chapter: Path, root: Path = ROOT):
    """The chapter as MyST-NB reads it for the build, with the Markdown extensions of ``_config.yml``."""
    from myst_nb.core.read import read_myst_markdown_notebook  # noqa: PLC0415 (Sphinx: slow to import)
    from myst_parser.config.main import MdParserConfig  # noqa: PLC0415

    extensions = yaml.safe_load((Path(root) / "_config.yml").read_text())["parse"]["myst_enable_extensions"]
    config = MdParserConfig(enable_extensions=set(extensions))
    return read_myst_markdown_notebook(Path(chapter).read_text(encoding="utf8"), config=config,
                                       add_source_map=True, path=str(chapter))


def _execute(chapter: str, timeout: int, root: Path) -> tuple[object, float, str | None]:
    """Execute one chapter in a worker process: (the executed notebook, seconds, traceback or None)."""
    from jupyter_cache.executors.utils import single_nb_execution  # noqa: PLC0415

    notebook = read_notebook(Path(chapter), root)
    # The kernel is stopped at once (SIGKILL to its process group) once its last cell has answered,
    # as nbval stops its kernels: every output is in hand by then, and a graceful shutdown only waits
    # for the interpreter to tear down torch (1.6 to 2.6 s a chapter measured here, a minute of the
    # book's wall time over 48 chapters on two cores).
    result = single_nb_execution(notebook, cwd=str(Path(chapter).parent), timeout=timeout, allow_errors=False,
                                 meta_override=True, shutdown_kernel="immediate")
    # nbclient's message: the failing cell's source and its traceback, without nbclient's own frames.
    error = None if result.err is None else (str(result.err) or result.exc_string or repr(result.err))
    return notebook, result.time, error


def executed_by_nbval(chapter: Path, folder: Path, root: Path = ROOT):
    """The chapter as the build reads it, with the outputs nbval's run kept in ``folder``, and the
    seconds it took; ``None`` when ``folder`` has no notebook of the chapter or its code differs."""
    import nbformat  # noqa: PLC0415

    from tools.nbval_save import SECONDS_KEY  # noqa: PLC0415

    saved_path = Path(folder) / (Path(chapter).stem + ".ipynb")
    if not saved_path.is_file():
        return None
    saved_notebook = nbformat.read(str(saved_path), as_version=4)
    saved = [cell for cell in saved_notebook.cells if cell.cell_type == "code"]
    notebook = read_notebook(chapter, root)
    cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    if [cell.source for cell in saved] != [cell.source for cell in cells]:
        return None
    for cell, ran in zip(cells, saved, strict=True):
        cell.outputs, cell.execution_count = ran.outputs, ran.execution_count
    return notebook, float(saved_notebook.metadata.get(SECONDS_KEY, 0.0))


def execute_book(chapters: list[Path], cache_path: Path, jobs: int, timeout: int,
                 root: Path = ROOT, executed: Path | None = None) -> list[str]:
    """Execute the chapters whose cached outputs are missing or stale; return the failed chapters.

    With ``executed`` (a folder of ``tools/nbval_save.py``), a chapter nbval ran is cached from it."""
    from jupyter_cache import get_cache  # noqa: PLC0415
    from jupyter_cache.base import CacheBundleIn  # noqa: PLC0415

    cache = get_cache(str(cache_path))
    inputs = inputs_digest(root)
    records = cache.list_cache_records()
    todo: dict[str, str] = {}  # chapter: its key
    for chapter in chapters:
        uri, key = str(Path(chapter).resolve()), chapter_key(chapter, inputs)
        try:
            record = cache.match_cache_notebook(read_notebook(chapter, root))
        except KeyError:
            record = None
        if record is None or (record.data or {}).get("book_key") != key:
            todo[uri] = key
    if executed is not None:
        taken = []
        for uri in list(todo):
            found = executed_by_nbval(Path(uri), executed, root)
            if found is None:
                continue
            for pk in [r.pk for r in cache.list_cache_records() if r.uri == uri]:
                with suppress(KeyError):
                    cache.remove_cache(pk)
            cache.cache_notebook_bundle(CacheBundleIn(found[0], uri, data={"execution_seconds": found[1],
                                                                           "book_key": todo.pop(uri)}),
                                        check_validity=False, overwrite=True)
            taken.append(uri)
        print(f"execute_book: {len(taken)} of {len(chapters)} chapters taken from nbval's run in {executed}",
              flush=True)
    if not todo:
        print(f"execute_book: all {len(chapters)} chapters up to date in {cache_path}", flush=True)
        return []
    last_time = {r.uri: (r.data or {}).get("execution_seconds", 0.0) for r in records}
    recorded = recorded_seconds(root)
    # the longest first: by the cache's last time, else the committed record; never timed: first
    order = sorted(todo, key=lambda uri: -last_time.get(uri, recorded.get(Path(uri).stem, float("inf"))))
    print(f"execute_book: {len(order)} of {len(chapters)} chapters to execute, {jobs} at a time"
          + (" (one thread each)" if jobs > 1 else ""), flush=True)
    failed, start = [], time.perf_counter()
    # Fresh interpreters ("spawn"), not copies of this one with its open cache database.
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_execute, uri, timeout, root): uri for uri in order}
        for done, future in enumerate(as_completed(futures), 1):
            uri = futures[future]
            name = Path(uri).relative_to(Path(root).resolve()).as_posix()
            stale = [r.pk for r in cache.list_cache_records() if r.uri == uri]
            try:
                notebook, seconds, error = future.result()
            except Exception as err:  # the worker itself failed (a kernel that would not start, ...)
                notebook, seconds, error = None, 0.0, repr(err)
            for pk in stale:  # the chapter's earlier outputs: replaced, or dropped when it failed
                with suppress(KeyError):
                    cache.remove_cache(pk)
            if error is not None:
                failed.append(name)
                print(f"execute_book: {name} FAILED after {seconds:.0f} s ({done}/{len(order)}):\n{error}", flush=True)
                continue
            cache.cache_notebook_bundle(CacheBundleIn(notebook, uri, data={"execution_seconds": seconds,
                                                                            "book_key": todo[uri]}),
                                        check_validity=False, overwrite=True)
            print(f"execute_book: {name} in {seconds:.0f} s ({done}/{len(order)})", flush=True)
    print(f"execute_book: {len(order) - len(failed)} of {len(order)} executed in {time.perf_counter() - start:.0f} s"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""), flush=True)
    return failed


def recorded_seconds(root: Path = ROOT) -> dict[str, float]:
    """Each chapter's seconds in ``benchmarks/chapter_times.json`` (the build's last record), by name."""
    import json  # noqa: PLC0415

    try:
        return dict(json.loads((Path(root) / "benchmarks" / "chapter_times.json").read_text())["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def default_jobs() -> int:
    """One job a core this process may use (``nproc``)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("chapters", nargs="*", type=Path, help="chapters to execute (default: the book's)")
    parser.add_argument("--jobs", type=int, default=default_jobs(), help="chapters at a time (default: nproc)")
    parser.add_argument("--cache", type=Path, default=ROOT / "_build" / ".jupyter_cache")
    parser.add_argument("--executed", type=Path, default=None, metavar="DIR",
                        help="cache the chapters nbval executed, kept in DIR by tools/nbval_save.py")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        print(f"execute_book: --jobs must be at least 1, got {args.jobs}", file=sys.stderr)
        return 2
    try:
        chapters = args.chapters or chapter_paths(ROOT)
    except ChapterError as err:
        print(f"execute_book: {err}", file=sys.stderr)
        return 1
    if args.jobs > 1:
        os.environ["OMP_NUM_THREADS"] = "1"  # the kernels inherit it: one thread per chapter, one chapter a core
    if args.executed is not None and not args.executed.is_dir():
        print(f"execute_book: --executed must be a folder of nbval's notebooks, got {args.executed} "
              "(not a folder)", file=sys.stderr)
        return 2
    return 1 if execute_book(chapters, args.cache, min(args.jobs, len(chapters)), cell_timeout(),
                             executed=args.executed) else 0


if __name__ == "__main__":
    sys.exit(main())
