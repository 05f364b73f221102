"""Find and read the book's chapters.

A chapter is a MyST Markdown notebook under ``chapters/``, in jupytext's
``myst`` format. Everything that reads chapters (the exporter, the notebook
writer behind nbval) goes through :func:`read_chapter`, so a chapter whose
header jupytext misreads fails loudly instead of silently testing nothing.

The reading order is the book's table of contents, ``_toc.yml``, not the file
names: the exporter writes a module's cells chapter by chapter in this order,
so a cell reads after its owner's cells wherever the files sort.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import jupytext
import yaml

__all__ = ["ChapterError", "chapter_paths", "reading_order", "read_chapter", "is_tagged"]

#: The chapters of a folder without a ``_toc.yml`` (the small books the tests make), in file-name order.
CHAPTER_GLOB = "*.md"
TOC = "_toc.yml"


class ChapterError(Exception):
    """A chapter cannot be read, exported or run; the message names the chapter."""


def reading_order(root: Path) -> list[str]:
    """Every file of ``root/_toc.yml`` under ``chapters/``, in the table's order, as ``chapters/x.md``.

    The table's root comes first, then each entry of each part, an entry's ``sections`` after it.
    """
    toc = yaml.safe_load((Path(root) / TOC).read_text()) or {}

    def files(entries: list[dict]) -> list[str]:
        found = []
        for entry in entries:
            if "file" in entry:
                found.append(str(entry["file"]))
            found += files(entry.get("sections", []))
        return found

    names = ([str(toc["root"])] if "root" in toc else []) + files(toc.get("chapters", []))
    for part in toc.get("parts", []):
        names += files(part.get("chapters", []))
    return [f"{name.removesuffix('.md')}.md" for name in names if name.startswith("chapters/")]


def chapter_paths(root: Path) -> list[Path]:
    """Every chapter under ``root/chapters``, in reading order: the order of ``root/_toc.yml``.

    Raises ChapterError when a chapter is missing from the table, or the table names a file that
    does not exist. A folder without a ``_toc.yml`` reads its chapters in file-name order.
    """
    root = Path(root)
    on_disk = sorted((root / "chapters").glob(CHAPTER_GLOB))
    if not (root / TOC).exists():
        return on_disk
    order = [root / name for name in reading_order(root)]
    absent = [path.relative_to(root).as_posix() for path in order if not path.exists()]
    if absent:
        raise ChapterError(f"{TOC} names chapters that do not exist: {absent}")
    unlisted = [path.relative_to(root).as_posix() for path in on_disk if path not in order]
    if unlisted:
        raise ChapterError(f"{unlisted} are not in {TOC}: add each where it reads in the book")
    return order


@functools.lru_cache(maxsize=256)
def _parse(text: str):
    """jupytext's notebook for a chapter's text, parsed once per process: the tests and the exporter
    read the same 48 chapters many times, and parsing is most of their time (0.3 s a chapter). Keyed on
    the text itself, so an edited chapter is parsed again; callers get a copy (:func:`read_chapter`)."""
    return jupytext.reads(text, fmt="md:myst")


def read_chapter(path: Path):
    """Read one chapter as a notebook, refusing one that would run no code.

    Raises ChapterError when the jupytext header is incomplete (no
    ``format_name: myst`` or no kernelspec) or when no code cell was found.
    """
    path = Path(path)
    header = _front_matter(path)
    fmt = (header.get("jupytext") or {}).get("text_representation") or {}
    if fmt.get("format_name") != "myst":
        raise ChapterError(
            f"{path}: its header does not declare jupytext's myst format "
            f"(expected jupytext.text_representation.format_name: myst, got {fmt.get('format_name')!r})"
        )
    if "kernelspec" not in header:
        raise ChapterError(f"{path}: its header has no kernelspec, so it cannot be executed")
    try:
        nb = copy.deepcopy(_parse(path.read_text(encoding="utf-8")))
    except Exception as err:  # jupytext raises several types for a bad file
        raise ChapterError(f"{path}: jupytext cannot read it: {err}") from err
    if not any(cell.cell_type == "code" for cell in nb.cells):
        raise ChapterError(
            f"{path}: no code cells found; a chapter must run code "
            "(is each cell a ```{code-cell} block?)"
        )
    return nb


def _front_matter(path: Path) -> dict:
    """The YAML header of a Markdown file, as written (jupytext fills in defaults when reading)."""
    text = path.read_text()
    if not text.startswith("---\n"):
        return {}
    end = text.find("\n---\n", 4)
    if end < 0:
        raise ChapterError(f"{path}: its YAML header is not closed by a '---' line")
    try:
        header = yaml.safe_load(text[4:end])
    except yaml.YAMLError as err:
        raise ChapterError(f"{path}: its YAML header does not parse: {err}") from err
    return header if isinstance(header, dict) else {}


def is_tagged(cell, tag: str) -> bool:
    """Whether a notebook cell carries ``tag`` in its metadata tags."""
    return tag in cell.metadata.get("tags", [])
