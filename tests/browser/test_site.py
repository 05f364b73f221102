"""The built book in a real browser: headless Chromium reads `_build/html` from a local HTTP server.

Run by `make browser` after `make html` (both part of `make test`). It needs Debian's `chromium`
package (or a Chromium-based browser named by the CHROMIUM environment variable) and fails, with a
message saying how to install it, when there is none.

For every page in the table of contents it checks that the equations were typeset by MathJax with no
error, that every figure loaded, that the console shows no error, and that no request left the local
server, and that every display equation fits the text column at 1280 px or shows that it scrolls
(a shadow at the side that has more, and a visible scrollbar: _static/book.css), and fits a phone's
390 px, broken across lines by MathJax where it is too long for one. It also checks that
every chapter ends with exercises whose solutions stay hidden until clicked, the
sidebar and the search page, and saves screenshots of two chapters under `_build/screenshots/`.
No page shows a cell output longer than 60 lines, or a MyST role left as raw text (`{doc}` in a code
cell's comment or string is printed as written, not as a link), or more than two blocks of code
that scroll sideways at 1280 px. Every page has the book's icon and a footer that says something.
"""

import json
import re
from pathlib import Path
from urllib.parse import urljoin, urlparse

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "_build" / "html"
SCREENSHOTS = ROOT / "_build" / "screenshots"
SCREENSHOT_PAGES = {"chapters/positional_encoding", "chapters/attention"}


