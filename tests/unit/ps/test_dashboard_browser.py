"""The parameter server's dashboard at ``GET /``, in a real headless Chromium.

Real ParameterClients push from threads (one per partition, with their loss) while the
page is open; the page must load without console errors, pass its ``?token=`` on to
``/status``, draw loss points and list one worker row per partition.
"""

from __future__ import annotations

import re
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tensorspark.ps.client import ParameterClient
from tensorspark.ps.dashboard import dashboard_url, page
from tensorspark.ps.server import ParameterServer
from tensorspark.ps.shards import ShardedServer
from tests.unit.ps.sharding import dense_model, kill_and_wait

PARTITIONS = 3


class _Pushers:
    """One thread per partition pushing small updates with a falling loss until stopped."""

    def __init__(self, server: ParameterServer, partitions: int) -> None:
        self.server = server
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.threads = [
            threading.Thread(target=self._run, args=(p,), name=f"pusher-{p}", daemon=True)
            for p in range(partitions)
        ]

    def _run(self, partition: int) -> None:
        rng = np.random.default_rng(partition)
        try:
            with ParameterClient(
                self.server.url, timeout=10, ps_timeout=10, **self.server.client_options()
            ) as client:
                client.join(partition, 0)
                version, _ = client.pull()
                seq = 0
                while not self.stop.is_set():
                    meta = {
                        "partition": partition,
                        "attempt": 0,
                        "epoch": seq // 20,
                        "seq": seq,
                        "samples": 32,
                        "base_version": version,
                        "loss": 2.0 / (1.0 + 0.05 * seq) + 0.05 * float(rng.random()),
                        "metrics": {"accuracy": min(1.0, 0.1 + 0.01 * seq)},
                    }
                    result = client.push({"w": rng.normal(0, 1e-3, 8).astype(np.float32)}, meta)
                    version = result.version
                    seq += 1
                    self.stop.wait(0.05)
                client.leave(partition, 0, "done")
        except BaseException as err:  # reported by the test
            self.errors.append(err)

    def __enter__(self) -> _Pushers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(15)


@pytest.fixture
def server() -> Iterator[ParameterServer]:
    ps = ParameterServer({"w": np.zeros(8, np.float32)}, host="127.0.0.1", port=0)
    ps.start()
    yield ps
    ps.stop()


@pytest.mark.browser
def test_dashboard_shows_live_loss_and_workers(
    server: ParameterServer, browser, artifacts_dir: Path
) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    url = dashboard_url(server.url, server.status_token)
    assert "?token=" in url  # the server authenticates; the page must pass the token on
    with _Pushers(server, PARTITIONS) as pushers:
        browser.get(url)
        wait = WebDriverWait(browser, 30, poll_frequency=0.2)
        wait.until(
            lambda d: len(d.find_elements(By.CSS_SELECTOR, "#workers tbody tr")) == PARTITIONS
        )
        # Points from several refreshes: the chart grows while the page stays open.
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#chart-time circle.pt")) >= 30)
        wait.until(lambda d: d.execute_script("return window.tensorsparkDashboard.refreshes") >= 3)
        assert browser.find_element(By.ID, "conn").text == "live"
        by_version = browser.find_elements(By.CSS_SELECTOR, "#chart-version circle.pt")
        assert len(by_version) >= 30
        # The page rebuilds the chart and the table at each refresh: an element found in
        # one refresh is stale in the next, so each is read whole in one script, between
        # two refreshes.
        path, table = browser.execute_script(
            "const path = document.querySelector('#chart-time path.avg');"
            "const rows = document.querySelectorAll('#workers tbody tr');"
            "return [path && path.getAttribute('d'), Array.from(rows, r =>"
            " Array.from(r.cells, c => c.textContent.trim()))];"
        )
        assert path.startswith("M")
        assert [r[0] for r in table] == [str(p) for p in range(PARTITIONS)]
        assert all(
            r[2] == "active" and int(r[3]) > 0 and int(r[4]) == 32 * int(r[3]) for r in table
        ), table
        assert re.fullmatch(r"\d+(\.\d+)?", browser.find_element(By.ID, "loss").text)
        assert int(browser.find_element(By.ID, "version").text.replace(",", "")) > 0
        browser.save_screenshot(str(artifacts_dir / "dashboard.png"))
        logs = browser.get_log("browser")
    assert not pushers.errors, pushers.errors
    severe = [entry for entry in logs if entry["level"] in ("SEVERE", "ERROR")]
    assert severe == [], severe
    assert (artifacts_dir / "dashboard.png").stat().st_size > 10_000


def test_page_needs_the_token_and_loads_nothing_from_elsewhere(server: ParameterServer) -> None:
    html = page().decode("utf-8")
    # Nothing outside the page: no src=/href= to another host, and a policy that forbids it.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "default-src 'none'" in html and "connect-src 'self'" in html
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(server.url + "/", timeout=10)
    assert refused.value.code == 401
    with urllib.request.urlopen(
        dashboard_url(server.url, server.status_token), timeout=10
    ) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/html; charset=utf-8"
        assert response.read() == page()


