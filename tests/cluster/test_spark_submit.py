"""The two ways a user starts tensorspark on a cluster, run as the user runs them.

* ``spark-submit --master spark://... --py-files tensorspark-*.whl examples/spark_mnist.py``:
  the package travels with the job (a wheel built from this checkout), and a cluster-wide
  setting comes in as ``--conf spark.tensorspark.server.port=P1-P2``.
* The pyspark shell: ``bin/pyspark --master spark://...`` and, at its prompt,
  ``import tensorspark.examples.spark_mnist as mnist; mnist.train(sc=sc, ...)`` with
  tensorspark installed on every node (here: the virtual environment the Workers use).

Both are separate driver processes started from pyspark's ``bin/``; the test's own
SparkContext on the cluster (if any) is stopped first so that they get the cluster's cores.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.conftest import StandaloneCluster, poll
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
SUBMIT_TIMEOUT_S = 600
ACCURACY = re.compile(r"^final test accuracy: (\d\.\d+)$", re.M)
SHELL_ACCURACY = re.compile(r"^shell accuracy: (\d\.\d+)$", re.M)
LISTENING = re.compile(r"parameter server listening at http://127\.0\.0\.1:(\d+) ")
OUTPUT_TAIL = 6000


@pytest.fixture
def idle_cluster(spark_cluster: StandaloneCluster) -> Iterator[StandaloneCluster]:
    """The cluster with no application of this process on it."""
    spark_cluster.release()
    yield spark_cluster


def _env(cluster: StandaloneCluster) -> dict[str, str]:
    return {
        **os.environ,
        "SPARK_HOME": cluster.spark_home,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "OMP_NUM_THREADS": "1",
    }


def _completed_apps(cluster: StandaloneCluster, name: str) -> int:
    """How many finished applications called ``name`` the Master lists."""
    status = cluster.status()
    assert status is not None, "the Master does not answer"
    return sum(1 for app in status.get("completedapps", []) if app.get("name") == name)


def _wait_completed(cluster: StandaloneCluster, name: str) -> None:
    """The Master marks an application finished once its driver has disconnected."""
    poll(
        lambda: _completed_apps(cluster, name) == 1,
        60.0,
        f"application {name} to finish",
        cluster.log_tails,
    )


def _conf_args(cluster: StandaloneCluster, extra: dict[str, str] | None = None) -> list[str]:
    args = []
    for key, value in {**cluster.app_conf(), **(extra or {})}.items():
        args += ["--conf", f"{key}={value}"]
    return args


def _run(args: list[str], env: dict[str, str], cwd: Path, stdin: str | None = None) -> str:
    done = subprocess.run(
        args,
        input=stdin,
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=SUBMIT_TIMEOUT_S,
        check=False,
    )
    output = f"{done.stdout}\n--- stderr ---\n{done.stderr}"
    assert done.returncode == 0, (
        f"{args[0]} exited with {done.returncode}:\n{output[-OUTPUT_TAIL:]}"
    )
    return output


def _wheel(tmp_path: Path) -> Path:
    """A wheel of this checkout, built from a copy so the working tree gets no build/ folder."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "tensorspark", source / "tensorspark", ignore=shutil.ignore_patterns("__pycache__")
    )
    dist = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(dist),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    [wheel] = dist.glob("tensorspark-*.whl")
    return wheel


@pytest.mark.timeout(900)
def test_spark_submit_with_wheel_and_conf_port_range(
    idle_cluster: StandaloneCluster, fashion_mnist_dir: Path, tmp_path: Path
) -> None:
    wheel = _wheel(tmp_path)
    first = free_port()
    last = min(first + 20, 65535)
    output = _run(
        [
            str(Path(idle_cluster.spark_home) / "bin" / "spark-submit"),
            "--master",
            idle_cluster.master_url,
            "--name",
            "tensorspark-submit-test",
            "--py-files",
            str(wheel),
            *_conf_args(idle_cluster, {"spark.tensorspark.server.port": f"{first}-{last}"}),
            str(ROOT / "examples" / "spark_mnist.py"),
            "--data-dir",
            f"file://{fashion_mnist_dir}",
            "--partitions",
            "2",
            "--epochs",
            "2",
        ],
        _env(idle_cluster),
        tmp_path,
    )
    accuracy = ACCURACY.findall(output)
    assert len(accuracy) == 1, output[-OUTPUT_TAIL:]
    assert float(accuracy[0]) >= 0.80
    ports = [int(p) for p in LISTENING.findall(output)]
    assert len(ports) == 1, output[-OUTPUT_TAIL:]
    assert first <= ports[0] <= last
    # It ran on the cluster (not on a local master the script made up).
    _wait_completed(idle_cluster, "tensorspark-submit-test")


SHELL_SCRIPT = (
    "import tensorspark.examples.spark_mnist as mnist\n"
    "acc = mnist.train(sc=sc, user='alice', name='mnist_try', sync_interval=100, "
    "batch_size=100, num_partition=2, num_epoch=2, data_dir={data!r})\n"
    'print("shell accuracy: %.4f" % acc)\n'
)


@pytest.mark.timeout(900)
def test_pyspark_shell_import(
    idle_cluster: StandaloneCluster, fashion_mnist_dir: Path, tmp_path: Path
) -> None:
    env = _env(idle_cluster)
    # `python -i` keeps the shell interactive with a script on stdin: pyspark's shell.py
    # (PYTHONSTARTUP) runs and defines `sc`, then the lines are read as if typed.
    env["PYSPARK_DRIVER_PYTHON_OPTS"] = "-i"
    output = _run(
        [
            str(Path(idle_cluster.spark_home) / "bin" / "pyspark"),
            "--master",
            idle_cluster.master_url,
            "--name",
            "tensorspark-shell-test",
            *_conf_args(idle_cluster),
        ],
        env,
        tmp_path,
        stdin=SHELL_SCRIPT.format(data=f"file://{fashion_mnist_dir}"),
    )
    assert "Traceback" not in output, output[-OUTPUT_TAIL:]
    accuracy = SHELL_ACCURACY.findall(output)
    assert len(accuracy) == 1, output[-OUTPUT_TAIL:]
    assert float(accuracy[0]) >= 0.80
    _wait_completed(idle_cluster, "tensorspark-shell-test")
