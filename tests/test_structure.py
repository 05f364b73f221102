"""The package's layout: modules of one idea that read in a sitting, imports that go one way.

These checks read the generated modules as text and syntax trees, the way a newcomer reads them:
no circle of imports between modules (imports
inside functions count: a circle there is still a circle in the design), no private name (``_x``)
imported from another module of the package, and imports that run one way: a module of a subpackage
imports from its own subpackage, from the subpackages below it (``tools/export.py``: SUBPACKAGES,
from the bottom up) and from the modules at the top of the package, never from a subpackage above
it; and no module of the package imports a top-level module that runs a command. A module's length
is advice, not a check: ``make lint`` lists the modules over 300 lines (``tools/sizes.py``).
"""

import ast
from pathlib import Path

import pytest

from tools.export import SUBPACKAGES

PACKAGE = Path(__file__).resolve().parent.parent / "transformer"
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")
LAYERS = list(SUBPACKAGES)  # from the bottom up


def dotted(path: Path) -> str:
    """``transformer.nn.multihead`` for ``transformer/nn/multihead.py``."""
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)


def package_imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) of every ``import transformer.X`` / ``from transformer.X import ...`` in ``path``,
    the module as its dotted name under the package (``nn.multihead``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("transformer."):
            found.append((node.module.split(".", 1)[1], [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(alias.name.split(".", 1)[1], []) for alias in node.names if alias.name.startswith("transformer.")]
    return found


def import_graph(modules: list[Path]) -> dict[str, set[str]]:
    graph = {}
    for p in modules:
        name = dotted(p).split(".", 1)[1]
        graph[name] = {module for module, _ in package_imports(p) if module != name}
    return graph


def layer(module: str) -> int | None:
    """The layer of a module (``nn.multihead``: 0), or None for a module at the top of the package."""
    return LAYERS.index(module.split(".")[0]) if "." in module else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a subpackage above its own, as "a -> b"."""
    return [f"{a} -> {b}" for a, imported in sorted(graph.items()) for b in sorted(imported)
            if layer(a) is not None and layer(b) is not None and layer(b) > layer(a)]


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
    assert len(MODULES) > 20 and (PACKAGE / "training" / "loop.py") in MODULES
    assert {p.parent.name for p in MODULES} == {"transformer", *LAYERS}


def test_imports_run_one_way():
    assert upward_imports(import_graph(MODULES)) == []


def test_the_modules_at_the_top_import_no_subpackage_but_to_run_a_command():
    # checks.py, paths.py, files.py and interrupts.py sit below everything; train.py and translate.py only
    # run cli's commands, through interrupts.run_command (which imports the command with Ctrl-C held)
    graph = import_graph(MODULES)
    for name in ("checks", "paths", "files", "interrupts"):
        assert graph[name] == set(), graph[name]
    for name in ("train", "translate"):
        assert graph[name] == {"interrupts"}, graph[name]
        text = (PACKAGE / f"{name}.py").read_text()
        assert "run_command(" in text and f'"transformer.cli.{name}"' in text, text
    importers = [a for a, imported in graph.items() if imported & {"train", "translate", "__main__"}]
    assert importers == []


def test_no_import_circle_in_the_package():
    assert find_cycle(import_graph(MODULES)) is None, f"import circle: {' -> '.join(find_cycle(import_graph(MODULES)))}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_private_name_is_imported_from_another_module(path):
    here = dotted(path).split(".", 1)[1]
    private = [f"transformer.{module}.{name}" for module, names in package_imports(path)
               for name in names if name.startswith("_") and module != here]
    assert not private, f"{path.name} imports private names of other modules: {private}"


def backward_calls(source: str) -> int:
    """The calls of a ``backward`` in Python ``source`` (``loss.backward()``, ``torch.autograd.backward(...)``),
    read from its syntax tree: not the word in a comment or a docstring."""
    return sum(isinstance(node, ast.Call) and (
        (isinstance(node.func, ast.Attribute) and node.func.attr == "backward")
        or (isinstance(node.func, ast.Name) and node.func.id == "backward"))
        for node in ast.walk(ast.parse(source)))


def test_one_training_loop():
    calls = {dotted(p): backward_calls(p.read_text()) for p in MODULES}
    assert sum(calls.values()) == 1 and calls["transformer.training.loop"] == 1, calls


# The checks themselves, on made-up inputs: they can fail.
def test_find_cycle_finds_a_circle_and_accepts_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_package_imports_sees_imports_inside_functions(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("from transformer.a import x, _y\n\ndef f():\n    from transformer.b.c import z\n"
                    "    import transformer.c\n")
    assert package_imports(path) == [("a", ["x", "_y"]), ("b.c", ["z"]), ("c", [])]


def test_backward_calls_are_counted_in_code_not_in_words():
    source = ('"""A docstring that says loss.backward()."""\nfrom torch.autograd import backward\n'
              "# loss.backward() in a comment\nloss.backward()\ntorch.autograd.backward(loss)\nbackward(loss)\n"
              "text = 'x.backward()'\n")
    assert backward_calls(source) == 3


def test_upward_imports_are_found():
    graph = {"nn.model": {"generation.decoding", "nn.attention", "checks"}, "tasks.numbers": {"nn.attention"},
             "checks": set()}
    assert upward_imports(graph) == ["nn.model -> generation.decoding"]
