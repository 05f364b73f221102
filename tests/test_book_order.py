"""The book reads in its own order: no chapter uses a name of the package that a later chapter defines.

A reader meets every name of the package in the chapter that explains it, or after. The check walks
``_toc.yml`` in reading order and reads each chapter's code cells: every name imported from the
package (``from transformer.nn.multihead import MultiHeadAttention``, ``from transformer import
Transformer``), every module imported, and every ``transformer.NAME`` used as an attribute, is looked
up in what the exporter knows (the chapter whose cell defines the name, or owns the module). The
conventions appendix is the exception: any chapter may use its argument checks.
"""

import ast
from pathlib import Path

import pytest

from tools import export
from tools.chapters import ChapterError, chapter_paths, read_chapter, reading_order

ROOT = Path(__file__).resolve().parent.parent
#: Chapters whose names any chapter may use, wherever they stand in the book.
ANYWHERE = {"chapters/conventions.md"}


def definitions(modules: list[export.Module]) -> tuple[dict[str, str], dict[str, str]]:
    """{name: the chapter that defines it} and {dotted module: the chapter that owns it}."""
    names: dict[str, str] = {}
    for module in modules:
        for name, cell in module.definitions():
            names.setdefault(name, cell.chapter)
    owners = {module.dotted: module.chapter for module in modules}
    return names, owners


def uses(source: str) -> list[tuple[str, str]]:
    """("name", NAME) and ("module", DOTTED) for every use of the package in ``source``."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # an IPython magic: no Python to read
        return []
    found: list[tuple[str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "transformer":
            found += [("module", node.module)] + [("name", alias.name) for alias in node.names]
            found += [("module", f"{node.module}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [("module", alias.name) for alias in node.names if alias.name.startswith("transformer.")]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "transformer":
            found.append(("name", node.attr))
    return found


def forward_references(root: Path = ROOT) -> list[str]:
    """Every use of a package name before the chapter that defines it, as a sentence."""
    order = reading_order(root)
    position = {chapter: i for i, chapter in enumerate(order)}
    names, owners = definitions(export.collect(root))
    found = []
    for chapter in order:
        if chapter in ANYWHERE:
            continue
        for cell in read_chapter(root / chapter).cells:
            if cell.cell_type != "code":
                continue
            for kind, used in uses(cell.source):
                home = (names if kind == "name" else owners).get(used)
                if home is None or home in ANYWHERE or home not in position:
                    continue
                if position[home] > position[chapter]:
                    found.append(f"{chapter} uses {used}, which {home} defines later")
    return sorted(set(found))


def test_the_toc_lists_every_chapter():
    assert sorted(reading_order(ROOT)) == sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "chapters").glob("*.md"))


def test_chapters_are_read_in_the_order_of_the_toc_not_of_their_file_names():
    paths = chapter_paths(ROOT)
    assert [p.relative_to(ROOT).as_posix() for p in paths] == reading_order(ROOT)
    names = [p.stem for p in paths]  # the book's case: the command's chapter follows its owner's
    assert names.index("pretraining") < names.index("classify_command")


def test_a_chapter_missing_from_the_toc_or_a_toc_entry_without_a_file_is_an_error(tmp_path):
    from tests.test_exporter import chapter, code

    chapter(tmp_path, "b.md", code("x = 1"))
    chapter(tmp_path, "a.md", code("x = 2"))
    (tmp_path / "_toc.yml").write_text("root: chapters/b\nparts:\n  - chapters:\n      - file: chapters/a\n"
                                       "        sections:\n          - file: chapters/c\n      - file: glossary\n")
    assert reading_order(tmp_path) == ["chapters/b.md", "chapters/a.md", "chapters/c.md"]
    with pytest.raises(ChapterError, match=r"_toc.yml names chapters that do not exist: \['chapters/c.md'\]"):
        chapter_paths(tmp_path)
    (tmp_path / "_toc.yml").write_text("root: chapters/b\n")
    with pytest.raises(ChapterError, match=r"\['chapters/a.md'\] are not in _toc.yml"):
        chapter_paths(tmp_path)
    (tmp_path / "_toc.yml").unlink()  # a folder without a table: file-name order
    assert [p.name for p in chapter_paths(tmp_path)] == ["a.md", "b.md"]


def test_no_chapter_uses_a_name_that_a_later_chapter_defines():
    found = forward_references()
    assert not found, f"{len(found)} forward references:\n" + "\n".join(found)


# The check itself, on a made-up book: it can fail.
def test_a_forward_reference_is_found(tmp_path):
    from tests.test_exporter import chapter, code

    chapter(tmp_path, "01_a.md", code("from transformer.nn.later import Later\n\ndef early():\n    return Later", ["export"]),
            module="transformer/nn/early.py")
    chapter(tmp_path, "02_b.md", code("class Later:\n    pass", ["export"]), code("import transformer\ntransformer.early"),
            module="transformer/nn/later.py")
    (tmp_path / "_toc.yml").write_text("root: chapters/01_a\nparts:\n  - chapters:\n      - file: chapters/02_b\n")
    assert forward_references(tmp_path) == ["chapters/01_a.md uses Later, which chapters/02_b.md defines later",
                                            "chapters/01_a.md uses transformer.nn.later, which chapters/02_b.md "
                                            "defines later"]


@pytest.mark.parametrize("source, expected", [
    ("from transformer import Transformer", [("module", "transformer"), ("name", "Transformer"),
                                             ("module", "transformer.Transformer")]),
    ("import transformer.cli.train as command", [("module", "transformer.cli.train")]),
    ("%timeit x", []),
])
def test_uses_reads_imports_and_attributes(source, expected):
    assert uses(source) == expected
