"""`make pdf`'s printer (tools/print_pdf.py) on a page of the built site: a PDF of the right kind, and
a page that asks the network for anything refused."""

import re
from pathlib import Path

import pytest

from tools.print_pdf import print_pdf

SITE = Path(__file__).resolve().parents[2] / "_build" / "html"


def pages_of(pdf: bytes) -> int:
    """The number of pages of a PDF: its objects of type /Page (not /Pages)."""
    return len(re.findall(rb"/Type\s*/Page(?![a-z])", pdf))


def test_a_page_of_the_book_prints_as_a_pdf_of_several_pages(browser, site_url, tmp_path):
    out = tmp_path / "glossary.pdf"
    size = print_pdf(SITE / "glossary.html", out, browser)
    pdf = out.read_bytes()
    assert pdf.startswith(b"%PDF-") and size == len(pdf)
    assert pages_of(pdf) >= 2  # the glossary's tables run over more than one A4 page
    assert not (tmp_path / "glossary.pdf.partial").exists()


def test_a_page_that_asks_the_network_is_refused_and_nothing_is_written(browser, site_url, tmp_path):
    page = tmp_path / "outside.html"
    page.write_text('<html><body><p>x</p><img src="http://example.invalid/a.png"></body></html>')
    with pytest.raises(RuntimeError, match=r"asked for 1 file\(s\) from the network, e.g. http://example.invalid/a.png"):
        print_pdf(page, tmp_path / "outside.pdf", browser)
    assert not (tmp_path / "outside.pdf").exists()

