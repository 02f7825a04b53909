"""Files as input, without Spark: listings, shards, the three formats and their errors.

TFRecord files are checked against TensorFlow's own writer and reader, both ways.
"""

from __future__ import annotations

import gzip
import itertools
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tensorspark.errors import ConfigurationError
from tensorspark.fileio import example
from tensorspark.fileio.listing import list_files
from tensorspark.fileio.plan import FilePlan, plan_files
from tensorspark.fileio.shards import Shard, balance
from tensorspark.fileio.source import files
from tensorspark.fileio.spec import Feed
from tensorspark.fileio.stream import FileEpochs
from tensorspark.fileio.tfrecord import RecordWriter, frame, records
from tensorspark.partition import Passes
from tensorspark.storage.options import StorageOptions

pytestmark = pytest.mark.unit

FEED = Feed((6,), "float32", (), "int64")


def _rows(n: int, width: int = 6, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    ids = np.arange(start, start + n)
    return ((ids[:, None] * 10 + np.arange(width)) % 256).astype(np.uint8), ids % 7


def _parquet(
    path: Path, n: int, row_group: int, start: int = 0, binary: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    x, y = _rows(n, start=start)
    column = (
        pa.array([r.tobytes() for r in x], pa.binary())
        if binary
        else pa.array(list(x.astype(np.float32)), pa.list_(pa.float32()))
    )
    pq.write_table(pa.table({"x": column, "y": y}), path, row_group_size=row_group)
    return x, y


def _tfrecord(path: Path, x: np.ndarray, y: np.ndarray, gz: bool = False) -> None:
    with open(path, "wb") as out:
        writer = RecordWriter(out, gzip=gz)
        for xi, yi in zip(x, y):
            writer.write(
                example.encode_example(
                    [
                        ("x", example.encode_feature("bytes_list", xi.tobytes())),
                        ("y", example.encode_feature("int64_list", [yi])),
                    ]
                )
            )
        writer.close()


def _read_all(plan: FilePlan) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for p, shards in enumerate(plan.partitions):
        with FileEpochs(plan.spec, shards, Passes(batch_size=4, num_epoch=1), partition=p) as data:
            for _, batches in data.epochs():
                for _, batch, _ in batches:
                    xs.append(batch[0])
                    ys.append(batch[1])
    return np.concatenate(xs), np.concatenate(ys)


# ---------------------------------------------------------------------- shards


@pytest.mark.parametrize(
    "sizes", [[5, 1, 1, 1, 9, 2], [3] * 7, [1, 100], [4, 4, 4, 4, 4, 4, 4, 4, 40]]
)
@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_balance_cuts_contiguous_runs_with_the_smallest_largest_run(
    sizes: list[int], k: int
) -> None:
    shards = [Shard(file=i, nbytes=s) for i, s in enumerate(sizes)]
    runs = balance(shards, k)
    assert [s for run in runs for s in run] == shards
    assert len(runs) == min(k, len(sizes)) and all(runs)
    best = min(
        max(sum(sizes[a:b]) for a, b in zip((0, *cuts), (*cuts, len(sizes))))
        for cuts in itertools.combinations(range(1, len(sizes)), len(runs) - 1)
    )
    assert max(sum(s.nbytes for s in run) for run in runs) == best


# ---------------------------------------------------------------------- listing


def test_listing_expands_folders_and_globs_and_leaves_out_hidden_names(tmp_path: Path) -> None:
    for name in (
        "a/p-1.parquet",
        "a/p-2.parquet",
        "a/_SUCCESS",
        "a/.p-1.crc",
        "a/sub/p-3.parquet",
        "b/p-4.parquet",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x" * len(name))
    options = StorageOptions()
    folder = list_files((str(tmp_path / "a"),), options)
    assert [f.location.rsplit("/", 2)[-2:] for f in folder] == [
        ["a", "p-1.parquet"],
        ["a", "p-2.parquet"],
        ["sub", "p-3.parquet"],
    ]
    assert folder[0].size == len("a/p-1.parquet") and folder[0].location.startswith("file:///")
    globbed = list_files((f"file://{tmp_path}/*/p-[14].parquet",), options)
    assert [f.location.rsplit("/", 1)[-1] for f in globbed] == ["p-1.parquet", "p-4.parquet"]
    with pytest.raises(
        ConfigurationError, match=r"matches no file or folder.*Received: path='.*/c/\*'"
    ):
        list_files((str(tmp_path / "c" / "*"),), options)


def test_files_checks_its_arguments_at_once() -> None:
    with pytest.raises(ConfigurationError, match=r"`features` must name the parquet column"):
        files("/data/a.parquet")
    with pytest.raises(ConfigurationError, match=r"`format` must be one of"):
        files("/data/a", "x", format="csv")
    with pytest.raises(ConfigurationError, match=r"idx files have none"):
        files("/data/", "pixels", format="idx")
    with pytest.raises(ConfigurationError, match=r"`feature_dtype` must be a numpy number dtype"):
        files("/data/a.parquet", "x", feature_dtype="text")
    with pytest.raises(ConfigurationError, match=r"`shuffle_buffer` must be an integer >= 0"):
        files("/data/a.parquet", "x", shuffle_buffer=-1)
    assert files("/d/a.tfrecord.gz", "x").format == "tfrecord"


# ---------------------------------------------------------------------- parquet


def test_parquet_row_groups_are_shards_read_in_order(tmp_path: Path) -> None:
    x1, y1 = _parquet(tmp_path / "a.parquet", 10, 3)
    x2, y2 = _parquet(tmp_path / "b.parquet", 7, 7, start=10)
    plan = plan_files({}, files(str(tmp_path), "x", "y"), FEED, default_partitions=3)
    assert plan.rows == 17 and plan.num_partitions == 3
    assert [s.count for p in plan.partitions for s in p] == [3, 3, 3, 1, 7]
    x, y = _read_all(plan)
    np.testing.assert_array_equal(x, np.concatenate([x1, x2]).astype(np.float32))
    np.testing.assert_array_equal(y, np.concatenate([y1, y2]))


def test_parquet_errors_name_the_column_the_files_and_the_row(tmp_path: Path) -> None:
    _parquet(tmp_path / "a.parquet", 4, 4)
    with pytest.raises(
        ConfigurationError, match=r"`label` must name a column.*has \['x', 'y'\].*label='z'"
    ):
        plan_files({}, files(str(tmp_path / "a.parquet"), "x", "z"), FEED, default_partitions=1)
    with pytest.raises(ConfigurationError, match=r"`label` must name the column.*label=None"):
        plan_files({}, files(str(tmp_path / "a.parquet"), "x"), FEED, default_partitions=1)
    _parquet(tmp_path / "b.parquet", 4, 4, binary=False)
    with pytest.raises(
        ConfigurationError,
        match=r"schemas differ: .*a\.parquet has \{x: binary.*b\.parquet has \{x: list<",
    ):
        plan_files({}, files(str(tmp_path), "x", "y"), FEED, default_partitions=1)
    with pytest.raises(
        ConfigurationError, match=r"`feature_dtype` says how the bytes of a binary column"
    ):
        plan_files(
            {},
            files(str(tmp_path / "b.parquet"), "x", "y", feature_dtype="uint8"),
            FEED,
            default_partitions=1,
        )
    # A row of another length: found as the task reads, named by file, row group and row.
    rows = [bytes(6)] * 5 + [bytes(5)]
    pq.write_table(
        pa.table({"x": pa.array(rows, pa.binary()), "y": np.zeros(6, np.int64)}),
        tmp_path / "c.parquet",
    )
    plan = plan_files({}, files(str(tmp_path / "c.parquet"), "x", "y"), FEED, default_partitions=1)
    with pytest.raises(
        ConfigurationError,
        match=r"Features of the wrong length: Parquet file://.*c\.parquet \(row group 0\), "
        r"row 5 holds 5 feature values; the model takes 6",
    ):
        _read_all(plan)


# ---------------------------------------------------------------------- tfrecord


def test_tfrecord_round_trips_with_tensorflows_reader_and_writer(tmp_path: Path) -> None:
    tf = pytest.importorskip("tensorflow")
    x, y = _rows(9)
    for gz in (False, True):
        path = tmp_path / f"ours{'.gz' if gz else ''}.tfrecord"
        _tfrecord(path, x, y, gz)
        spec = {
            "x": tf.io.FixedLenFeature([], tf.string),
            "y": tf.io.FixedLenFeature([1], tf.int64),
        }
        data = tf.data.TFRecordDataset(str(path), compression_type="GZIP" if gz else "")
        parsed = tf.io.parse_example(next(iter(data.batch(100))), spec)
        np.testing.assert_array_equal(tf.io.decode_raw(parsed["x"], tf.uint8).numpy(), x)
        np.testing.assert_array_equal(parsed["y"].numpy()[:, 0], y)
    with tf.io.TFRecordWriter(str(tmp_path / "tf.tfrecord"), options="GZIP") as writer:
        for xi, yi in zip(x, y):
            feature = {
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=xi.astype(float))),
                "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[yi])),
            }
            writer.write(
                tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
            )
    plan = plan_files(
        {},
        files(str(tmp_path / "tf.tfrecord"), "x", "y", compression="GZIP"),
        FEED,
        default_partitions=1,
    )
    got_x, got_y = _read_all(plan)
    np.testing.assert_array_equal(got_x, x.astype(np.float32))
    np.testing.assert_array_equal(got_y, y)


def test_tfrecord_corruption_names_the_file_and_the_record_offset(tmp_path: Path) -> None:
    x, y = _rows(3)
    _tfrecord(tmp_path / "a.tfrecord", x, y)
    data = (tmp_path / "a.tfrecord").read_bytes()
    second = 12 + struct.unpack("<Q", data[:8])[0] + 4
    damaged = bytearray(data)
    damaged[second + 20] ^= 0xFF
    (tmp_path / "bad.tfrecord").write_bytes(bytes(damaged))
    (tmp_path / "cut.tfrecord").write_bytes(data[:-3])
    for name, message in (
        (
            "bad",
            r"TFRecord file://.*bad\.tfrecord is corrupt: "
            rf"bad CRC of the record at offset {second}$",
        ),
        (
            "cut",
            r"TFRecord file://.*cut\.tfrecord is truncated: "
            rf"the record at offset {2 * second} needs {second} bytes, "
            rf"the file has {second - 3} left",
        ),
    ):
        plan = plan_files(
            {}, files(str(tmp_path / f"{name}.tfrecord"), "x", "y"), FEED, default_partitions=1
        )
        with pytest.raises(ConfigurationError, match=message):
            _read_all(plan)
    assert [
        offset for offset, _ in records([data[i : i + 5] for i in range(0, len(data), 5)], "f")
    ] == [0, second, 2 * second]
    assert list(records([frame(b"")], "f")) == [(0, b"")]


def test_tfrecord_features_of_the_wrong_length_name_the_record(tmp_path: Path) -> None:
    x, y = _rows(3)
    x = [x[0], x[1], np.zeros(4, np.uint8)]
    _tfrecord(tmp_path / "a.tfrecord", x, y)  # type: ignore[arg-type]
    plan = plan_files({}, files(str(tmp_path / "a.tfrecord"), "x", "y"), FEED, default_partitions=1)
    with pytest.raises(
        ConfigurationError,
        match=r"Features of the wrong length: TFRecord .*a\.tfrecord, "
        r"record at offset \d+ holds 4 feature values; the model takes 6",
    ):
        _read_all(plan)
    with pytest.raises(ConfigurationError, match=r"has no feature 'z'; it has \['x', 'y'\]"):
        _read_all(
            plan_files(
                {}, files(str(tmp_path / "a.tfrecord"), "z", "y"), FEED, default_partitions=1
            )
        )


# ---------------------------------------------------------------------- idx


def _idx(path: Path, array: np.ndarray, gz: bool) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if gz else data)