def test_dashboard_url_quotes_the_token() -> None:
    assert dashboard_url("http://127.0.0.1:5000") == "http://127.0.0.1:5000/"
    assert (
        dashboard_url("http://127.0.0.1:5000/", "a+b/c") == "http://127.0.0.1:5000/?token=a%2Bb%2Fc"
    )


@pytest.mark.browser
def test_dashboard_shows_rows_per_sync_of_embedding_tables(browser) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tensorspark.ps.rows import rows_entry

    table = np.zeros((100, 4), np.float32)
    with ParameterServer({"emb": table, "w": np.zeros(8, np.float32)}, port=0) as ps:
        with ParameterClient(ps.url, **ps.client_options()) as client:
            client.join(0, 0)
            for seq, ids in enumerate(([1, 2, 3], [4, 5, 6, 7, 8])):
                push = {"w": np.zeros(8, np.float32)}
                push.update(rows_entry("emb", np.array(ids), np.ones((len(ids), 4), np.float32)))
                meta = {"partition": 0, "attempt": 0, "epoch": 0, "seq": seq, "samples": 4}
                client.push(push, dict(meta, base_version=seq, rows=["emb"]))
        browser.get(dashboard_url(ps.url, ps.status_token))
        wait = WebDriverWait(browser, 30, poll_frequency=0.2)
        wait.until(lambda d: d.find_element(By.ID, "rows").text != "-")
        assert browser.find_element(By.ID, "rows-card").is_displayed()
        # 8 rows pushed in 2 syncs; answered 3, then the 5 changed since version 1.
        assert browser.find_element(By.ID, "rows").text == "4 / 4"


@pytest.mark.browser
def test_dashboard_shows_a_worker_row_cache_s_counters(browser) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tensorspark.ps.rows import rows_entry

    table = np.zeros((100, 4), np.float32)
    with ParameterServer({"emb": table, "w": np.zeros(8, np.float32)}, port=0) as ps:
        with ParameterClient(ps.url, **ps.client_options()) as client:
            client.join(0, 0)
            browser.get(dashboard_url(ps.url, ps.status_token))
            assert not browser.find_element(By.ID, "cache-card").is_displayed()
            for seq, hits in enumerate((1200, 800)):
                push = {"w": np.zeros(8, np.float32)}
                push.update(rows_entry("emb", np.array([seq]), np.ones((1, 4), np.float32)))
                meta = {"partition": 0, "attempt": 0, "epoch": 0, "seq": seq, "samples": 4}
                report = {"cache_hits": hits, "cache_misses": 30, "cache_evictions": 5}
                client.push(push, dict(meta, base_version=seq, rows=["emb"], cache=report))
        wait = WebDriverWait(browser, 30, poll_frequency=0.2)
        # (A hidden element's text reads "": wait for the card, then its figures.)
        wait.until(lambda d: d.find_element(By.ID, "cache-card").is_displayed())
        wait.until(lambda d: d.find_element(By.ID, "cache").text == "2,000 / 60 / 10")


@pytest.mark.browser
def test_dashboard_shows_dynamic_tables_rows_in_use_and_admissions(browser) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    spec = {"t": {"capacity": 2, "min_count": 1, "policy": "lfu", "ttl": None, "init": {}}}
    params = {"t": np.zeros((3, 4), np.float32), "w": np.zeros(8, np.float32)}
    with ParameterServer(params, port=0, vocab=spec) as ps:
        with ParameterClient(ps.url, **ps.client_options()) as client:
            browser.get(dashboard_url(ps.url, ps.status_token))
            wait = WebDriverWait(browser, 30, poll_frequency=0.2)
            wait.until(lambda d: d.find_element(By.ID, "vocab-card").is_displayed())
            client.vocab({"t": np.array([5, 6, 7], np.int64)}, {"t": -1}, (0, 0, 0))
            client.vocab({"t": np.array([7, 8], np.int64)}, {"t": -1}, (0, 0, 1))
        wait.until(lambda d: d.find_element(By.ID, "vocab").text == "2 / 2, 4 / 2")


