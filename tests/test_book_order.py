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
import yaml

from tools import export
from tools.chapters import read_chapter

ROOT = Path(__file__).resolve().parent.parent
#: Chapters whose names any chapter may use, wherever they stand in the book.
ANYWHERE = {"chapters/35_conventions.md"}


def reading_order(root: Path = ROOT) -> list[str]:
    """The chapters in the order of ``_toc.yml``, as ``chapters/NN_name.md``."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    files = [toc["root"]] + [entry["file"] for part in toc.get("parts", []) for entry in part["chapters"]]
    return [f"{name}.md" for name in files if name.startswith("chapters/")]


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
    assert sorted(reading_order()) == sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "chapters").glob("*.md"))


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
