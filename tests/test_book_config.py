"""tools/book_config.py: the build's configuration, with the repository buttons and Binder."""

import re
from pathlib import Path

import pytest
import yaml

from tools.book_config import book_config, github_url, main

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def config():
    return yaml.safe_load((ROOT / "_config.yml").read_text())


@pytest.mark.parametrize("remote", [
    "https://github.com/owner/the-book",
    "https://github.com/owner/the-book.git",
    "https://github.com/owner/the-book/",
    "git@github.com:owner/the-book.git",
    "ssh://git@github.com/owner/the-book.git",
])
def test_github_remotes_give_the_https_url(remote):
    assert github_url(remote + "\n") == "https://github.com/owner/the-book"


@pytest.mark.parametrize("remote", ["/srv/git/book.git", "https://gitlab.com/owner/book", "", "github.com/owner"])
def test_other_remotes_give_none(remote):
    assert github_url(remote) is None


def test_without_a_repository_the_local_configuration_is_unchanged(config):
    assert book_config(config) == config
    assert "repository_url" not in config["sphinx"]["config"]["html_theme_options"]


def test_execution_mode_is_set_and_checked(config):
    assert book_config(config, execution="cache")["execute"]["execute_notebooks"] == "cache"
    assert config["execute"]["execute_notebooks"] == "force"  # the input is not modified
    with pytest.raises(ValueError, match="execution must be one of"):
        book_config(config, execution="sometimes")


def test_a_repository_turns_on_its_buttons_and_binder_only(config):
    built = book_config(config, repository="git@github.com:owner/the-book.git", branch="main")
    theme = built["sphinx"]["config"]["html_theme_options"]
    assert theme["repository_url"] == "https://github.com/owner/the-book"
    assert theme["repository_branch"] == "main" and theme["path_to_docs"] == ""
    assert theme["use_repository_button"] and theme["use_edit_page_button"] and theme["use_issues_button"]
    # Binder opens the MyST .md chapters through jupytext; Colab cannot, so it has no button.
    assert theme["launch_buttons"] == {"binderhub_url": "https://mybinder.org", "notebook_interface": "jupyterlab"}
    assert theme["search_bar_text"] == config["sphinx"]["config"]["html_theme_options"]["search_bar_text"]
    assert built["repository"]["url"] == "https://github.com/owner/the-book"


def test_a_repository_that_is_not_on_github_is_refused(config):
    with pytest.raises(ValueError, match="repository must be a GitHub repository URL, got '/srv/book'"):
        book_config(config, repository="/srv/book")


def test_command_writes_a_configuration_jupyter_book_reads(tmp_path):
    out = tmp_path / "_config.yml"
    assert main(["--execution", "cache", "--repository", "https://github.com/owner/the-book", "--out", str(out)]) == 0
    written = yaml.safe_load(out.read_text())
    assert written["execute"]["execute_notebooks"] == "cache"
    assert written["sphinx"]["config"]["html_theme_options"]["use_edit_page_button"] is True
    assert main(["--repository", "/not/github", "--out", str(out)]) == 2


@pytest.mark.parametrize("out", ["_build/_config.yml", "elsewhere/deeper/_config.yml"])
def test_the_notebook_download_extension_is_found_from_the_written_configuration(tmp_path, out):
    # Jupyter Book resolves a local extension's folder against the folder of the configuration file.
    path = tmp_path / out
    assert main(["--out", str(path)]) == 0
    written = yaml.safe_load(path.read_text())["sphinx"]
    assert "ipynb_download" in written["config"]["extensions"]
    folder = (path.parent / written["local_extensions"]["ipynb_download"]).resolve()
    assert folder == ROOT / "tools" and (folder / "ipynb_download.py").is_file()


def test_the_notebook_download_extension_offers_the_executed_notebook(tmp_path):
    from types import SimpleNamespace

    from tools.ipynb_download import offer_notebook

    executed = tmp_path / "jupyter_execute" / "chapters" / "attention.ipynb"
    executed.parent.mkdir(parents=True)
    executed.write_text('{"cells": []}')
    app, context = SimpleNamespace(outdir=str(tmp_path / "html")), {}
    offer_notebook(app, "chapters/attention", "page.html", context, None)
    assert context["ipynb_source"] == "chapters/attention.ipynb"
    assert (tmp_path / "html" / "_sources" / "chapters" / "attention.ipynb").read_text() == '{"cells": []}'
    other: dict = {}
    offer_notebook(app, "glossary", "page.html", other, None)  # not a notebook: no entry
    assert other == {}