@pytest.mark.browser
def test_dashboard_shows_a_stream_s_rates_and_lag(browser) -> None:  # type: ignore[no-untyped-def]
    """fit_stream annotates the server's /status with the stream's progress; the dashboard
    shows its input and trained rates and the lag to the model in a card of its own."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with ParameterServer({"w": np.zeros(8, np.float32)}, port=0) as ps:
        browser.get(dashboard_url(ps.url, ps.status_token))
        wait = WebDriverWait(browser, 30, poll_frequency=0.2)
        wait.until(lambda d: d.find_element(By.ID, "applied").text != "-")
        assert not browser.find_element(By.ID, "stream-card").is_displayed()
        note = {"input_rows_per_sec": 812.4, "trained_rows_per_sec": 640.0, "lag_p50_s": 7.25}
        ps.annotate("stream", note)
        # (Selenium reads a hidden element's text as "": wait for the card itself.)
        wait.until(lambda d: d.find_element(By.ID, "stream-card").is_displayed())
        assert browser.find_element(By.ID, "stream").text == "812 / 640, 7.3 s"


@pytest.mark.browser
def test_dashboard_shows_a_stream_s_exports(browser) -> None:  # type: ignore[no-untyped-def]
    """With fit_stream(export=...), the stream's status carries the exporter's counts and
    the newest published version's freshness; the dashboard shows them in a card."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with ParameterServer({"w": np.zeros(8, np.float32)}, port=0) as ps:
        browser.get(dashboard_url(ps.url, ps.status_token))
        wait = WebDriverWait(browser, 30, poll_frequency=0.2)
        note = {"input_rows_per_sec": 10.0, "trained_rows_per_sec": 10.0, "lag_p50_s": 1.0}
        ps.annotate("stream", note)
        wait.until(lambda d: d.find_element(By.ID, "stream-card").is_displayed())
        assert not browser.find_element(By.ID, "exports-card").is_displayed()
        exports = {
            "published": 4,
            "rejected": 1,
            "freshness_p50_s": 6.5,
            "freshness_p99_s": 12.25,
            "last_decision": {"reason": "accuracy 0.7 within 0.01 of 0.69"},
        }
        ps.annotate("stream", {**note, "exports": exports})
        wait.until(lambda d: d.find_element(By.ID, "exports-card").is_displayed())
        assert browser.find_element(By.ID, "exports").text == "4 / 1, 6.5 s / 12 s"


@pytest.mark.browser
def test_dashboard_shows_the_checkpoints_bytes(browser, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A run's checkpointer serves the checkpoints it wrote in /status; the dashboard shows
    the last one's kind and size and the MB of full checkpoints and increments."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tensorspark.checkpoint import CheckpointManager
    from tensorspark.ps.checkpointer import Checkpointer
    from tensorspark.ps.rows import rows_entry

    table = np.zeros((20000, 4), np.float32)
    with ParameterServer({"emb": table, "w": np.zeros(8, np.float32)}, port=0) as ps:
        manager = CheckpointManager(str(tmp_path), full_every=5)
        checkpointer = Checkpointer(ps, manager, interval=3600)
        browser.get(dashboard_url(ps.url, ps.status_token))
        wait = WebDriverWait(browser, 30, poll_frequency=0.2)
        wait.until(lambda d: d.find_element(By.ID, "applied").text != "-")
        assert not browser.find_element(By.ID, "ckpt-card").is_displayed()
        with ParameterClient(ps.url, **ps.client_options()) as client:
            client.join(0, 0)
            for seq, ids in enumerate(([1, 2, 3], [4, 5])):
                push = {"w": np.zeros(8, np.float32)}
                push.update(rows_entry("emb", np.array(ids), np.ones((len(ids), 4), np.float32)))
                meta = {"partition": 0, "attempt": 0, "epoch": 0, "seq": seq, "samples": 4}
                client.push(push, dict(meta, base_version=seq, rows=["emb"]))
                assert checkpointer.save_now() is not None
        written = checkpointer.written()
        assert (written["full_count"], written["increment_count"]) == (1, 1)
        assert written["last_kind"] == "increment" and written["last"] < 2000
        assert written["full_total"] > table.nbytes
        wait.until(lambda d: d.find_element(By.ID, "ckpt-card").is_displayed())
        text = browser.find_element(By.ID, "ckpt").text
        assert re.fullmatch(r"increment 0\.00\d+, 0\.32\d* \(1\) / 0\.00\d+ \(1\)", text), text


@pytest.mark.browser
def test_dashboard_shows_each_shard_s_restarts(browser) -> None:  # type: ignore[no-untyped-def]
    """With shards, the Shards table's last column is /status's ``shard_restarts``: a
    shard the driver restarted after its process was killed shows 1."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def restarts(driver) -> list[str]:  # type: ignore[no-untyped-def]
        """The last cell of each row, read at once (the page replaces the rows each second)."""
        return driver.execute_script(  # type: ignore[no-any-return]
            "return Array.from(document.querySelectorAll('#shards tbody tr'))"
            ".map(function (tr) { return tr.lastElementChild.textContent; });"
        )

    with ShardedServer(dense_model(0, 200, 64), shards=2, port=0) as server:
        browser.get(dashboard_url(server.url, server.status_token))
        wait = WebDriverWait(browser, 30, poll_frequency=0.2)
        wait.until(lambda d: d.find_element(By.ID, "shards-panel").is_displayed())
        header = browser.find_elements(By.CSS_SELECTOR, "#shards thead th")[-1].text
        assert header == "restarts"
        wait.until(lambda d: restarts(d) == ["0", "0"])
        kill_and_wait(server, 1)
        wait.until(lambda d: restarts(d) == ["0", "1"])
        assert server.status()["shard_restarts"] == [0, 1]
