"""nbval (and the busy-machine check) run only the chapters of ``tools/nbval_chapters.py``: every
chapter that trains a model, or loads a trained or pretrained one, must be among them.

What "trains" means is read from the code, not from a list that could fall behind: a call that builds
a ``torch.optim`` optimiser, ``torch.load`` or ``from_pretrained`` (a seed), or a call of a function of
the package that makes such a call, directly or through other functions of the package (``fit``,
``train_language_model``, ``load_translator``, ...). A chapter whose code cells make any of these calls
trains.
"""

import ast
from pathlib import Path

from tools.chapters import chapter_paths, read_chapter
from tools.nbval_chapters import ARITHMETIC_CHAPTERS, arithmetic_chapters

ROOT = Path(__file__).resolve().parent.parent
SEED = "<trains or loads>"


def called(tree: ast.AST) -> set[str]:
    """The names of the functions called in ``tree`` (``f(...)`` and ``x.f(...)`` give ``f``), and
    ``SEED`` for a call that builds an optimiser or loads weights."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        dotted = ast.unparse(func)
        if dotted.startswith(("torch.optim.", "optim.")) and ".lr_scheduler." not in dotted:
            names.add(SEED)
        if dotted == "torch.load" or dotted.endswith("from_pretrained"):
            names.add(SEED)
        if isinstance(func, ast.Name):
            names.add(func.id)
        elif isinstance(func, ast.Attribute):
            names.add(func.attr)
    return names


def training_functions(package: Path = ROOT / "transformer") -> set[str]:
    """``SEED`` and the names of the package's functions that train or load, directly or through
    others of the package."""
    calls: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                calls.setdefault(node.name, set()).update(called(node))
    found = {SEED}
    grew = True
    while grew:
        grew = False
        for name, callees in calls.items():
            if name not in found and callees & found:
                found.add(name)
                grew = True
    return found


def training_chapters(root: Path = ROOT) -> dict[str, set[str]]:
    """{chapter name: the training or loading calls in its code cells} for every chapter with one."""
    trains = training_functions(root / "transformer")
    found: dict[str, set[str]] = {}
    for path in chapter_paths(root):
        calls: set[str] = set()
        for cell in read_chapter(path).cells:
            if cell.cell_type != "code":
                continue
            try:
                calls |= called(ast.parse(cell.source)) & trains
            except SyntaxError:  # an IPython magic: no Python to read
                continue
        if calls:
            found[path.stem] = calls
    return found


def test_the_detector_knows_the_book_training_functions():
    trains = training_functions()
    assert {"fit", "fit_translation", "train_language_model", "train_classifier", "load_translator",
            "read_checkpoint", "run_training"} <= trains
    assert not {"forward", "greedy_decode", "beam_search", "make_batch"} & trains  # what only computes


def test_every_chapter_that_trains_or_loads_a_model_runs_under_nbval():
    chapters = training_chapters()
    assert len(chapters) >= 15  # the detector still sees the book's training chapters
    missing = {name: sorted(calls) for name, calls in chapters.items() if name not in ARITHMETIC_CHAPTERS}
    assert not missing, (f"these chapters train or load a model (the calls found) but are not in "
                         f"tools/nbval_chapters.py's ARITHMETIC_CHAPTERS: {missing}")


def test_the_nbval_chapters_exist_in_reading_order():
    paths = arithmetic_chapters()
    assert all(path.exists() for path in paths), [str(path) for path in paths if not path.exists()]
    assert list(ARITHMETIC_CHAPTERS) == sorted(ARITHMETIC_CHAPTERS) and len(set(ARITHMETIC_CHAPTERS)) == len(paths)
