"""The translator page of chapters/exporting.md in headless Chromium: five test sentences typed
into the page must come back as the package's own greedy translations, computed in the page by
onnxruntime-web on single-threaded WebAssembly, with the cross-attention heatmap drawn and no request
leaving the local server. The sentence already in the box is a Multi30k one the model translates
right; the page says what German the model knows, shows the download's progress, and, opened from
disk, says how to serve the book instead of failing silently. Run by `make browser` against a built
site; it also prints the page's download size and the time of its first translation."""

import re
import time
from pathlib import Path

import pytest

from transformer.paths import book_root
from transformer.tasks.multi30k import load_multi30k
from transformer.tasks.translation import load_translator, translate

PAGE = "chapters/exporting.html"
ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "_build" / "html"
# The files the page downloads on its first translation (tools/demo/translate.mjs's FILES).
MODEL_FILES = ["ort-wasm-simd-threaded.wasm", "encoder.onnx", "decoder_step.onnx", "tokenizer.json"]
# What the default sentence ("Ein hellbraun-weißer Hund springt mit einem gelben Ball im Maul hoch.",
# Multi30k's validation set) says, in the words of its reference translation ("A tan and white dog
# jumps up with a yellow ball in its mouth."): the colours, the dog, the separable verb, the mouth.
DEFAULT_CONTENT = ["tan and white dog", "jumps up", "yellow ball", "mouth"]
SERVE = "python3 -m http.server -d _build/html"  # the README's command that serves the built book


@pytest.fixture(scope="module")
def translator():
    return load_translator(book_root() / "models" / "multi30k" / "model.pt")


@pytest.fixture(scope="module")
def expected(translator):
    german = load_multi30k("test")[0][:5]
    return german, translate(*translator, german)


def test_the_page_translates_as_the_package_does(visit, expected):
    v = visit(PAGE)
    page = v.page
    sizes: list[int] = []
    page.on("response", lambda r: sizes.append(int(r.headers.get("content-length") or 0)))
    assert page.evaluate("() => window.crossOriginIsolated") is False  # as on GitHub Pages: no threads
    assert page.evaluate("() => typeof SharedArrayBuffer") == "undefined"
    assert not any(url.endswith(".onnx") for url in page.evaluate(
        "() => performance.getEntriesByType('resource').map(e => e.name)")), "the model loaded before it was asked"
    german, english = expected
    for i, (source, target) in enumerate(zip(german, english)):
        page.fill("#demo-source", source)
        start = time.perf_counter()
        page.click("#demo-translate")
        page.wait_for_selector("#demo-target[data-done]", timeout=120_000)
        if i == 0:
            first = time.perf_counter() - start
        assert page.inner_text("#demo-target") == target, source
        cells = page.locator("#demo-heatmap td.demo-weight")
        rows = page.locator("#demo-heatmap tr").count() - 1  # one a target piece, under a header row
        assert rows >= 1 and cells.count() == rows * (page.locator("#demo-heatmap tr").first.locator("td").count() - 1)
    assert v.errors == [], f"console errors: {v.errors}"
    assert v.outside == [], f"requests that left the local server: {v.outside}"
    print(f"\ntranslator page: {sum(sizes) / 1e6:.1f} MB downloaded for the model, "
          f"first translation in {first:.1f} s (model loading included)")


def test_the_default_sentence_is_translated_right_with_the_download_shown(visit, translator):
    v = visit(PAGE)
    page = v.page
    domain = page.locator("#demo-domain")
    assert domain.is_visible() and "Multi30k" in domain.inner_text() and "descriptions of pictures" in domain.inner_text()
    assert page.locator("#demo-offline").is_hidden()  # served over HTTP: no message about the disk
    assert page.locator("#demo-download").is_hidden()  # nothing downloaded yet
    source = page.input_value("#demo-source")
    assert source in load_multi30k("val")[0], source
    python = translate(*translator, [source])[0]
    assert all(words in python for words in DEFAULT_CONTENT), python
    page.evaluate("""() => {  // every text the progress line shows, in order
        window.progressTexts = [];
        const line = document.getElementById("demo-received");
        new MutationObserver(() => window.progressTexts.push(line.textContent))
            .observe(line, {childList: true, characterData: true, subtree: true});
    }""")
    page.click("#demo-translate")
    page.wait_for_selector("#demo-target[data-done]", timeout=120_000)
    assert page.inner_text("#demo-target") == python
    grid = page.evaluate("""() => Array.from(document.querySelectorAll("#demo-heatmap tr"),
        (tr) => Array.from(tr.cells, (cell) => cell.title || cell.textContent))""")
    german = grid[0][1:]  # the header row: the German pieces
    read = {row[0]: german[max(range(len(german)), key=lambda j: float(row[1 + j]))] for row in grid[1:]}
    assert (read["up"], read["mouth."]) == ("hoch.", "Maul"), read  # the chapter's words on the heatmap
    texts = page.evaluate("() => window.progressTexts")
    total_mb = sum((SITE / "_static" / "demo" / name).stat().st_size for name in MODEL_FILES) / 1e6
    shown = [re.fullmatch(r"model: ([\d.]+) of ([\d.]+) MB downloaded \((\d+) %\)", text) for text in texts]
    assert all(shown), texts
    received = [float(m[1]) for m in shown]
    assert {m[2] for m in shown} == {f"{total_mb:.1f}"}, texts  # the total of the files, from the start
    assert received == sorted(received) and len(set(received)) > 3, texts  # it moved, as the bytes came
    assert shown[-1][1] == f"{total_mb:.1f}" and shown[-1][3] == "100", texts
    assert page.evaluate("() => document.getElementById('demo-progress').value") == 1
    assert v.errors == [], f"console errors: {v.errors}"


def test_opened_from_disk_the_page_says_how_to_serve_the_book(browser):
    assert SERVE in (ROOT / "README.md").read_text(), "the page must give the README's command"
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto((SITE / PAGE).as_uri(), wait_until="load")
        message = page.locator("#demo-offline")
        assert message.is_visible(), "opened from disk, the page must say why it cannot translate"
        assert SERVE in message.inner_text() and "file://" in message.inner_text()
        assert page.locator("#demo-translate").is_disabled()
    finally:
        context.close()
