"""The package's layout: modules of one idea that read in a sitting, imports that go one way.

These checks read the generated modules as text and syntax trees, the way a newcomer reads them:
no module (but ``__init__.py``) over 300 lines, no circle of imports between modules (imports
inside functions count: a circle there is still a circle in the design), and no private name
(``_x``) imported from another module of the package.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "transformer"
MODULES = sorted(p for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
MAX_LINES = 300


def package_imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) of every ``import transformer.X`` / ``from transformer.X import ...`` in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("transformer."):
            found.append((node.module.split(".")[1], [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(alias.name.split(".")[1], []) for alias in node.names if alias.name.startswith("transformer.")]
    return found


def import_graph(modules: list[Path]) -> dict[str, set[str]]:
    return {p.stem: {module for module, _ in package_imports(p) if module != p.stem} for p in modules}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph as a list of modules (first = last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_package_has_modules_to_check():
    assert len(MODULES) > 20 and (PACKAGE / "loop.py") in MODULES


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_module_is_longer_than_300_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.name} has {lines} lines: split it into modules of one idea each"


def test_no_import_circle_in_the_package():
    assert find_cycle(import_graph(MODULES)) is None, f"import circle: {' -> '.join(find_cycle(import_graph(MODULES)))}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_private_name_is_imported_from_another_module(path):
    private = [f"transformer.{module}.{name}" for module, names in package_imports(path)
               for name in names if name.startswith("_") and module != path.stem]
    assert not private, f"{path.name} imports private names of other modules: {private}"


def test_one_training_loop():
    calls = {p.name: p.read_text().count("backward(") for p in MODULES}
    assert sum(calls.values()) == 1 and calls["loop.py"] == 1, calls


# The checks themselves, on made-up inputs: they can fail.
def test_find_cycle_finds_a_circle_and_accepts_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_package_imports_sees_imports_inside_functions(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("from transformer.a import x, _y\n\ndef f():\n    from transformer.b import z\n    import transformer.c\n")
    assert package_imports(path) == [("a", ["x", "_y"]), ("b", ["z"]), ("c", [])]
