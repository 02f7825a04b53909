"""tensorspark on YARN, submitted as users submit it: ``spark-submit --master yarn``.

The seed's MNIST example (``examples/spark_mnist.py``) reads the idx files from HDFS
(``hdfs://``) and writes checkpoints there, in client mode (the driver and the parameter
server on the edge node) and in cluster mode (both inside the ApplicationMaster's container,
the result reaching the user through the application's final status, its log and a JSON file
on HDFS). A user's Keras program trains with ``SparkSession.fit`` in client mode. Failed runs
(a data folder that does not exist, a server the executors cannot reach) end the application
as FAILED with tensorspark's message in the driver's log, and never hang.

The Python environment reaches the containers as ``spark.pyspark.python``: the virtual
environment's interpreter, a path every NodeManager has (see ``YarnCluster.submit_conf``).
After every application, no container process is left.
"""

from __future__ import annotations

import getpass
import json
import re
from pathlib import Path

from tests.yarn.conftest import YarnCluster

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "spark_mnist.py"
KERAS_APP = Path(__file__).resolve().parent / "keras_app.py"
ACCURACY = re.compile(r"^final test accuracy: (\d\.\d+)$", re.M)
LISTENING = re.compile(r"parameter server listening at http://([^:/\s]+):(\d+) ")
USER = getpass.getuser()


def _mnist(data: str, name: str, *extra: str) -> list[str]:
    return ["--data-dir", data, "--partitions", "2", "--epochs", "2", "--name", name, *extra]


def _nodes_with_containers(cluster: YarnCluster, app_id: str) -> int:
    """How many NodeManagers ran containers of the application."""
    return sum(
        1
        for nm in cluster.node_managers
        if any(
            Path(d, app_id).is_dir() and any(Path(d, app_id).iterdir())
            for d in nm["log_dirs"].split(",")
        )
    )


def _checkpoints(cluster: YarnCluster, path: str) -> list[str]:
    return [n for n in cluster.client().list(path) if n.endswith(".safetensors")]