def test_the_notebook_offered_has_the_caches_outputs_when_the_build_read_them_from_the_cache(tmp_path):
    """MyST-NB writes jupyter_execute/ from the notebook as it read it; in cache mode the outputs it
    renders are in a merged copy, so the download had none (caught by the browser test on a cache build)."""
    from types import SimpleNamespace

    import nbformat
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    from tools.ipynb_download import offer_notebook

    read = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")])
    read.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    executed = nbformat.reads(nbformat.writes(read), as_version=4)
    executed.cells[0].execution_count = 1
    executed.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="42\n")]
    cache = get_cache(str(tmp_path / "cache"))
    cache.cache_notebook_bundle(CacheBundleIn(executed, str(tmp_path / "a.md")), check_validity=False)
    path = tmp_path / "jupyter_execute" / "chapters" / "a.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(read, path)  # as MyST-NB writes it in cache mode: no outputs
    config = SimpleNamespace(execution_mode="cache", execution_cache_path=str(tmp_path / "cache"))
    app, context = SimpleNamespace(outdir=str(tmp_path / "html"), env=SimpleNamespace(mystnb_config=config)), {}
    offer_notebook(app, "chapters/a", "page.html", context, None)
    offered = nbformat.read(tmp_path / "html" / "_sources" / "chapters" / "a.ipynb", as_version=4)
    assert offered.cells[0].execution_count == 1 and offered.cells[0].outputs[0]["text"] == "42\n"
    assert nbformat.read(path, as_version=4).cells[0].outputs == []  # MyST-NB's own file left alone


def test_binder_environment_installs_the_book_with_jupytext():
    # Binder's own requirements name nothing: postBuild installs the book's pins, with the build constraint
    requirements = (ROOT / "binder" / "requirements.txt").read_text().splitlines()
    assert all(not line.strip() or line.startswith("#") for line in requirements)
    assert "-r requirements-export.txt" in (ROOT / "requirements.txt").read_text().splitlines()
    assert any(line.startswith("jupytext==") for line in (ROOT / "requirements-export.txt").read_text().splitlines())
    post_build = ROOT / "binder" / "postBuild"
    assert post_build.stat().st_mode & 0o111  # executable, as Binder requires
    text = post_build.read_text()
    assert "pip install --no-deps -e ." in text and '"markdown": "Jupytext Notebook"' in text
    install = re.search(r"^PIP_CONSTRAINT=(\S+) python -m pip install \\\n\s+--extra-index-url (\S+) -r requirements.txt$", text, re.M)
    assert install, "Binder must install requirements.txt with the build constraint and the CPU wheels"
    assert install[1] == "tools/build-constraints.txt" and (ROOT / install[1]).is_file()
    assert install[2] == "https://download.pytorch.org/whl/cpu"
    assert "PIP_CONSTRAINT" in (ROOT / "Makefile").read_text() and "build-constraints.txt" in (ROOT / "Makefile").read_text()
    fetched = set(re.findall(r"-m (tools\.fetch_\w+)", (ROOT / "Makefile").read_text()))
    assert len(fetched) >= 3 and all(f"python -m {tool} " in text for tool in fetched), "Binder lacks a fetch of set-up"