def toc_pages() -> list[str]:
    """Every document of `_toc.yml`, in reading order, without the `.md` suffix."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    pages = [toc["root"]]
    for part in toc.get("parts", []):
        pages += [entry["file"] for entry in part.get("chapters", [])]
    pages += [entry["file"] for entry in toc.get("chapters", [])]
    return pages


PAGES = toc_pages()


@pytest.mark.parametrize("doc", PAGES)
def test_page_renders_with_local_assets_only(doc, visit):
    v = visit(f"{doc}.html")
    page = v.page
    math_nodes = page.locator(".math").count()
    if math_nodes:
        page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise",
                               timeout=30_000)
        page.evaluate("() => MathJax.startup.promise")
        bad = page.evaluate(MATH_ERRORS)
        assert bad == [], f"equations MathJax could not typeset, or typeset as an error: {bad}"
        cut = equations_cut_without_a_cue(page)
        assert cut == [], f"display equations wider than the text column with nothing showing they scroll: {cut}"
    text = page.inner_text("article")
    assert "$$" not in text and "\\begin{" not in text, "raw TeX left on the page"
    # An object repr with a memory address changes on every build: the page would not be reproducible.
    assert " at 0x" not in text, "an output shows a memory address, e.g. <torch._C.Generator at 0x...>"
    broken = page.evaluate(
        "() => [...document.images].filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src)"
    )
    assert broken == [], f"figures that did not load: {broken}"
    # Figures have twice the pixels they are shown with (the book's kernel draws them with
    # InlineBackend.figure_formats=retina: tools/jupyter/kernels/python3), sharp on high-density screens.
    soft = page.evaluate(
        "() => [...document.querySelectorAll('.cell_output img')].filter(i => i.getBoundingClientRect().width > 0"
        " && i.naturalWidth < 1.5 * i.getBoundingClientRect().width).map(i => i.src)"
    )
    assert soft == [], f"figures with fewer pixels than a high-density screen shows them with: {soft}"
    assert v.errors == [], f"console errors: {v.errors}"
    assert v.outside == [], f"requests that left the local server: {v.outside}"
    long = [(lines, start) for lines, start in page.evaluate(OUTPUT_LINES) if lines > MAX_OUTPUT_LINES]
    assert long == [], f"cell outputs longer than {MAX_OUTPUT_LINES} lines (lines, first line): {long}"
    sideways = page.evaluate(SIDEWAYS_CODE)
    assert len(sideways) <= MAX_SIDEWAYS_CODE, f"{len(sideways)} code blocks scroll sideways at 1280 px: {sideways}"
    raw = sorted(set(RAW_ROLE.findall(page.text_content("article") or "")))
    assert raw == [], f"MyST roles shown as raw text (in a code cell's comment or string?): {raw}"
    if doc in SCREENSHOT_PAGES:  # scrolled to the first displayed equation, to show it typeset
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.locator("div.math").first.scroll_into_view_if_needed()
        page.screenshot(path=str(SCREENSHOTS / f"{Path(doc).name}.png"))
    # On a phone (390 px) the page does not slide sideways: code blocks, tables and equations wider
    # than the screen scroll in their own boxes, and inline code breaks (tools/site.css).
    page.set_viewport_size({"width": 390, "height": 844})
    width = page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= 391, f"at 390 px the page is {width} px wide: it slides sideways"
    if math_nodes:  # and every display equation fits the phone's column, broken across lines if need be
        assert equations_wider_than_their_box(visit(f"{doc}.html", width=PHONE)) == []


#: A phone's width in CSS pixels (an iPhone 12 to 15).
PHONE = 390


def equations_wider_than_their_box(v) -> list[dict]:
    """The display equations of the page of ``v`` (opened at its width) that are wider than their
    box: at a phone's width, each must fit or be broken across lines by MathJax (displayOverflow:
    linebreak, _config.yml), with its number above it (tools/site.css), not scroll."""
    page = v.page
    page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=30_000)
    page.evaluate("() => MathJax.startup.promise")
    return [eq for eq in page.evaluate(DISPLAY_EQUATIONS) if eq["hidden"] > 1 or eq["beyond"] > 1]


# Every equation of the page as MathJax parsed it (its internal MathML): those that hold an error
# (an `merror`; or an unknown macro, which the noundefined extension of tex-mml-chtml.js draws as its
# name in red instead, no `mjx-merror` on the page), and every math element of the page with no
# typeset equation in it (TeX that MathJax never found, e.g. after an unbalanced brace), each with
# its TeX. The book's own TeX uses no colour, so red is an error.
MATH_ERRORS = """() => {
  const bad = [];
  for (const item of MathJax.startup.document.math) {
    const mml = MathJax.startup.toMML(item.root);
    if (mml.includes("<merror") || mml.includes('mathcolor="red"')) bad.push("error: " + item.math.slice(0, 80));
  }
  for (const el of document.querySelectorAll(".math")) {
    if (!el.querySelector("mjx-container")) bad.push("not typeset: " + el.textContent.slice(0, 80));
  }
  return bad;
}"""


# A cell output longer than this buries the page (the detection chapter once printed a training
# history of 4,002 lines); print a summary instead.
MAX_OUTPUT_LINES = 60
# Each output of each code cell, hidden ones included: its number of lines (of text, or rows of a
# table) and its first line.
OUTPUT_LINES = """() => [...document.querySelectorAll("div.cell_output > *")].map(out => {
  const rows = out.querySelectorAll("tr").length;
  const text = out.textContent.replace(/\\n+$/, "");
  return [Math.max(rows, text ? text.split("\\n").length : 0), text.split("\\n")[0].slice(0, 80)];
})"""
# At 1280 px the code column shows 88 characters (tools/site.css; tools/format_chapters.py keeps the
# chapters' code to that width, long strings cut into adjacent pieces). Counted over every page of
# a build on 2026-11-30: no shown block scrolls sideways. A page may have "a few" (the issue's
# words): two, for a hash or a URL that cannot be cut; a third fails.
MAX_SIDEWAYS_CODE = 2
# Each shown block of code (a cell's input, or code in the text; not a cell's output, nor code in a
# closed toggle) that is wider than its box, so that the reader must scroll it sideways: its first line.
SIDEWAYS_CODE = """() => [...document.querySelectorAll("div.highlight pre")]
  .filter(pre => !pre.closest("div.cell_output, details:not([open])") && pre.scrollWidth > pre.clientWidth + 1)
  .map(pre => pre.textContent.split("\\n")[0].slice(0, 80))"""
# A MyST role as text, e.g. {doc}`training` or {glue:text}`name`: the page shows the markup itself.
# The roles by name, so that an f-string's `{name}` between backticks is not one.
RAW_ROLE = re.compile(r"\{(?:doc|ref|numref|eq|term|download|math|abbr|any|cite(?::[a-z]+)?|glue(?::[a-z]+)?"
                      r"|py:[a-z]+|func|class|meth|mod|attr)\}`[^`\n]+`")


# Every display equation (MathJax's CHTML output in a `div.math`): how far its box reaches past the
# text column, how much of it is hidden to the right, whether it scrolls, the height of its horizontal
# scrollbar, and whether its background carries the shadows that show there is more (gradients, some
# attached to the content, some to the box).
DISPLAY_EQUATIONS = """() => {
  const column = document.querySelector("article.bd-article, article").getBoundingClientRect();
  return [...document.querySelectorAll('div.math mjx-container[display="true"]')].map(m => {
    const box = m.getBoundingClientRect(), style = getComputedStyle(m);
    return {equation: m.closest("div.math").id || m.textContent.slice(0, 60), beyond: box.right - column.right,
            hidden: m.scrollWidth - m.clientWidth, overflow: style.overflowX, scrollbar: m.offsetHeight - m.clientHeight,
            shadow: style.backgroundImage.includes("gradient") && style.backgroundAttachment.includes("local")
                    && style.backgroundAttachment.includes("scroll")};
  });
}"""


def equations_cut_without_a_cue(page) -> list[dict]:
    """The typeset display equations of ``page`` that reach past the text column, or are wider than
    their box without scrolling, a shadow and a scrollbar at least 4 px high."""
    cut = []
    for eq in page.evaluate(DISPLAY_EQUATIONS):
        scrolls = eq["overflow"] in ("auto", "scroll") and eq["shadow"] and eq["scrollbar"] >= 4
        if eq["beyond"] > 1 or (eq["hidden"] > 1 and not scrolls):
            cut.append(eq)
    return cut


#: In JavaScript, the TeX of a sum of 40 terms, which MathJax can break across lines, and of a row
#: vector of 40 entries, which it cannot (a matrix's row stays one line).
WIDE_SUM = 'Array.from({length: 40}, (_, i) => `x_{${i}}`).join(" + ")'
WIDE_ROW = '"\\\\begin{bmatrix}" + Array.from({length: 40}, (_, i) => `x_{${i}}`).join(" & ") + "\\\\end{bmatrix}"'


def _add_equation(page, eq_id: str, tex_js: str) -> None:
    page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=30_000)
    page.evaluate("""async ([id, tex]) => {
      await MathJax.startup.promise;
      const wide = document.createElement("div");
      wide.className = "math notranslate nohighlight";
      wide.id = id;
      wide.textContent = "\\\\[" + tex + "\\\\]";
      document.querySelector("div.math").after(wide);
      await MathJax.typesetPromise([wide]);
    }""", [eq_id, page.evaluate(f"() => {tex_js}")])


def test_an_equation_wider_than_the_column_scrolls_with_a_cue(visit):
    """The check above is not vacuous: an equation made too wide for the column, one that MathJax
    cannot break (a long row vector), is found wider than its box, and scrolls with its cue; without
    the book's styles it would be reported."""
    page = visit("chapters/multihead_attention.html").page
    _add_equation(page, "made-wide", WIDE_ROW)
    made = [eq for eq in page.evaluate(DISPLAY_EQUATIONS) if eq["equation"] == "made-wide"]
    assert len(made) == 1 and made[0]["hidden"] > 500, made  # far wider than the column
    assert made[0]["beyond"] <= 1 and made[0]["scrollbar"] >= 4 and made[0]["shadow"], made
    assert equations_cut_without_a_cue(page) == []
    page.add_style_tag(content='div.math mjx-container[display="true"] { background: none !important; }')
    assert "made-wide" in [eq["equation"] for eq in equations_cut_without_a_cue(page)]


