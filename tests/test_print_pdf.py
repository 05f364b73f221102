"""`python -m tools.print_pdf` (make pdf): each bad argument is one line and exit 2, before Chromium
starts; a Chromium that does not start is one line and exit 1. Printing itself is tested with
Chromium in tests/browser/test_pdf.py."""

import pytest

import tools.print_pdf
from tools.print_pdf import main


@pytest.mark.parametrize("argv, message", [
    (["no/such/page.html", "out.pdf"], "page must be an existing .html file, got no/such/page.html"),
    (["README.md", "out.pdf"], "page must be an existing .html file, got README.md"),
    (["{page}", "book.txt"], "out must be a file name ending in .pdf, got book.txt"),
])
def test_bad_arguments_are_refused_in_one_line(argv, message, tmp_path, capsys):
    page = tmp_path / "page.html"
    page.write_text("<p>x</p>")
    assert main([a.format(page=page) for a in argv]) == 2
    assert capsys.readouterr().err.splitlines() == [f"print_pdf: {message}"]


def test_no_chromium_is_one_line_that_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    page = tmp_path / "page.html"
    page.write_text("<p>x</p>")
    monkeypatch.setattr(tools.print_pdf, "find_chromium", lambda: None)
    assert main([str(page), str(tmp_path / "out.pdf")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("print_pdf: Chromium is not installed: `sudo apt-get install chromium`")
    assert not (tmp_path / "out.pdf").exists()


def test_chromium_is_the_one_chromium_names(monkeypatch):
    monkeypatch.setenv("CHROMIUM", "/opt/my/chrome")
    assert tools.print_pdf.find_chromium() == "/opt/my/chrome"


def test_a_chromium_that_does_not_start_is_one_line_and_exit_1(tmp_path, capsys, monkeypatch):
    page = tmp_path / "page.html"
    page.write_text("<p>x</p>")
    monkeypatch.setenv("CHROMIUM", str(tmp_path / "no-such-chrome"))
    assert main([str(page), str(tmp_path / "out.pdf")]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("print_pdf: BrowserType.launch:") and "no-such-chrome" in line
    assert not (tmp_path / "out.pdf").exists()