def test_client_mode_mnist_on_hdfs(
    yarn_cluster: YarnCluster, yarn_data: str, tmp_path: Path
) -> None:
    checkpoints = f"/user/{USER}/yarn_client_ckpt"
    run = yarn_cluster.submit(
        EXAMPLE,
        _mnist(
            yarn_data, "yarn_client", "--checkpoint-dir", f"{yarn_cluster.hdfs_url}{checkpoints}"
        ),
        deploy_mode="client",
        name="tensorspark-yarn-client",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.tail()
    [accuracy] = ACCURACY.findall(run.output)
    assert float(accuracy) >= 0.80
    # The driver, and with it the server, ran here (the edge node): its log is our output.
    [(host, _)] = LISTENING.findall(run.output)
    assert host in ("localhost", "127.0.0.1")
    assert f"Reading Fashion-MNIST from {yarn_data}" in run.output
    assert run.app_id is not None
    report = yarn_cluster.wait_final(run.app_id)
    assert report["finalStatus"] == "SUCCEEDED", report
    assert _nodes_with_containers(yarn_cluster, run.app_id) == 2  # both NodeManagers worked
    assert _checkpoints(yarn_cluster, checkpoints), "no checkpoint written to HDFS"
    assert yarn_cluster.wait_no_containers() == []


def test_cluster_mode_result_reaches_the_user(
    yarn_cluster: YarnCluster, yarn_data: str, tmp_path: Path
) -> None:
    folder = f"/user/{USER}/yarn_cluster"
    run = yarn_cluster.submit(
        EXAMPLE,
        _mnist(
            yarn_data,
            "yarn_cluster",
            "--checkpoint-dir",
            f"{yarn_cluster.hdfs_url}{folder}/ckpt",
            "--result",
            f"{yarn_cluster.hdfs_url}{folder}/result.json",
        ),
        deploy_mode="cluster",
        name="tensorspark-yarn-cluster",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.tail()
    assert run.app_id is not None
    # 1. The application's final status.
    report = yarn_cluster.wait_final(run.app_id)
    assert report["finalStatus"] == "SUCCEEDED", report
    # 2. Its log: the driver ran in the ApplicationMaster's container, not here.
    assert not ACCURACY.findall(run.output)
    am = yarn_cluster.am_logs(run.app_id)
    driver_log = am["stdout"] + am["stderr"]
    [accuracy] = ACCURACY.findall(driver_log)
    assert float(accuracy) >= 0.80
    # The server bound and advertised the ApplicationMaster container's host: the host the
    # driver registered with YARN (amRPCAddress), on the NodeManager that ran the AM.
    [(host, _)] = LISTENING.findall(driver_log)
    assert host == report["amRPCAddress"].rsplit(":", 1)[0]
    assert host == report["amHostHttpAddress"].rsplit(":", 1)[0]
    # 3. The result file on HDFS, written by the driver.
    with yarn_cluster.client().read(f"{folder}/result.json") as reader:
        result = json.load(reader)
    assert f"{result['accuracy']:.4f}" == accuracy
    assert result["application_id"] == run.app_id
    assert result["master"] == "yarn"
    assert _checkpoints(yarn_cluster, f"{folder}/ckpt")
    assert yarn_cluster.wait_no_containers() == []


def test_keras_fit_client_mode(yarn_cluster: YarnCluster, yarn_data: str, tmp_path: Path) -> None:
    run = yarn_cluster.submit(
        KERAS_APP,
        [yarn_data, "2"],
        deploy_mode="client",
        name="tensorspark-yarn-keras",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.tail()
    [losses] = re.findall(r"^keras loss by epoch: (.+)$", run.output, re.M)
    first, last = (float(v) for v in losses.split()[:: len(losses.split()) - 1])
    assert last < first
    [accuracy] = re.findall(r"^keras accuracy: (\d\.\d+)$", run.output, re.M)
    assert float(accuracy) >= 0.83
    assert run.app_id is not None
    assert yarn_cluster.wait_final(run.app_id)["finalStatus"] == "SUCCEEDED"
    assert _nodes_with_containers(yarn_cluster, run.app_id) == 2
    assert yarn_cluster.wait_no_containers() == []


def test_missing_data_fails_the_application(
    yarn_cluster: YarnCluster, yarn_data: str, tmp_path: Path
) -> None:
    missing = f"{yarn_cluster.hdfs_url}/data/no-such-folder"
    run = yarn_cluster.submit(
        EXAMPLE,
        _mnist(missing, "yarn_missing_data"),
        deploy_mode="client",
        name="tensorspark-yarn-missing",
        cwd=tmp_path,
    )
    assert run.returncode != 0
    assert (
        "tensorspark.errors.ConfigurationError: "
        "location must be a folder with MNIST-format idx files. "
        f"Received: location='{missing}', which does not exist." in run.output
    ), run.tail()
    assert run.app_id is not None
    report = yarn_cluster.wait_final(run.app_id)
    # pyspark's sc.stop() reports success; the example stops a failed run with exit code 1,
    # which the ApplicationMaster reports to YARN.
    assert report["finalStatus"] == "FAILED", report
    assert "Final app status: FAILED, exitCode: 1" in yarn_cluster.am_logs(run.app_id)["stderr"]
    assert yarn_cluster.wait_no_containers() == []


def test_unreachable_server_fails_the_application(
    yarn_cluster: YarnCluster, yarn_data: str, tmp_path: Path
) -> None:
    # Cluster mode, with a server host set for the whole cluster that is not the driver's
    # (docs/cluster.md warns against it): the server binds 127.0.0.1 in the AM's container
    # but executors are told 127.0.0.2, where nothing listens.
    # One attempt per task keeps the test short; with Spark's default 4 each retry fails 10 s
    # later (tests/cluster's test_unreachable_parameter_server_fails_the_job checks that bound).
    conf = {
        "spark.tensorspark.server.host": "127.0.0.2",
        "spark.tensorspark.server.bind": "127.0.0.1",
        "spark.tensorspark.ps.timeout": "3",
        "spark.task.maxFailures": "1",
    }
    run = yarn_cluster.submit(
        EXAMPLE,
        _mnist(yarn_data, "yarn_unreachable"),
        deploy_mode="cluster",
        name="tensorspark-yarn-unreachable",
        conf=conf,
        cwd=tmp_path,
    )
    assert run.returncode != 0
    assert run.app_id is not None
    report = yarn_cluster.wait_final(run.app_id)
    assert report["finalStatus"] == "FAILED", report
    assert "User application exited with status 1" in report["diagnostics"], report
    am = yarn_cluster.am_logs(run.app_id)
    driver_log = am["stdout"] + am["stderr"]
    [(_, port)] = LISTENING.findall(driver_log)
    assert (
        "tensorspark.errors.ParameterServerConnectionError: cannot reach the parameter server at "
        f"http://127.0.0.2:{port} within ps_timeout=3s (ConnectionRefusedError" in driver_log
    ), driver_log[-6000:]
    assert f"parameter server at 127.0.0.1:{port} stopped" in driver_log
    assert yarn_cluster.wait_no_containers() == []
