"""tools/package_constants.py: set-up's fetches read the package's checksums from its source, so that
they run before torch is installed; what they read is what the package itself holds."""

import subprocess
import sys
from pathlib import Path

import pytest

from tools import fetch_minilm, fetch_reviews, fetch_smollm2, fetch_wnut16
from tools.package_constants import package_constant
from transformer.interop import bert, gguf
from transformer.tasks import entities, sentiment

ROOT = Path(__file__).resolve().parent.parent


def test_the_fetches_check_what_the_package_checks():
    assert fetch_minilm.MODEL_SHA256 == bert.MINILM_SHA256
    assert (fetch_smollm2.SMOLLM2_FILE, fetch_smollm2.SMOLLM2_SHA256) == (gguf.SMOLLM2_FILE, gguf.SMOLLM2_SHA256)
    assert (fetch_reviews.REVIEWS_FILE, fetch_reviews.REVIEWS_SHA256) == (
        sentiment.REVIEWS_FILE, sentiment.REVIEWS_SHA256)
    assert (fetch_wnut16.WNUT16_FILE, fetch_wnut16.WNUT16_SHA256) == (entities.WNUT16_FILE, entities.WNUT16_SHA256)


def test_the_fetches_hash_as_the_package_does(tmp_path):
    path = tmp_path / "blob"
    path.write_bytes(bytes(range(256)) * 9000)  # more than one of the loader's 1 MiB blocks
    assert fetch_minilm.sha256(path) == bert.file_sha256(path)


def test_the_fetches_import_neither_torch_nor_the_package():
    code = ("import sys; import tools.fetch_minilm, tools.fetch_smollm2, tools.fetch_reviews, tools.fetch_wnut16; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformer')))")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]"


def test_a_constant_is_read_only_from_a_top_level_string_literal(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(
        'A = "a"\nB: str = "b"\nC = 3\nD = "".join("d")\ndef f():\n    E = "e"\n')
    assert package_constant("pkg.mod", "A", tmp_path) == "a"
    assert package_constant("pkg.mod", "B", tmp_path) == "b"
    with pytest.raises(TypeError, match="pkg.mod.C must be a string literal, got int"):
        package_constant("pkg.mod", "C", tmp_path)
    with pytest.raises(ValueError):  # not a literal: never evaluated
        package_constant("pkg.mod", "D", tmp_path)
    with pytest.raises(KeyError, match="assigns no string literal to E"):
        package_constant("pkg.mod", "E", tmp_path)
