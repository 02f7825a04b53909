"""The built site in Debian's Chromium: pages render and the search finds ``predict``.

The site is served from the build folder on 127.0.0.1 (Material's search runs in a web
worker that fetches its index, which a ``file://`` page may not do).
"""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator

import pytest

from tests.docs.conftest import BuiltSite

pytestmark = [pytest.mark.docs, pytest.mark.browser]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture
def site_url(built_site: BuiltSite) -> Iterator[str]:
    assert built_site.returncode == 0, built_site.output[-6000:]
    handler = functools.partial(_Quiet, directory=str(built_site.folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="docs-site", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _severe(browser) -> list[dict]:  # type: ignore[no-untyped-def]
    return [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def test_pages_render_and_search_finds_predict(site_url: str, browser, artifacts_dir) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 30, poll_frequency=0.2)
    pages = {
        "/": "tensorspark",
        "/guide/keras/": "Keras: fit, evaluate, predict",
        "/api/": "API reference",
    }
    for path, title in pages.items():
        browser.get(site_url + path)
        heading = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "article h1"))
        assert heading.text.strip().startswith(title), (path, heading.text)
        # The theme's stylesheet applied (not a bare page): the header bar is laid out.
        header = browser.find_element(By.CSS_SELECTOR, "header.md-header")
        assert header.size["height"] > 30, path
        assert browser.find_elements(By.CSS_SELECTOR, "nav.md-nav"), path
        assert _severe(browser) == [], path
    # The API page: every public name is a rendered heading; code is highlighted.
    assert browser.find_element(By.ID, "tensorspark.session.SparkSession").is_displayed()
    assert browser.find_elements(By.CSS_SELECTOR, ".doc-signature, .highlight")

    browser.get(site_url + "/")
    box = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "input.md-search__input"))
    wait.until(lambda d: box.is_displayed() and box.is_enabled())
    box.click()
    box.send_keys("predict")
    items = wait.until(
        lambda d: d.find_elements(By.CSS_SELECTOR, ".md-search-result__item") or None
    )
    texts = " ".join(item.text for item in items).lower()
    assert "predict" in texts, texts[:500]
    links = [
        a.get_attribute("href")
        for a in browser.find_elements(By.CSS_SELECTOR, ".md-search-result__link")
    ]
    assert any("/guide/inference/" in href or "/api/" in href for href in links), links
    browser.save_screenshot(str(artifacts_dir / "docs-search.png"))
    box.send_keys(Keys.ESCAPE)
    assert _severe(browser) == []
