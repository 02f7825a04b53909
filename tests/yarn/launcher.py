"""The YARN test cluster's launcher, ``tests/hdfs/minicluster/YarnMiniCluster.java``,
compiled with the JDK's ``javac`` against the HDFS tests' Hadoop classpath, once per source
and classpath (cached under ``$XDG_CACHE_HOME/tensorspark``)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.hdfs.conftest import MINICLUSTER, java_executable

LAUNCHER = MINICLUSTER / "YarnMiniCluster.java"


def compiled_launcher(classpath: str) -> Path:
    """The launcher's class folder, compiled with ``javac`` unless cached (the cache is
    keyed by the source and the classpath, and shared by the sessions of this user)."""
    key = hashlib.sha256(LAUNCHER.read_bytes() + classpath.encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tensorspark"
    out = cache / f"yarn-launcher-{key}"
    if (out / "YarnMiniCluster.class").is_file():
        return out
    javac = Path(java_executable()).with_name("javac")
    if not javac.is_file():
        found = shutil.which("javac")
        if found is None:
            pytest.fail(
                "The YARN tests need a JDK 17 (javac) to compile "
                "tests/hdfs/minicluster/YarnMiniCluster.java."
            )
        javac = Path(found)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="yarn-launcher-", dir=cache))  # renamed into place when done
    done = subprocess.run(
        [str(javac), "-nowarn", "-d", str(tmp), "-cp", classpath, str(LAUNCHER)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        pytest.fail(f"javac {LAUNCHER.name} failed:\n{done.stderr[-4000:]}")
    with contextlib.suppress(OSError):  # another session compiled it meanwhile: keep theirs
        tmp.rename(out)
    shutil.rmtree(tmp, ignore_errors=True)
    return out