def test_the_introductions_roadmap_names_every_chapter_of_the_table_of_contents():
    """A chapter added to _toc.yml must also be announced where the introduction lists the chapters."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    chapters = [entry["file"] for part in toc["parts"] for entry in part["chapters"]
                if entry["file"].startswith("chapters/") and entry["file"] != "chapters/introduction"]
    intro = (ROOT / "chapters" / "introduction.md").read_text()
    roadmap = intro.split("## Roadmap", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"\{doc\}`([a-z_]+)`", roadmap))
    missing = [c for c in chapters if c.removeprefix("chapters/") not in named]
    assert len(chapters) > 20 and not missing, f"the roadmap of chapters/introduction.md does not name {missing}"


def test_the_readmes_table_of_chapters_is_the_table_of_contents_in_its_order():
    """The README's table of what each chapter builds links every chapter of _toc.yml once, in reading
    order (it missed one, and had two in another order, before this test), and each module it names
    exists."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    chapters = [entry["file"] for part in toc["parts"] for entry in part["chapters"]
                if entry["file"].startswith("chapters/")]
    readme = (ROOT / "README.md").read_text()
    table = readme.split("| chapter | what it builds | module |", 1)[1].split("\n\n", 1)[0]
    linked = re.findall(r"^\| \[[^]]+\]\((chapters/[a-z_]+)\.md\) \|", table, flags=re.M)
    assert linked == chapters, f"README.md's table of chapters: {linked} is not _toc.yml's {chapters}"
    modules = set(re.findall(r"`(transformer(?:\.[a-z_]+)+)`", table))
    missing = [m for m in modules if not (ROOT / (m.replace(".", "/") + ".py")).is_file()
               and not (ROOT / m.replace(".", "/") / "__init__.py").is_file()]
    assert len(modules) > 30 and not missing, f"README.md's table names modules that do not exist: {missing}"


def _pins(path: Path) -> dict[str, str]:
    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    pins = {}
    for line in filter(None, lines):
        if line.startswith("-"):  # -r, --extra-index-url: not a package
            continue
        name, sep, version = line.partition("==")
        assert sep and version and not any(c in version for c in "<>=*,"), f"{path.name}: {line!r} is not an exact pin"
        pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def test_jupyterlab_is_pinned_apart_and_moves_none_of_the_books_pins():
    # `make lab` installs requirements-lab.txt into the book's environment: it may only add packages.
    lab = _pins(ROOT / "requirements-lab.txt")
    book = {**_pins(ROOT / "requirements.txt"), **_pins(ROOT / "requirements-export.txt")}
    assert {"jupyterlab", "nbconvert", "jupyter-server"} <= set(lab)
    assert not set(lab) & set(book), f"requirements-lab.txt repins {sorted(set(lab) & set(book))}"
    makefile = (ROOT / "Makefile").read_text()
    assert "pip install --quiet -r requirements-lab.txt" in makefile and "jupyter lab --notebook-dir" in makefile
    assert '"markdown": "Jupytext Notebook"' in makefile  # .md chapters open as notebooks, as on Binder


def test_the_chapters_are_numbered_and_the_introduction_and_the_back_matter_are_not():
    # Every part but the back matter is numbered; sphinx_multitoc_numbering carries the numbers
    # across the parts (1, 2, ... to the last chapter) instead of restarting them in each.
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    config = yaml.safe_load((ROOT / "_config.yml").read_text())["sphinx"]["config"]
    assert "sphinx_multitoc_numbering" in config["extensions"] and config["numfig_secnum_depth"] == 1
    for part in toc["parts"]:
        numbered = part["caption"] not in ("Introduction", "Back matter")
        assert part.get("numbered", False) is numbered, f"part {part['caption']!r}: numbered should be {numbered}"
    assert all(entry["file"].startswith("chapters/") for part in toc["parts"] if part.get("numbered")
               for entry in part["chapters"])


def test_the_prefaces_ways_through_the_book_name_the_parts_chapter_numbers():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    first, ranges = 1, {}
    for part in toc["parts"]:
        if part.get("numbered"):
            ranges[part["caption"]] = (first, first + len(part["chapters"]) - 1)
            first += len(part["chapters"])
    preface = (ROOT / "preface.md").read_text()
    start, _ = ranges["Inputs"]
    _, end = ranges["The paper's experiment"]
    assert f"(chapters {start} to {end})" in preface
    assert "**Cost and scale** (chapters {} to {})".format(*ranges["Cost and scale"]) in preface
    for caption in ("The encoder alone", "The decoder alone", "Images"):
        assert "**{}** (chapters {} to {})".format(caption, *ranges[caption]) in preface, caption
    assert "**Weights in and out** (chapters {} and {})".format(*ranges["Weights in and out"]) in preface