@pytest.mark.parametrize("gz", [False, True])
def test_idx_pairs_are_read_by_record_ranges(
    tmp_path: Path, gz: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensorspark.fileio import idx

    monkeypatch.setattr(idx, "SHARD_BYTES", 60)
    monkeypatch.setattr(idx, "GZ_SHARD_BYTES", 60)
    suffix = ".gz" if gz else ""
    x, y = _rows(23)
    _idx(tmp_path / f"train-images-idx2-ubyte{suffix}", x, gz)
    _idx(tmp_path / f"train-labels-idx1-ubyte{suffix}", y, gz)
    _idx(tmp_path / f"t10k-images-idx2-ubyte{suffix}", x[:3], gz)
    _idx(tmp_path / f"t10k-labels-idx1-ubyte{suffix}", y[:3], gz)
    plan = plan_files({}, files(str(tmp_path), format="idx"), FEED, default_partitions=2)
    assert plan.rows == 23 and [s.count for p in plan.partitions for s in p] == [10, 10, 3]
    got_x, got_y = _read_all(plan)
    np.testing.assert_array_equal(got_x, x.astype(np.float32))
    np.testing.assert_array_equal(got_y, y)
    test = plan_files(
        {},
        files(str(tmp_path), format="idx", split="t10k", one_hot=7),
        Feed((6,), "float32", (7,), "float32"),
        default_partitions=1,
    )
    _, onehot = _read_all(test)
    np.testing.assert_array_equal(onehot, np.eye(7, dtype=np.float32)[y[:3]])


def test_idx_header_mismatches_are_refused_on_the_driver(tmp_path: Path) -> None:
    x, y = _rows(5)
    _idx(tmp_path / "train-images-idx2-ubyte", x, False)
    _idx(tmp_path / "train-labels-idx1-ubyte", y[:4], False)
    with pytest.raises(
        ConfigurationError,
        match=r"idx header mismatch: .*train-images-idx2-ubyte declares 5 records, "
        r"its labels file .*train-labels-idx1-ubyte declares 4",
    ):
        plan_files({}, files(str(tmp_path), format="idx"), FEED, default_partitions=1)
    with pytest.raises(
        ConfigurationError,
        match=r"Features of the wrong length: idx file .* holds records of shape \[6\] "
        r"\(6 values\); the model takes 784",
    ):
        plan_files(
            {}, files(str(tmp_path), format="idx"), Feed((784,), "float32"), default_partitions=1
        )
    (tmp_path / "train-images-idx2-ubyte").write_bytes(
        (tmp_path / "train-images-idx2-ubyte").read_bytes()[:-1]
    )
    with pytest.raises(
        ConfigurationError,
        match=r"does not hold what its header declares: shape \(5, 6\) of uint8 needs 42 bytes, "
        r"the file has 41",
    ):
        plan_files(
            {}, files(str(tmp_path), format="idx"), Feed((6,), "float32"), default_partitions=1
        )


# ---------------------------------------------------------------------- epochs


def test_every_epoch_reads_every_record_once_in_a_new_seeded_order(tmp_path: Path) -> None:
    for i in range(4):
        ids = np.arange(50 * i, 50 * i + 50)
        pq.write_table(
            pa.table({"x": pa.array([bytes(6)] * 50, pa.binary()), "y": ids}),
            tmp_path / f"p{i}.parquet",
            row_group_size=10,
        )
    plan = plan_files(
        {}, files(str(tmp_path), "x", "y", shuffle_buffer=16), FEED, default_partitions=1
    )
    (shards,) = plan.partitions

    def orders(seed: int) -> list[list[int]]:
        out = []
        with FileEpochs(
            plan.spec, shards, Passes(batch_size=8, num_epoch=3, shuffle=True, seed=seed)
        ) as data:
            for _, batches in data.epochs():
                out.append([int(v) for _, batch, _ in batches for v in batch[1]])
        return out

    first = orders(seed=5)
    assert all(sorted(epoch) == list(range(200)) for epoch in first)
    assert len({tuple(epoch) for epoch in first}) == 3
    assert orders(seed=5) == first  # what a retried task reads again
    assert orders(seed=6) != first
