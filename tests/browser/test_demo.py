"""The translator page of chapters/exporting.md in headless Chromium: five test sentences typed
into the page must come back as the package's own greedy translations, computed in the page by
onnxruntime-web on single-threaded WebAssembly, with the cross-attention heatmap drawn and no request
leaving the local server. Run by `make browser` against a built site; it also prints the page's
download size and the time of its first translation."""

import time

import pytest

from transformer.paths import book_root
from transformer.tasks.multi30k import load_multi30k
from transformer.tasks.translation import load_translator, translate

PAGE = "chapters/exporting.html"


@pytest.fixture(scope="module")
def expected():
    model, tokenizer = load_translator(book_root() / "models" / "multi30k" / "model.pt")
    german = load_multi30k("test")[0][:5]
    return german, translate(model, tokenizer, german)


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
