"""Cluster-wide settings from Spark conf: explicit argument > spark.tensorspark.* > default."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensorspark import conf as tsconf
from tensorspark.errors import ConfigurationError
from tensorspark.session import SparkSession
from tensorspark.training import Server, TrainingRun
from tensorspark.worker import WorkerConfig
from tests.unit.spark_conf import DictConf

DEFAULTS = {s.argument: s.default for s in tsconf.SETTINGS}


class _Context:
    """Stands in for a SparkContext: SparkSession.__init__ only reads its conf (its warm-up
    of the executors, which runs jobs, is turned off by conf: tests/spark/test_warmup.py)."""

    def __init__(self, values: dict[str, str]) -> None:
        self._conf = DictConf({"spark.tensorspark.warmup.enabled": "false", **values})

    def getConf(self) -> DictConf:  # noqa: N802 - SparkContext's name
        return self._conf

    def parallelize(self, *args: Any) -> None:
        raise AssertionError("the unit tests never start a Spark job")


def _worker_config(sess: SparkSession, url: str, num_epoch: int, shuffle: bool) -> WorkerConfig:
    """What the tasks of a run of ``sess`` would be told."""
    return TrainingRun(sess.sc, sess._host).worker_config(url, num_epoch, shuffle)


def _server_for(sess: SparkSession, params: dict[str, np.ndarray], num_workers: int) -> Server:
    """A started server of ``sess``, as a run takes it."""
    return sess._host.acquire(params, num_workers)


def _server_url(sess: SparkSession, server: Server) -> str:
    """The URL executors are told for ``server``."""
    return sess._host.url_for(server)


class _TF1Session:
    """Has what SparkSession checks for a TF1 session (a graph and run)."""

    graph = object()

    def run(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("not run in these tests")


def test_defaults_without_conf() -> None:
    out = tsconf.resolve({}, {})
    assert out == DEFAULTS
    assert out["server_port"] == 0
    assert out["ps_timeout"] == 60.0
    assert out["checkpoint_dir"] is None


def test_conf_over_default() -> None:
    out = tsconf.resolve(
        {},
        {
            "spark.tensorspark.server.host": "10.0.0.5",
            "spark.tensorspark.server.bind": "0.0.0.0",
            "spark.tensorspark.server.port": "41000-41010",
            "spark.tensorspark.ps.timeout": "7.5",
            "spark.tensorspark.checkpoint.dir": "hdfs://nn:8020/ckpt",
            "spark.tensorspark.checkpoint.interval": "30",
            "spark.tensorspark.checkpoint.keep": "5",
            "spark.tensorspark.ssl.certfile": "/etc/ts/cert.pem",
        },
    )
    assert out["server_host"] == "10.0.0.5"
    assert out["server_bind_host"] == "0.0.0.0"
    assert out["server_port"] == (41000, 41010)
    assert out["ps_timeout"] == 7.5
    assert out["checkpoint_dir"] == "hdfs://nn:8020/ckpt"
    assert out["checkpoint_interval"] == 30.0
    assert out["keep_checkpoints"] == 5
    assert out["ssl_certfile"] == "/etc/ts/cert.pem"
    assert out["ssl_keyfile"] is None


def test_explicit_over_conf() -> None:
    conf = {
        "spark.tensorspark.server.port": "41000",
        "spark.tensorspark.ps.timeout": "7.5",
        "spark.tensorspark.server.host": "10.0.0.5",
    }
    out = tsconf.resolve({"server_port": 5000, "ps_timeout": 2.0, "server_host": None}, conf)
    assert out["server_port"] == 5000
    assert out["ps_timeout"] == 2.0
    # None means "not given": the conf still applies.
    assert out["server_host"] == "10.0.0.5"


def test_explicit_value_wins_over_a_bad_conf_value() -> None:
    out = tsconf.resolve({"server_port": 5000}, {"spark.tensorspark.server.port": "not-a-port"})
    assert out["server_port"] == 5000


def test_single_port_and_port_zero() -> None:
    assert tsconf.resolve({}, {"spark.tensorspark.server.port": " 41000 "})["server_port"] == 41000
    assert tsconf.resolve({}, {"spark.tensorspark.server.port": "0"})["server_port"] == 0


@pytest.mark.parametrize("text", ["abc", "70000", "-1", "5-3", "0-10", "1-70000", "1-2-3", ""])
def test_bad_port(text: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        tsconf.resolve({}, {"spark.tensorspark.server.port": text})
    assert str(info.value) == (
        "spark.tensorspark.server.port must be a port (0-65535) or a range 'first-last'. "
        f"Received: {text.strip()!r}"
    )


@pytest.mark.parametrize("text", ["0", "-3", "soon", "nan-ish"])
def test_bad_timeouts(text: str) -> None:
    for key in ("spark.tensorspark.ps.timeout", "spark.tensorspark.checkpoint.interval"):
        with pytest.raises(ConfigurationError) as info:
            tsconf.resolve({}, {key: text})
        assert str(info.value) == f"{key} must be a positive number of seconds. Received: {text!r}"


@pytest.mark.parametrize("text", ["0", "-1", "2.5", "three"])
def test_bad_keep(text: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        tsconf.resolve({}, {"spark.tensorspark.checkpoint.keep": text})
    assert str(info.value) == (
        f"spark.tensorspark.checkpoint.keep must be a positive integer. Received: {text!r}"
    )


def test_secret_file(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("s3cr3t\n", encoding="utf-8")
    out = tsconf.resolve({}, {"spark.tensorspark.secret.file": str(path)})
    assert out["secret"] == "s3cr3t"
    assert (
        tsconf.resolve({"secret": "given"}, {"spark.tensorspark.secret.file": str(path)})["secret"]
        == "given"
    )


def test_missing_secret_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ConfigurationError) as info:
        tsconf.resolve({}, {"spark.tensorspark.secret.file": str(missing)})
    assert str(info.value) == (
        f"spark.tensorspark.secret.file: cannot read the secret file {str(missing)!r}: "
        "No such file or directory"
    )


def test_hdfs_dir_maps_to_checkpoint_dir() -> None:
    conf = {"spark.hdfs.dir": "hdfs://nn:8020/user/alice/"}
    assert (
        tsconf.resolve({}, conf, "mnist")["checkpoint_dir"]
        == "hdfs://nn:8020/user/alice/tensorspark/mnist"
    )
    assert (
        tsconf.resolve({}, conf)["checkpoint_dir"]
        == "hdfs://nn:8020/user/alice/tensorspark/default"
    )


def test_hdfs_dir_loses_to_the_argument_and_to_our_key() -> None:
    conf = {"spark.hdfs.dir": "hdfs://nn:8020/user/alice"}
    assert tsconf.resolve({"checkpoint_dir": "/tmp/ck"}, conf, "m")["checkpoint_dir"] == "/tmp/ck"
    ours = {**conf, "spark.tensorspark.checkpoint.dir": "hdfs://nn:8020/ck"}
    assert tsconf.resolve({}, ours, "m")["checkpoint_dir"] == "hdfs://nn:8020/ck"
    assert tsconf.resolve({}, {"spark.hdfs.dir": ""}, "m")["checkpoint_dir"] is None


def test_every_setting_is_in_the_documented_table() -> None:
    doc = tsconf.__doc__ or ""
    for setting in tsconf.SETTINGS:
        row = next((line for line in doc.splitlines() if line.startswith(setting.key + " ")), None)
        assert row is not None, setting.key
        assert setting.argument.split("_")[0] in row


def test_spark_session_reads_the_conf() -> None:
    sc = _Context(
        {
            "spark.driver.host": "driver.example",
            "spark.tensorspark.server.port": "41000-41010",
            "spark.tensorspark.ps.timeout": "9",
        }
    )
    sess = SparkSession(sc, _TF1Session())
    assert sess.server_host == "driver.example"
    assert sess.server_bind_host == "driver.example"
    assert sess.server_port == (41000, 41010)
    assert sess.ps_timeout == 9.0
    assert _worker_config(sess, "http://driver.example:41000", 1, False).ps_timeout == 9.0


def test_spark_session_arguments_win() -> None:
    sc = _Context(
        {
            "spark.driver.host": "driver.example",
            "spark.tensorspark.server.host": "ps.example",
            "spark.tensorspark.server.bind": "0.0.0.0",
            "spark.tensorspark.server.port": "41000",
            "spark.tensorspark.ps.timeout": "9",
        }
    )
    from_conf = SparkSession(sc, _TF1Session())
    assert (from_conf.server_host, from_conf.server_bind_host) == ("ps.example", "0.0.0.0")
    assert from_conf.server_port == 41000
    explicit = SparkSession(
        sc,
        _TF1Session(),
        server_host="10.1.1.1",
        server_bind_host="10.1.1.1",
        server_port=0,
        ps_timeout=3,
    )
    assert (explicit.server_host, explicit.server_bind_host) == ("10.1.1.1", "10.1.1.1")
    assert explicit.server_port == 0
    assert explicit.ps_timeout == 3.0


def test_spark_session_rejects_a_bad_conf_value() -> None:
    sc = _Context({"spark.driver.host": "127.0.0.1", "spark.tensorspark.ps.timeout": "0"})
    with pytest.raises(
        ConfigurationError, match=r"spark.tensorspark.ps.timeout must be a positive"
    ):
        SparkSession(sc, _TF1Session())


def test_spark_session_needs_a_host() -> None:
    with pytest.raises(
        ConfigurationError,
        match="set server_host=, spark.tensorspark.server.host or spark.driver.host",
    ):
        SparkSession(_Context({}), _TF1Session())


def test_server_binds_one_host_and_advertises_another() -> None:
    sc = _Context({"spark.driver.host": "127.0.0.1", "spark.tensorspark.server.bind": "127.0.0.1"})
    sess = SparkSession(sc, _TF1Session(), server_host="ts-driver.example")
    server = _server_for(sess, {"w": np.zeros(3, np.float32)}, 1)
    try:
        assert server.url == f"http://127.0.0.1:{server.port}"
        assert _server_url(sess, server) == f"http://ts-driver.example:{server.port}"
    finally:
        server.stop()
    assert not server.running


def test_spark_session_checkpoints_under_the_seeds_hdfs_dir(tmp_path: Path) -> None:
    sc = _Context({"spark.driver.host": "127.0.0.1", "spark.hdfs.dir": f"file://{tmp_path}"})
    sess = SparkSession(sc, _TF1Session(), name="mnist")
    assert sess.options["checkpoint_dir"] == f"file://{tmp_path}/tensorspark/mnist"
    assert sess.checkpoints is not None
    mine = tmp_path / "mine"
    explicit = SparkSession(sc, _TF1Session(), name="mnist", checkpoint_dir=str(mine))
    assert explicit.options["checkpoint_dir"] == str(mine)


class _SiteJVM:
    """Stands in for a driver JVM whose ``hdfs-site.xml`` sets the NameNode's address."""

    def __init__(self) -> None:
        self.reads = 0
        self.org = self  # jvm.org.apache.hadoop.conf.Configuration(False)
        self.apache = self.hadoop = self.conf = self

    def Configuration(self, load_defaults: bool) -> _SiteJVM:  # noqa: N802 - Hadoop's name
        return self

    def addResource(self, resource: str) -> None:  # noqa: N802 - Hadoop's name
        assert resource == "hdfs-site.xml"

    def get(self, key: str) -> str | None:
        self.reads += 1
        return "namenode.example:9870" if key == "dfs.namenode.http-address" else None


