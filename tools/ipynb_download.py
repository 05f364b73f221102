"""A Sphinx extension: each chapter's page offers its executed notebook, ``.ipynb``, for download.

The book's theme (sphinx-book-theme) adds an ``.ipynb`` entry to a page's download menu only as a side
effect of its launch buttons, which need a repository; a local build, or one published without
``--repository``, offered the chapter's ``.md`` source and the print dialog alone. MyST-NB writes every
notebook to ``_build/jupyter_execute/``, so this extension copies the page's notebook beside the page's
sources (with the cache's outputs put back when the build read them from the cache, which MyST-NB's copy
lacks) and tells the theme where it is, before the theme builds the menu (priority 500, the theme's
handlers run at 501).

Loaded by ``_config.yml`` (``sphinx.local_extensions``, which puts this folder on ``sys.path``, and
``sphinx.config.extensions``). Checked by ``tests/browser/test_site.py``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any


def executed_notebook(outdir: str | Path, pagename: str) -> Path:
    """Where MyST-NB writes the executed notebook of ``pagename`` for the HTML build in ``outdir``."""
    return Path(outdir).parent / "jupyter_execute" / f"{pagename}.ipynb"


def offer_notebook(app: Any, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    """Copy the page's executed notebook to ``_sources/`` and name it in the page's context."""
    executed = executed_notebook(app.outdir, pagename)
    if not executed.is_file():  # a page that is not a notebook (the bibliography, the glossary)
        return
    target = Path(app.outdir) / "_sources" / f"{pagename}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(executed, target)
    mystnb = getattr(getattr(app, "env", None), "mystnb_config", None)
    if mystnb is not None and mystnb.execution_mode == "cache":
        with_cached_outputs(target, mystnb.execution_cache_path)
    context["ipynb_source"] = f"{pagename}.ipynb"


def with_cached_outputs(path: Path, cache_path: str | Path) -> None:
    """Put the outputs of the build's cache into the notebook at ``path``. A build that reads
    a chapter's outputs from the cache (``execute_notebooks: cache``: ``make book``, ``make test``)
    renders them, but MyST-NB merges them into a copy and writes ``jupyter_execute/`` from the
    notebook as it read it, without outputs; a notebook the cache does not hold is left as it is."""
    import nbformat  # noqa: PLC0415 (Sphinx's process has them: MyST-NB's dependencies)
    from jupyter_cache import get_cache  # noqa: PLC0415

    notebook = nbformat.read(path, as_version=4)
    try:
        _, merged = get_cache(str(cache_path)).merge_match_into_notebook(notebook)
    except KeyError:  # not in the cache
        return
    nbformat.write(merged, path)


def setup(app: Any) -> dict:
    app.connect("html-page-context", offer_notebook, priority=500)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