def test_a_long_equation_is_broken_across_lines_on_a_phone(visit):
    """The phone check is not vacuous: the 40-term sum, far wider than a phone, is broken across
    lines there and fits; a row vector of 40 entries, which cannot be broken, is reported."""
    v = visit("chapters/multihead_attention.html", width=PHONE)
    _add_equation(v.page, "made-long", WIDE_SUM)
    _add_equation(v.page, "held-long", WIDE_ROW)
    wide = {eq["equation"] for eq in equations_wider_than_their_box(v)}
    assert wide == {"held-long"}, wide
    lines = v.page.evaluate("() => document.querySelectorAll('#made-long mjx-linebox').length")
    assert lines >= 4, f"the sum was broken into {lines} lines"


def test_equations_with_errors_are_found(visit):
    """The check above is not vacuous: three broken equations added to a page that has none, each a
    mistake that leaves no `mjx-merror` (an unknown macro, an unbalanced brace) or one that does (a
    fraction missing its denominator), are each found, by their TeX."""
    page = visit("chapters/attention.html").page
    page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=30_000)
    page.evaluate("() => MathJax.startup.promise")
    assert page.evaluate(MATH_ERRORS) == []
    page.evaluate("""async () => {
      const added = ["\\\\(\\\\softmaxx(x)\\\\)", "\\\\(x^{2\\\\)", "\\\\(\\\\frac{a}\\\\)"].map(tex => {
        const math = document.createElement("span");
        math.className = "math notranslate nohighlight";
        math.textContent = tex;
        document.querySelector("article p").append(math);
        return math;
      });
      await MathJax.typesetPromise(added);
    }""")
    assert sorted(page.evaluate(MATH_ERRORS)) == sorted(
        ["error: \\softmaxx(x)", "not typeset: \\(x^{2\\)", "error: \\frac{a}"]
    )