def test_a_conf_snapshot_reads_the_site_files_lazily_and_once() -> None:
    sc = _Context({"spark.driver.host": "driver.example"})
    sc._jvm = _SiteJVM()  # type: ignore[attr-defined]
    conf = tsconf.ConfSnapshot.take(sc)
    assert conf["spark.driver.host"] == "driver.example"
    assert sc._jvm.reads == 0  # type: ignore[attr-defined]
    assert conf.get("dfs.namenode.http-address") == "namenode.example:9870"
    assert dict(conf)["dfs.namenode.http-address"] == "namenode.example:9870"
    assert sc._jvm.reads == 1  # type: ignore[attr-defined]
    with pytest.raises(KeyError):
        conf["spark.not.set"]


def test_a_conf_snapshot_keeps_the_spark_setting_over_the_site_file() -> None:
    sc = _Context({"spark.hadoop.dfs.namenode.http-address": "nn.example:50070"})
    sc._jvm = _SiteJVM()  # type: ignore[attr-defined]
    conf = tsconf.ConfSnapshot.take(sc)
    assert "dfs.namenode.http-address" not in conf
    assert sc._jvm.reads == 0  # type: ignore[attr-defined]


def test_a_pickled_conf_snapshot_carries_the_values_not_the_context() -> None:
    import pickle

    sc = _Context({"spark.master": "local[2]"})
    sc._jvm = _SiteJVM()  # type: ignore[attr-defined]
    sc.master = "local[2]"  # type: ignore[attr-defined]
    conf = pickle.loads(pickle.dumps(tsconf.ConfSnapshot.take(sc)))
    assert conf.master == "local[2]"
    assert conf["dfs.namenode.http-address"] == "namenode.example:9870"


