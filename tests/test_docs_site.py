"""The documentation site works for a reader with no network: built with mkdocs, served from this
machine and opened in headless Chromium that can reach nothing else.

The concepts diagram is drawn (mermaid ships with the site, docs/javascripts/mermaid), no page asks
another host for anything, and no table cell breaks a name over two lines (docs/stylesheets/extra.css).
Chromium and its driver come from Debian's packages; scripts/docs-browser-test installs them and CI
runs it. Without them these tests are skipped, except under CI, where they fail.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from helpers import wait_until

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
# Wide enough for material's table of contents beside the page, narrow enough that the options
# tables cannot give their first column the width of its longest names.
WINDOW = (1024, 900)

pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER) and not os.environ.get("CI"),
    reason="no Chromium: scripts/docs-browser-test installs it (apt-get install chromium chromium-driver)",
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as `mkdocs build --strict` makes it from this tree."""
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, f"mkdocs build failed:\n{built.stderr}"
    return out


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def base_url(site: Path) -> Iterator[str]:
    """The site served over HTTP on loopback, as a reader's own server would."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    """Headless Chromium with no network: every host but loopback goes through a proxy on a port
    nothing listens on (Chromium sends loopback direct) and resolves to nothing."""
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.fail("no Chromium under CI: scripts/docs-browser-test installs chromium and chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
        "--proxy-server=127.0.0.1:9",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
    ):
        options.add_argument(argument)
    # The performance log carries the DevTools protocol's Network events: every request a page made.
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def _requests_elsewhere(driver: webdriver.Chrome, base_url: str) -> list[str]:
    """The http(s) requests made since the last call to hosts other than the site's server."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            url = message["params"]["request"]["url"]
            if urlsplit(url).scheme in ("http", "https") and not url.startswith(base_url):
                urls.append(url)
    return urls


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A DevTools DOM node and everything under it, shadow roots included."""
    yield node
    for child in (*node.get("shadowRoots", ()), *node.get("children", ())):
        yield from _nodes(child)


def _drawn_diagrams(driver: webdriver.Chrome) -> list[str]:
    """The text of each SVG drawn inside a mermaid element. material puts the drawing in a closed
    shadow root, out of reach of the page's scripts; the DevTools protocol sees through it."""
    document = driver.execute_cdp_cmd("DOM.getDocument", {"depth": -1, "pierce": True})
    drawn = []
    for node in _nodes(document["root"]):
        attributes = node.get("attributes", [])
        classes = dict(zip(attributes[::2], attributes[1::2], strict=True)).get("class", "").split()
        if node.get("localName") == "div" and "mermaid" in classes:
            for svg in (n for n in _nodes(node) if n.get("localName") == "svg"):
                drawn.append(" ".join(n["nodeValue"] for n in _nodes(svg) if n.get("nodeType") == 3))
    return drawn


def test_the_concepts_diagram_is_drawn_with_no_network(browser: webdriver.Chrome, base_url: str) -> None:
    _requests_elsewhere(browser, base_url)  # drop what the browser did before this page
    browser.get(base_url + "concepts/")
    try:
        diagrams = wait_until(lambda: _drawn_diagrams(browser), timeout=30, what="the concepts diagram")
    except AssertionError:
        diagrams = []
    if not diagrams:
        source = browser.execute_script("return document.querySelector('pre.mermaid, pre')?.innerText")
        elsewhere = _requests_elsewhere(browser, base_url)
        pytest.fail(
            "the concepts diagram was not drawn within 30 s; the page shows its source instead: "
            f"{(source or '')[:60]!r}; requests that left the machine: {elsewhere}"
        )
    assert len(diagrams) == 1
    for participant in ("MongoDB change stream", "connector", "handler", "checkpoint store"):
        assert participant in diagrams[0], f"the diagram lacks {participant!r}: {diagrams[0][:200]!r}"
    assert _requests_elsewhere(browser, base_url) == []


def _pages_with_tables(site: Path) -> list[str]:
    """The site's pages that have a table, as paths under the site's root URL ("" for the home page)."""
    pages = []
    for page in site.rglob("index.html"):
        if "<td" in page.read_text(encoding="utf-8"):
            folder = page.parent.relative_to(site).as_posix()
            pages.append("" if folder == "." else folder + "/")
    return sorted(pages)


def test_no_table_cell_breaks_a_name(browser: webdriver.Chrome, site: Path, base_url: str) -> None:
    pages = _pages_with_tables(site)
    assert "options/" in pages and "operations/" in pages, pages
    broken: list[str] = []
    checked: dict[str, int] = {}
    for page in pages:
        _requests_elsewhere(browser, base_url)
        browser.get(base_url + page)
        # A name wrapped over two lines is one inline box in two pieces: two client rects.
        cells = browser.execute_script(
            "return Array.from(document.querySelectorAll('td code, th code'),"
            " code => [code.textContent, code.getClientRects().length])"
        )
        checked[page] = len(cells)
        broken += [f"{page}: {name!r} on {lines} lines" for name, lines in cells if lines != 1]
        assert _requests_elsewhere(browser, base_url) == [], page
    assert checked["options/"] > 50, checked
    assert not broken, "table cells break names:\n" + "\n".join(broken)


def test_the_window_is_narrow_enough_to_break_names_without_the_stylesheet(
    browser: webdriver.Chrome, base_url: str
) -> None:
    """The name test means something: in its window, material's own styles alone break names of
    the options tables."""
    browser.get(base_url + "options/")
    broken = browser.execute_script(
        "const sheet = document.querySelector('link[href$=\"stylesheets/extra.css\"]');"
        " if (!sheet) return null;"
        " sheet.disabled = true;"
        " return Array.from(document.querySelectorAll('td code'))"
        "  .filter(code => code.getClientRects().length > 1).map(code => code.textContent)"
    )
    assert broken is not None, "the site does not load stylesheets/extra.css (mkdocs.yml extra_css)"
    assert "full_document" in broken, broken