def test_long_outputs_and_raw_roles_are_found(visit):
    """The checks above are not vacuous: an output of 61 lines and a raw role, added to a page, are
    found by them."""
    page = visit("chapters/attention.html").page
    assert page.evaluate(OUTPUT_LINES), "the page has no cell outputs to measure"
    page.evaluate("""() => {
      const cell = document.querySelector("div.cell_output").closest("div.cell");
      const out = document.createElement("div");
      out.className = "cell_output docutils container";
      out.innerHTML = "<div class='output stream highlight-myst-ansi notranslate'><pre></pre></div>";
      out.querySelector("pre").textContent = Array.from({length: 61}, (_, i) => `step ${i}`).join("\\n");
      cell.appendChild(out);
      const code = document.querySelector("div.cell_input pre");
      code.append(document.createTextNode("# see {doc}`training`"));
    }""")
    assert max(lines for lines, _ in page.evaluate(OUTPUT_LINES)) == 61
    assert RAW_ROLE.findall(page.text_content("article")) == ["{doc}`training`"]



def test_code_that_scrolls_sideways_is_found(visit):
    """The check above is not vacuous: a line of 160 characters added to a block of code that fitted
    makes it scroll sideways, and it is found beside what the page had."""
    page = visit("chapters/attention.html").page
    before = page.evaluate(SIDEWAYS_CODE)
    page.evaluate("""() => {
      const code = [...document.querySelectorAll("div.cell_input div.highlight pre")]
        .find(pre => !pre.closest("details:not([open])") && pre.scrollWidth <= pre.clientWidth);
      code.prepend(document.createTextNode("made_wide = " + "x + ".repeat(36) + "x\\n"));
    }""")
    after = page.evaluate(SIDEWAYS_CODE)
    assert len(after) == len(before) + 1 and any(line.startswith("made_wide = x + x") for line in after), after


def test_chapter_pages_have_equations_and_figures(visit):
    """The check above is not vacuous: the chapters do carry math and images."""
    v = visit("chapters/positional_encoding.html")
    assert v.page.locator(".math").count() > 10
    assert v.page.locator("figure img").count() >= 2


CHAPTERS = [doc for doc in PAGES if doc.startswith("chapters/")]
SOLUTION_LABEL = "Solution"


@pytest.mark.parametrize("doc", CHAPTERS)
def test_chapter_ends_with_exercises_whose_solutions_are_hidden(doc, visit):
    page = visit(f"{doc}.html").page
    exercises = page.locator("section#exercises")
    assert exercises.count() == 1, "the chapter has no Exercises section"
    prose = exercises.locator(".dropdown.admonition")  # solutions in words
    code = exercises.locator("details")  # executed solutions, behind a toggle
    assert prose.count() + code.count() >= 2, "fewer than two solutions"
    for i in range(code.count()):
        assert code.nth(i).get_attribute("open") is None, "a code solution is shown without a click"
    # One label for both kinds: the dropdowns' title, with no hint beside it, and the cells' prompt
    # (tools/format_chapters.py --label-solutions; _config.yml's togglebutton_hint).
    labels = prose.evaluate_all(
        "els => els.map(e => e.querySelector('.admonition-title').textContent.trim()"
        " + (e.querySelector('.toggle-button')?.dataset.toggleHint || ''))")
    labels += code.evaluate_all("els => els.map(e => e.querySelector('summary .collapsed').textContent.trim())")
    assert set(labels) == {SOLUTION_LABEL}, f"solutions labelled {sorted(set(labels))}, not all {SOLUTION_LABEL!r}"
    for i in range(prose.count()):
        solution = prose.nth(i)
        body = solution.locator(":scope > :not(.admonition-title)").first
        assert not body.is_visible(), "a solution is shown without a click"
        solution.locator(".admonition-title").click()
        body.wait_for(state="visible", timeout=5_000)  # and one click shows it


