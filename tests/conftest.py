"""Shared test set-up: markers by folder, quiet TensorFlow, loopback-only Spark."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark import cloudpickle

import tests
from tests import ports
from tests.compat_set import in_compat_set
from tests.jvm import LONG_LIVED, SPARK_CONF_DIR

# Executors cannot import the `tests` package (it is not installed), so functions defined
# in test modules travel to them by value.
cloudpickle.register_pickle_by_value(tests)

# Everything binds to loopback and TensorFlow stays on few threads: 2 cores are shared by all.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("OMP_NUM_THREADS", "1")
# One JVM serves every SparkContext of this test process, sized by whichever test set
# creates the first one (the cluster fixture runs first): give it room for the whole run.
# It lives as long as the run, so it keeps HotSpot's optimising compiler (tests/jvm.py);
# the drivers the tests start as processes drop LONG_LIVED (tests/jvm.py's driver_process_env).
os.environ.setdefault("PYSPARK_SUBMIT_ARGS", f"--driver-memory 4g {LONG_LIVED} pyspark-shell")
# Spark's other JVMs start with the client compiler and the serial collector (tests/jvm.py).
os.environ.setdefault("SPARK_CONF_DIR", str(SPARK_CONF_DIR))

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
# The headless browser of the `browser` fixture (Debian's chromium and chromedriver).
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

_MARK_BY_FOLDER = {
    "unit": "unit",
    "spark": "spark",
    "cluster": "cluster",
    "hdfs": "hdfs",
    "s3": "s3",
    "yarn": "yarn",
    "netns": "netns",
    "connect": "connect",
}


def _set_mark(path: Path) -> str | None:
    """The set marker of a test file: by the folder right under tests/ (tests/unit/ps/... is
    `unit`; a subfolder named like another set, e.g. tests/unit/streaming, adds nothing)."""
    try:
        parts = path.resolve().relative_to(ROOT / "tests").parts
    except ValueError:
        return None
    return _MARK_BY_FOLDER.get(parts[0]) if len(parts) > 1 else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test by the set folder it lives in (tests/<set>/...), so `-m unit` etc.
    select a set, every test that drives Chromium (uses the `browser` fixture) `browser`, and
    the compat set's tests (tests/compat_set.py) `compat`."""
    oldest = bool(os.environ.get("TENSORSPARK_HADOOP_VERSION"))
    for item in items:
        mark = _set_mark(Path(str(item.fspath)))
        if mark is not None:
            item.add_marker(getattr(pytest.mark, mark))
        if "browser" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.browser)
        test_id = item.nodeid.removeprefix("tests/")
        if in_compat_set(test_id, oldest=oldest):
            item.add_marker(pytest.mark.compat)


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def fashion_mnist_dir() -> Path:
    """The Fashion-MNIST idx files installed by Debian's dataset-fashion-mnist package."""
    path = Path(os.environ.get("TENSORSPARK_TEST_DATA", "/usr/share/datasets/fashion-mnist"))
    if not path.is_dir():
        pytest.fail(
            f"Fashion-MNIST not found at {path}: run `apt-get install dataset-fashion-mnist` "
            "(.ci/run does this) or set TENSORSPARK_TEST_DATA."
        )
    return path


@pytest.fixture
def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (it was free a moment ago)."""
    return ports.closed_port()


@pytest.fixture
def browser() -> Iterator[object]:
    """A headless Chromium (Selenium's driver) with its console log kept; quit afterwards.
    Every test that uses it is marked `browser`."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="tensorspark-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--window-size=1280,1100",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
