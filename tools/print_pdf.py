"""The whole book as one PDF: `make pdf` builds the book as a single HTML page (Jupyter Book's
``singlehtml`` builder, from the executed chapters in the build's cache) and this prints that page
with headless Chromium, after MathJax has typeset every equation, using the book's print styles
(tools/site.css: code wrapped, not cut; toggles hidden; exercises' solutions shown).

    python -m tools.print_pdf _build/singlehtml/preface.html _build/pdf/transformer-book.pdf

The page is served from its own folder on a local port (MathJax loads its fonts as a site's pages
do), and no request may leave it: the book needs nothing from the network. Chromium is Debian's
``chromium`` package, or the browser that ``CHROMIUM`` names, as for the browser tests. A bad
argument is one line on standard error and exit 2; a failure to print (Chromium that does not start,
a page that asks the network, a timeout) one line and exit 1; Ctrl-C, one line and exit 130.
"""

import argparse
import contextlib
import functools
import http.server
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

# Chromium's switches for a headless run that asks nothing of the network (the browser tests use them too).
CHROMIUM_FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def find_chromium() -> str | None:
    """The Chromium to drive: ``CHROMIUM`` if set (e.g. Google Chrome on GitHub's runners), else
    ``chromium`` or ``chromium-browser`` on the PATH; None when there is none."""
    return os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """A static file server that logs nothing (a page asks for hundreds of files)."""

    def log_message(self, *args) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        # a browser that drops a connection it no longer needs is not an error of the book
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextlib.contextmanager
def serve(folder: Path) -> Iterator[str]:
    """``folder`` served on a free local port while the block runs; yields its address,
    ``http://127.0.0.1:PORT``."""
    server = _Server(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def _say(what: str) -> None:
    print(f"print_pdf: {what}", file=sys.stderr, flush=True)


def print_pdf(page: Path, out: Path, browser, timeout_s: float = 300.0) -> int:
    """Print ``page`` (an HTML file) to ``out`` as A4 in ``browser`` (a Playwright Chromium) and
    return the PDF's size in bytes. Raises RuntimeError when the page asks for anything outside its
    own server (the browser tests check the equations themselves)."""
    outside: list[str] = []
    with serve(page.parent) as address:
        origin = urlparse(address).netloc

        def keep_local(route) -> None:
            url = urlparse(route.request.url)
            if url.scheme in ("http", "https") and url.netloc != origin:
                outside.append(route.request.url)
                route.abort()
            else:
                route.continue_()

        context = browser.new_context()
        try:
            tab = context.new_page()
            tab.route("**/*", keep_local)
            _say(f"loading {page.name}")
            tab.goto(f"{address}/{page.name}", wait_until="load", timeout=timeout_s * 1000)
            if tab.evaluate("() => 'MathJax' in window"):  # a page without equations loads no MathJax
                _say("waiting for MathJax to typeset the equations")
                tab.wait_for_function("() => MathJax.startup && MathJax.startup.promise", timeout=timeout_s * 1000)
                tab.evaluate("() => MathJax.startup.promise")
            if outside:
                raise RuntimeError(f"{page} asked for {len(outside)} file(s) from the network, e.g. {outside[0]}")
            tab.emulate_media(media="print")
            _say("printing")
            out.parent.mkdir(parents=True, exist_ok=True)
            partial = out.with_name(out.name + ".partial")  # a crash never leaves half a PDF under the name
            tab.pdf(path=str(partial), format="A4", print_background=True,
                    margin={"top": "15mm", "bottom": "15mm", "left": "12mm", "right": "12mm"})
            partial.replace(out)
        finally:
            context.close()
    return out.stat().st_size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="print_pdf", description=__doc__.split("\n\n")[0])
    parser.add_argument("page", type=Path, help="the HTML page to print (make pdf: _build/singlehtml/preface.html)")
    parser.add_argument("out", type=Path, help="the PDF to write")
    args = parser.parse_args(argv)
    if not args.page.is_file() or args.page.suffix != ".html":
        print(f"print_pdf: page must be an existing .html file, got {args.page}", file=sys.stderr)
        return 2
    if args.out.suffix != ".pdf" or args.out.is_dir():
        print(f"print_pdf: out must be a file name ending in .pdf, got {args.out}", file=sys.stderr)
        return 2
    if (executable := find_chromium()) is None:
        print("print_pdf: Chromium is not installed: `sudo apt-get install chromium`, "
              "or set CHROMIUM to the path of a Chromium-based browser", file=sys.stderr)
        return 2
    tick = time.perf_counter()
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
            size = print_pdf(args.page.resolve(), args.out, browser)
            browser.close()
    except KeyboardInterrupt:
        print("print_pdf: interrupted; no PDF written", file=sys.stderr)
        return 130
    except (RuntimeError, PlaywrightError) as error:  # Playwright's: Chromium failed to start, a timeout
        print(f"print_pdf: {str(error).strip().splitlines()[0]}", file=sys.stderr)
        return 1
    print(f"print_pdf: wrote {args.out} ({size / 2**20:.1f} MiB) in {time.perf_counter() - tick:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
