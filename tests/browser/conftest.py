"""The fixtures of the browser tests (test_site.py, test_demo.py), shared so that one Chromium serves
both: a local HTTP server for `_build/html` (`site_url`), headless Chromium (`browser`), and `visit`,
which opens a page in a fresh context and records its console errors and every request that would
leave the local server."""

from pathlib import Path
from urllib.parse import urlparse

import pytest

from tools.print_pdf import CHROMIUM_FLAGS, find_chromium, serve

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "_build" / "html"
# Console messages that are not errors of the book, each with the reason it is allowed.
CONSOLE_ALLOWLIST: dict[str, str] = {
    "Got invalid theme mode: . Resetting to auto.": (
        "pydata-sphinx-theme 0.17 under sphinx-book-theme 1.3 sets the light/dark mode from "
        "localStorage with an empty fallback, so a first visit logs this and falls back to 'auto'; "
        "sphinx-book-theme accepts no `default_mode` option to avoid it"
    ),
}


@pytest.fixture(scope="session")
def site_url():
    if not (SITE / "index.html").is_file():
        pytest.fail(f"no built book in {SITE}: run `make html` (or `make book`) first")
    with serve(SITE) as address:
        yield address


@pytest.fixture(scope="session")
def browser():
    # CHROMIUM names another Chromium-based browser, e.g. Google Chrome on GitHub's runners.
    executable = find_chromium()
    if executable is None:
        pytest.fail(
            "Chromium is not installed, and the browser test of the book needs it. "
            "On Debian or Ubuntu: `sudo apt-get install chromium` (or set CHROMIUM to the path of a "
            "Chromium-based browser); then run `make test` again."
        )
    from playwright.sync_api import sync_playwright

    playwright = sync_playwright().start()
    # Scrollbars as a reader sees them: Playwright hides them in headless mode unless told not to, and
    # the test of wide equations checks that theirs is there.
    chromium = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS,
                                          ignore_default_args=["--hide-scrollbars"])
    yield chromium
    chromium.close()
    playwright.stop()


class Visit:
    """One page in a fresh browser context, with what it logged and what it asked for."""

    def __init__(self, browser, site_url: str, path: str, width: int = 1280):
        self.origin = urlparse(site_url).netloc
        self.context = browser.new_context(viewport={"width": width, "height": 900})
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.outside: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda err: self.errors.append(f"uncaught: {err}"))
        self.page.goto(f"{site_url}/{path}", wait_until="load")

    def _route(self, route):
        url = urlparse(route.request.url)
        if url.scheme in ("http", "https") and url.netloc != self.origin:
            self.outside.append(route.request.url)
            route.abort()  # record it, and do not let it leave
        else:
            route.continue_()

    def _console(self, message):
        if message.type == "error" and not any(key in message.text for key in CONSOLE_ALLOWLIST):
            self.errors.append(message.text)

    def close(self):
        self.context.close()


@pytest.fixture
def visit(browser, site_url):
    opened = []

    def open_page(path: str, width: int = 1280) -> Visit:
        opened.append(Visit(browser, site_url, path, width))
        return opened[-1]

    yield open_page
    for v in opened:
        v.close()
