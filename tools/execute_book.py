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

Usage: python -m tools.execute_book [--jobs N] [--cache _build/.jupyter_cache] [CHAPTER.md ...]
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
    result = single_nb_execution(notebook, cwd=str(Path(chapter).parent), timeout=timeout, allow_errors=False,
                                 meta_override=True)
    # nbclient's message: the failing cell's source and its traceback, without nbclient's own frames.
    error = None if result.err is None else (str(result.err) or result.exc_string or repr(result.err))
    return notebook, result.time, error


def execute_book(chapters: list[Path], cache_path: Path, jobs: int, timeout: int,
                 root: Path = ROOT) -> list[str]:
    """Execute the chapters whose cached outputs are missing or stale; return the failed chapters."""
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
    if not todo:
        print(f"execute_book: all {len(chapters)} chapters up to date in {cache_path}", flush=True)
        return []
    last_time = {r.uri: (r.data or {}).get("execution_seconds", 0.0) for r in records}
    order = sorted(todo, key=lambda uri: -last_time.get(uri, float("inf")))  # never executed: first
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


def default_jobs() -> int:
    """One job a core this process may use (``nproc``)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("chapters", nargs="*", type=Path, help="chapters to execute (default: the book's)")
    parser.add_argument("--jobs", type=int, default=default_jobs(), help="chapters at a time (default: nproc)")
    parser.add_argument("--cache", type=Path, default=ROOT / "_build" / ".jupyter_cache")
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
    return 1 if execute_book(chapters, args.cache, min(args.jobs, len(chapters)), cell_timeout()) else 0


if __name__ == "__main__":
    sys.exit(main())