def test_pages_have_the_books_icon_and_a_footer_that_says_something(visit):
    v = visit("chapters/attention.html")
    icon = v.page.evaluate("() => document.querySelector('link[rel~=icon]')?.href")
    assert icon and icon.endswith("favicon.svg"), f"no icon link on the page (browsers then ask for /favicon.ico): {icon}"
    response = v.page.request.get(icon)
    assert response.ok and b"<svg" in response.body(), f"the icon {icon} did not load"
    footer = v.page.inner_text("footer.bd-footer-content")
    assert "computed by the code beside it" in footer and "By " not in footer, footer


def test_sidebar_lists_every_page(visit):
    v = visit(f"{PAGES[0]}.html")
    links = v.page.eval_on_selector_all("nav.bd-docs-nav a", "els => els.map(e => e.href)")
    linked = {urlparse(href).path.lstrip("/").removesuffix(".html") for href in links}
    missing = [doc for doc in PAGES[1:] if doc not in linked]
    assert missing == [], f"pages missing from the sidebar: {missing}"


# Every search control of the theme that a reader can see on the screen.
VISIBLE_SEARCHES = """() => [...document.querySelectorAll('.search-button__button, form.bd-search')].filter(e => {
  const r = e.getBoundingClientRect(), s = getComputedStyle(e);
  return r.width > 0 && r.height > 0 && s.visibility !== 'hidden';
}).map(e => e.closest('header, .bd-sidebar-primary, .bd-header-article')?.className || e.className)"""


@pytest.mark.parametrize("width", [1280, 390])
def test_one_search_among_the_page_buttons_and_no_bar_across_the_top(visit, width):
    page = visit("chapters/attention.html").page
    page.set_viewport_size({"width": width, "height": 900})
    shown = page.evaluate(VISIBLE_SEARCHES)
    assert len(shown) == 1 and "bd-header-article" in shown[0], shown
    assert page.evaluate("() => document.querySelector('.bd-header')?.getBoundingClientRect().height || 0") == 0
    page.locator(".bd-header-article button.search-button").click()
    box = page.locator("input[name=q]:visible").first
    box.fill("attention")
    box.press("Enter")
    page.wait_for_url("**/search.html?q=attention*")


def test_search_finds_attention(visit):
    v = visit("search.html?q=attention")
    # Sphinx lists the results one by one, then says "Search finished, found N page(s)"
    v.page.wait_for_function(
        "() => (document.querySelector('#search-results .search-summary')?.innerText || '').includes('found')",
        timeout=60_000)
    hits = v.page.eval_on_selector_all("#search-results li a", "els => els.map(e => e.href)")
    assert any("attention" in href for href in hits), hits
    assert v.errors == [] and v.outside == []


@pytest.mark.parametrize("doc", ["chapters/attention", "chapters/training_run"])
def test_a_chapter_offers_its_executed_notebook_for_download(doc, visit):
    page = visit(f"{doc}.html").page
    link = page.locator("a.btn-download-notebook-button")
    assert link.count() == 1, "the download menu offers no .ipynb (tools/ipynb_download.py)"
    response = page.request.get(urljoin(page.url, link.get_attribute("href")))
    assert response.ok, f"the .ipynb link answers {response.status}"
    notebook = json.loads(response.text())
    code = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    executed = [cell for cell in code if cell.get("execution_count")]
    assert len(code) > 10 and len(executed) == len(code), "the notebook offered is not the executed one"
    assert any(cell.get("outputs") for cell in code), "the notebook offered has no outputs"


def test_printed_pages_wrap_code_and_print_only_the_solutions_of_what_is_hidden(visit):
    page = visit("chapters/attention.html").page
    page.emulate_media(media="print")
    wrap = page.evaluate("getComputedStyle(document.querySelector('div.highlight pre')).whiteSpace")
    assert wrap == "pre-wrap", f"printed code does not wrap (white-space {wrap})"
    body = page.locator("section:not(#exercises) > .cell details.hide")
    assert body.count() > 0 and not any(body.nth(i).is_visible() for i in range(body.count()))
    solutions = page.locator("section#exercises details.hide")
    assert solutions.count() >= 1
    for i in range(solutions.count()):
        assert not solutions.nth(i).locator("summary").is_visible(), "a toggle bar is printed"
        assert solutions.nth(i).locator("pre").first.is_visible(), "a code solution is not printed"
    page.emulate_media(media="screen")
    assert page.evaluate("getComputedStyle(document.querySelector('div.highlight pre')).whiteSpace") == "pre"
