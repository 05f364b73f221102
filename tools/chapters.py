"""Find and read the book's chapters.

A chapter is a MyST Markdown notebook, ``chapters/NN_name.md``, in jupytext's
``myst`` format. Everything that reads chapters (the exporter, the notebook
writer behind nbval) goes through :func:`read_chapter`, so a chapter whose
header jupytext misreads fails loudly instead of silently testing nothing.
"""

from __future__ import annotations

from pathlib import Path

import jupytext
import yaml

__all__ = ["ChapterError", "chapter_paths", "read_chapter", "is_tagged"]

#: Chapters are numbered: ``chapters/01_introduction.md``, ``chapters/02_embeddings.md``, ...
CHAPTER_GLOB = "[0-9][0-9]_*.md"


class ChapterError(Exception):
    """A chapter cannot be read, exported or run; the message names the chapter."""


def chapter_paths(root: Path) -> list[Path]:
    """Every chapter under ``root/chapters``, in reading order (by number)."""
    return sorted((Path(root) / "chapters").glob(CHAPTER_GLOB))


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
        nb = jupytext.read(path, fmt="md:myst")
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