def test_gpu_amounts_refuse_a_value_that_is_not_a_number() -> None:
    sc = _Context({"spark.executor.resource.gpu.amount": "two"})
    message = r"spark.executor.resource.gpu.amount must be a number of GPUs. Received: 'two'"
    with pytest.raises(ConfigurationError, match=message):
        tsconf.gpu_amounts(sc)
    assert tsconf.GPU_AMOUNT_KEYS == (tsconf.TASK_GPU_KEY, tsconf.EXECUTOR_GPU_KEY)


@pytest.mark.parametrize("text", ["nan", "inf"])
def test_a_timeout_must_be_finite(text: str) -> None:
    key = "spark.tensorspark.ps.timeout"
    with pytest.raises(ConfigurationError) as info:
        tsconf.resolve({}, {key: text})
    assert str(info.value) == f"{key} must be a positive number of seconds. Received: {text!r}"


@pytest.mark.parametrize(
    ("argument", "value", "message"),
    [
        ("ps_timeout", 0, r"`ps_timeout` must be a positive number of seconds or None"),
        ("checkpoint_interval", -1.0, r"Received: checkpoint_interval=-1.0"),
        ("keep_checkpoints", 2.5, r"Received: keep_checkpoints=2.5"),
        ("max_body_bytes", "big", r"Received: max_body_bytes='big'"),
        ("hdfs_auth", "basic", r"hdfs_auth must be one of .*Received: hdfs_auth='basic'"),
    ],
)
def test_spark_session_checks_its_explicit_arguments(
    argument: str, value: object, message: str
) -> None:
    sc = _Context({"spark.driver.host": "127.0.0.1"})
    with pytest.raises(ConfigurationError, match=message):
        SparkSession(sc, _TF1Session(), **{argument: value})  # type: ignore[arg-type]


def test_the_shard_restart_window_comes_from_the_conf() -> None:
    """``spark.tensorspark.ps.shardRestartWindow`` reaches the server's settings (600 s
    when unset); anything but a positive number of seconds is refused, naming the key."""
    host = {"spark.driver.host": "driver.example"}
    plain = SparkSession(_Context(host), _TF1Session())
    assert plain._host.settings.server.shard_restart_window == 600.0
    sc = _Context({**host, "spark.tensorspark.ps.shardRestartWindow": "3600"})
    assert SparkSession(sc, _TF1Session())._host.settings.server.shard_restart_window == 3600.0
    for bad in ("0", "-5", "inf", "an hour"):
        sc = _Context({**host, "spark.tensorspark.ps.shardRestartWindow": bad})
        with pytest.raises(ConfigurationError, match="shardRestartWindow must be a positive"):
            SparkSession(sc, _TF1Session())
