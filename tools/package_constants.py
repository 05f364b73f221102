"""Read a constant of the package from its source, without importing it (and so without torch).

Set-up's fetches (``tools/fetch_*.py``) check what they download against SHA-256s that the package
keeps beside the loaders that check them again (``transformer.interop.bert.MINILM_SHA256``, ...): one
source for each. Importing those modules imports torch, which is only there once pip has installed the
book's environment; read from the source, the fetches run while pip installs it (``make setup``).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def package_constant(module: str, name: str, root: Path = ROOT) -> str:
    """The string assigned to ``name`` at the top level of ``module`` (dotted, e.g.
    ``"transformer.interop.bert"``), read from its file under ``root``.

    >>> package_constant("transformer.tasks.entities", "WNUT16_FILE")
    'ner.txt'
    """
    path = Path(root, *module.split(".")).with_suffix(".py")
    for node in ast.parse(path.read_text(encoding="utf8"), filename=str(path)).body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value is not None:
                value = ast.literal_eval(node.value)
                if not isinstance(value, str):
                    raise TypeError(f"{module}.{name} must be a string literal, got {type(value).__name__}")
                return value
    raise KeyError(f"{path} assigns no string literal to {name} at its top level")
