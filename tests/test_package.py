"""The installed package: importable from anywhere, public names at the top, in step with the chapters."""

import importlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli, which mypy (in requirements.txt) installs there
    import tomli as tomllib

import pytest

import transformer
from tools import export

ROOT = Path(__file__).resolve().parent.parent


def test_package_is_up_to_date_with_the_chapters():
    diffs = export.stale(ROOT)
    assert not diffs, "the package is out of date with the chapters; run `make export`\n" + "\n".join(diffs)


@pytest.mark.slow  # a process
def test_import_works_from_any_folder(tmp_path):
    # A fresh interpreter in an unrelated folder sees the installed (editable) package,
    # as a regular package, not as an empty namespace.
    result = subprocess.run(
        [sys.executable, "-c", "import transformer; print(transformer.__file__); print(len(transformer.__all__))"],
        cwd=tmp_path, capture_output=True, text=True, check=True,
    )
    location, count = result.stdout.split()
    assert Path(location) == ROOT / "transformer" / "__init__.py"
    assert int(count) == len(transformer.__all__) > 0


def test_each_subpackage_reexports_the_public_names_of_its_modules():
    modules = export.collect(ROOT)  # reads every chapter: once
    for module in modules:
        if not module.reexported:
            continue
        package = importlib.import_module(f"transformer.{module.subpackage}")
        imported = importlib.import_module(module.dotted)
        for name in imported.__all__:
            assert getattr(package, name) is getattr(imported, name), (module.dotted, name)
    for name in export.SUBPACKAGES:
        package = importlib.import_module(f"transformer.{name}")
        expected = [n for m in modules if m.subpackage == name and m.reexported for n in m.public_names()]
        assert package.__all__ == expected, name


def test_the_top_level_is_the_curated_public_face():
    # At most 40 names: what a package user reaches for; everything else imports from its subpackage.
    listed = {name: module.dotted for module in export.collect(ROOT) for name in module.top_level}
    assert sorted(transformer.__all__) == sorted(listed) and 20 <= len(transformer.__all__) <= 40
    for name, dotted in listed.items():
        assert getattr(transformer, name) is getattr(importlib.import_module(dotted), name)
    # the book's helpers are not part of it
    for helper in ("PIXELS", "LAYOUTS", "caption", "loglog_plot", "book_root", "check_positive_int"):
        assert not hasattr(transformer, helper), helper


def test_commands_are_not_imported_by_the_package():
    # `python -m transformer.train` warns (runpy) if importing the package already imported it.
    commands = [m.dotted for m in export.collect(ROOT) if not m.reexport]
    inits = "".join(path.read_text() for path in (ROOT / "transformer").rglob("__init__.py"))
    assert "transformer.cli.train" in commands and "transformer.translate" in commands
    for name in commands:
        assert f"{name} " not in inits


def test_every_module_names_the_chapter_it_comes_from():
    paths = sorted((ROOT / "transformer").rglob("*.py"))
    assert (ROOT / "transformer" / "nn" / "multihead.py") in paths
    for path in paths:
        first_line = path.read_text().splitlines()[0]
        assert first_line.startswith(export.MARKER), path
        if path.name != "__init__.py":
            chapter = first_line[len(export.MARKER):].split(".md")[0] + ".md"
            assert (ROOT / chapter).is_file(), (path, chapter)


def test_package_carries_a_py_typed_marker():
    # PEP 561: without the (empty) marker, a user's type checker ignores the package's annotations.
    assert Path(transformer.__file__).with_name("py.typed").is_file()


def test_pyproject_declares_the_marker_as_package_data():
    # setuptools ships a py.typed by itself only from version 69; the build accepts setuptools>=64.
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["transformer"]


@pytest.mark.slow  # builds a wheel
def test_a_built_wheel_ships_the_py_typed_marker(tmp_path):
    # What `pip install` puts in site-packages: the package data of pyproject.toml, not the checkout.
    # Built from a copy, so that setuptools writes no build/ or *.egg-info here.
    source = tmp_path / "source"
    shutil.copytree(ROOT / "transformer", source / "transformer", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True, text=True, check=True,
    )
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert "transformer/py.typed" in archive.namelist()
