"""The core chapters show the paper (issue 43); the machinery lives in the chapters about it.

The core chapters are those of ``_toc.yml`` from the introduction to "What the translator attends to"
(``chapters/reading_attention.md``), in reading order. None of them may export into the package's
machinery: the files it writes and reads (``transformer/files.py``), its commands
(``transformer/cli/``), checkpoints (``transformer/training/checkpoint.py``) and data-parallel runs
(``transformer/training/distributed.py``). Where a cell goes is what the exporter says
(``tools.export.chapter_modules``): a module the chapter owns, a cell's ``# export: MODULE`` line, or,
for ``# export: methods of CLASS``, the module that defines the class.

``PENDING`` lists the core chapters that still export into such a module, each with the reason, so
that the list can only shrink: a new one fails, and so does an entry that no longer holds.
"""

import functools
import re
from pathlib import Path

from tools import export
from tools.chapters import reading_order

ROOT = Path(__file__).resolve().parent.parent
FIRST, LAST = "chapters/introduction.md", "chapters/reading_attention.md"
#: The package's machinery: modules no core chapter may export into.
MACHINERY = re.compile(r"^transformer/(?:files\.py|cli/\w+\.py|training/checkpoint\.py|training/distributed\.py)$")
#: (core chapter, module) pairs that remain, and why. A later change moves them and removes the entry.
PENDING: dict[tuple[str, str], str] = {}


def core_chapters(root: Path) -> list[str]:
    """The chapters of ``root/_toc.yml`` from the introduction to "What the translator attends to"."""
    order = reading_order(root)
    return order[order.index(FIRST):order.index(LAST) + 1]


@functools.cache
def machinery_exports(root: Path) -> frozenset[tuple[str, str]]:
    """Every (core chapter, machinery module) such that the chapter owns the module or sends a cell to it."""
    defined_in = {name: module.path for module in export.collect(root) for name in module.classes()}
    found = set()
    for chapter in core_chapters(root):
        owned, cells = export.chapter_modules(root / chapter, root)
        targets = [module.path for module in owned]
        targets += [target or defined_in.get(cell.owner_class or "", "") for target, cell in cells]
        found |= {(chapter, target) for target in targets if MACHINERY.match(target)}
    return frozenset(found)


def test_the_core_chapters_run_from_the_introduction_to_reading_attention():
    core = core_chapters(ROOT)
    assert core[0] == FIRST and core[-1] == LAST and len(core) > 15
    assert {"chapters/training_run.md", "chapters/translation.md"} <= set(core)
    assert "chapters/long_runs.md" not in core and "chapters/package_as_tool.md" not in core


def test_no_core_chapter_exports_into_the_machinery():
    found = machinery_exports(ROOT) - PENDING.keys()
    assert not found, "core chapters export machinery; move it to the chapter about it:\n" + "\n".join(
        f"{chapter} -> {module}" for chapter, module in sorted(found))


def test_every_pending_exception_still_holds():
    """An exception that no longer holds must leave PENDING, so that the list only shrinks."""
    stale = PENDING.keys() - machinery_exports(ROOT)
    assert not stale, f"remove from PENDING, they no longer export there: {sorted(stale)}"


def test_the_check_finds_owned_modules_cells_and_methods_in_core_chapters_only(tmp_path):
    from tests.test_exporter import chapter, code
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: chapters/introduction\nparts:\n  - chapters:\n"
                                       "      - file: chapters/reading_attention\n      - file: chapters/later\n")
    chapter(tmp_path, "introduction.md", code("# export: transformer/files.py\ndef save():\n    return 1", ["export"]),
            code("x = 1", ["export"]), module="transformer/nn/model.py")
    chapter(tmp_path, "reading_attention.md", code("class Run:\n    pass", ["export"]),
            code("# export: methods of Parser\ndef extra(self):\n    return 2", ["export"]),
            module="transformer/training/distributed.py")
    chapter(tmp_path, "later.md", code("class Parser:\n    pass", ["export"]),
            code("# export: transformer/training/checkpoint.py\ndef load():\n    return 3", ["export"]),
            module="transformer/cli/options.py", modules=("transformer/files.py", "transformer/training/checkpoint.py"))
    assert machinery_exports(tmp_path) == {
        ("chapters/introduction.md", "transformer/files.py"),  # a cell sent there
        ("chapters/reading_attention.md", "transformer/training/distributed.py"),  # a module it owns
        ("chapters/reading_attention.md", "transformer/cli/options.py"),  # methods of a class defined there
    }
