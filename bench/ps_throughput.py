"""Parameter-server throughput: push+pull of real models by concurrent client processes.

For models of 10k, 1M and 25M float32 parameters and 1, 2, 4, 8 client processes on
127.0.0.1, each client pushes a delta and gets the global model back in the same round
trip (the worker's hot path) for a few seconds. Measured in the same run, for scale:

* memcpy: copying the model's bytes in memory (numpy, one process),
* loopback TCP: one process streaming the model's bytes to another over a socket pair,
* body digest: GMAC (AES-256-GCM's tag, what :mod:`tensorspark.ps.auth` uses) against
  ``hashlib.sha256``, ``hashlib.blake2b`` and BLAKE3 (when installed) over 100 MB,
* authentication on and off (at 1M parameters by default): an unsigned and a signed
  server run side by side, and the same warm client processes push to one, then the
  other, in ``--auth-pairs`` pairs of ``--auth-seconds`` windows (ABBA order); the cost
  is the median over pairs of ``1 - signed/unsigned``. On a shared machine whose speed
  drifts by 10-20 % from one minute to the next, separate runs of each (a fresh server
  and fresh clients per run, as this script did before) could not tell 5 % from 12 %.

* sharded servers (``--shards``, ``--shard-sizes``, ``--compressions``): one client
  pushing and pulling through 1, 2 and 4 shard processes, float32 and compressed, each
  row next to a loopback-TCP measurement taken just before it, twice in ABBA order; and
  for every measurement the server's CPU seconds per applied update (its process and
  its shard processes) and the bytes per update on the wire (``bench/ps_capacity.py``
  turns those into workers per driver).

Throughput counts the bytes of both directions (``2 x model bytes`` per update), the
same bytes the TCP baseline streams (compressed, fewer cross the wire: ``wire MB/s``).
Prints a table and writes JSON::

    .venv/bin/python bench/ps_throughput.py --seconds 3 --out bench-results/ps_throughput.json
    .venv/bin/python bench/ps_throughput.py --sizes "" --shards 1,2,4 \
        --compressions none,bf16,int8 \
        --out bench/results/ps_throughput_shards.json      # the sharded rows alone

The machine is shared: keep ``--seconds`` small. Targets (from the issue): 25M push+pull
>= 50% of loopback TCP; 10k params >= 2,000 updates/s with 8 clients; authentication
costs <= 10% at 1M params; 25M through one shard >= 0.6x TCP, through four >= 1.0x.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import os
import platform
import queue
import resource
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tensorspark.ps.client import ParameterClient  # noqa: E402
from tensorspark.ps.compression import ErrorFeedback  # noqa: E402
from tensorspark.ps.fanout import ShardedClient  # noqa: E402
from tensorspark.ps.layout import Layout  # noqa: E402
from tensorspark.ps.server import ParameterServer  # noqa: E402
from tensorspark.ps.shards import ShardedServer  # noqa: E402

SIZES = {"10k": 10_000, "1M": 1_000_000, "25M": 25_000_000}
MB = 1e6
_WARMUP_PUSHES = 3  # per client, before the clock starts


def _model(n: int) -> dict[str, np.ndarray]:
    return {"w": np.zeros(n, np.float32)}


def _meta(partition: int, seq: int, base_version: int = 0) -> dict[str, Any]:
    """A push's metadata (one epoch, one sample: the server only counts them here).

    ``base_version`` is the version the client last pulled, as a worker sends it
    (:mod:`tensorspark.worker`): the staleness the server sees, and so the scale DynSGD
    applies, are those of real workers (0 for one client, about ``clients - 1`` for more).
    """
    return {
        "partition": partition,
        "epoch": 0,
        "seq": seq,
        "attempt": 0,
        "samples": 1,
        "base_version": base_version,
    }


def _collect(out: Any, procs: list[Any], count: int, deadline: float) -> list[Any]:
    """``count`` results from the client processes' queue; fails fast when one dies."""
    rows: list[Any] = []
    while len(rows) < count:
        try:
            rows.append(out.get(timeout=5))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(
                    f"client processes failed (exit codes {dead}) or timed out"
                ) from None
    return rows


def _client(
    urls: list[str],
    layout: dict[str, Any] | None,
    n: int,
    partition: int,
    seconds: float,
    secret: bytes | None,
    codec: str | None,
    start: Any,
    out: Any,
) -> None:
    """One client process: push+pull in a loop until ``seconds`` pass. With a codec, each
    push compresses the delta afresh (error feedback), as a worker does."""
    delta = {"w": np.full(n, 1e-6, np.float32)}
    feedback = None if codec is None else ErrorFeedback(codec)
    options: dict[str, Any] = dict(
        secret=secret, timeout=120, ps_timeout=30, recycle_responses=True
    )
    client: Any = (
        ParameterClient(urls[0], **options)
        if layout is None
        else ShardedClient(urls, Layout.from_json(layout), **options)
    )
    with client:
        client.join(partition, 0)
        seq = version = 0
        for _ in range(_WARMUP_PUSHES):  # steady state: buffers allocated, pages mapped
            version = client.push(
                delta if feedback is None else feedback.encode(delta),
                _meta(partition, seq, version),
            ).version
            seq += 1
        out.put({"ready": partition})
        if not start.wait(300):
            raise RuntimeError("the measurement never started")
        t0, cpu0 = time.perf_counter(), _cpu_seconds([])[0]
        warm = seq
        lat = []
        while time.perf_counter() - t0 < seconds:
            t = time.perf_counter()
            result = client.push(
                delta if feedback is None else feedback.encode(delta),
                _meta(partition, seq, version),
            )
            lat.append(time.perf_counter() - t)
            if result.status != "applied":
                raise RuntimeError(f"push answered {result.status}")
            seq, version = seq + 1, result.version
        cpu = _cpu_seconds([])[0] - cpu0
        out.put(
            {
                "partition": partition,
                "updates": seq - warm,
                "seconds": time.perf_counter() - t0,
                "lat": lat,
                "cpu_s": cpu,
            }
        )


def _written(pids: list[int]) -> int:
    """Bytes ``pids`` have passed to write calls so far (``wchar``: their files; socket
    sends are not write calls, so the answers are not in it)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/io") as f:
            total += int(next(x for x in f if x.startswith("wchar:")).split()[1])
    return total


def _cpu_seconds(pids: list[int]) -> list[float]:
    """User + system CPU seconds so far of this process (all threads), then of each of ``pids``."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out = [usage.ru_utime + usage.ru_stime]
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out.append((int(fields[11]) + int(fields[12])) / tick)  # utime, stime
    return out


def measure_ps(
    n: int,
    clients: int,
    seconds: float,
    authenticate: bool,
    shards: int = 1,
    compression: str | None = None,
    shard_restarts: int | None = None,
) -> dict[str, Any]:
    """Push+pull of an ``n``-parameter model by ``clients`` processes for ``seconds``.

    Besides throughput, measures the server's CPU seconds per applied update: this
    process's (where a one-shard server runs, in a thread; its main thread only waits)
    plus every shard process's, over the measured window; the bytes per update on the
    wire (the server's counters, headers included); and, with shards, the bytes the shard
    processes wrote per update (``/proc/<pid>/io``'s ``wchar``: their journals, with
    ``shard_restarts`` > 0, the server's default; ``shard_restarts=0`` keeps none).
    """
    ctx = mp.get_context("spawn")
    server: Any = (
        ParameterServer(_model(n), authenticate=authenticate, compression=compression)
        if shards == 1
        else ShardedServer(
            _model(n),
            shards=shards,
            authenticate=authenticate,
            compression=compression,
            **({} if shard_restarts is None else {"shard_restarts": shard_restarts}),
        )
    )
    with server:
        urls = [server.url] if shards == 1 else server.urls
        layout = None if shards == 1 else server.layout.to_json()
        pids = [] if shards == 1 else [int(p) for p in server.pids if p is not None]
        secret = server.client_options().get("secret")
        start = ctx.Event()
        out = ctx.Queue()
        procs = [
            ctx.Process(
                target=_client, args=(urls, layout, n, p, seconds, secret, compression, start, out)
            )
            for p in range(clients)
        ]
        for p in procs:
            p.start()
        _collect(out, procs, clients, time.monotonic() + 300)  # every client warmed up
        before, cpu0, wrote0 = server.status(), _cpu_seconds(pids), _written(pids)
        start.set()  # the window starts
        rows = _collect(out, procs, clients, time.monotonic() + seconds + 300)
        cpu1, wrote1, after = _cpu_seconds(pids), _written(pids), server.status()
        for p in procs:
            p.join(60)
        applied = server.status()["applied_pushes"]
    updates = sum(r["updates"] for r in rows)
    elapsed = max(r["seconds"] for r in rows)
    lat = np.concatenate([np.asarray(r["lat"]) for r in rows]) * 1000
    if applied != updates + clients * _WARMUP_PUSHES:
        raise RuntimeError(f"server applied {applied} pushes, clients sent {updates} (+ warm-up)")
    window = max(1, after["applied_pushes"] - before["applied_pushes"])
    return {
        "params": n,
        "clients": clients,
        "auth": authenticate,
        "shards": shards,
        "compression": compression,
        "updates": updates,
        "updates_per_s": updates / elapsed,
        "mb_per_s": updates * 2 * n * 4 / elapsed / MB,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "server_cpu_s_per_update": (sum(cpu1) - sum(cpu0)) / window,
        "client_cpu_s_per_update": sum(r["cpu_s"] for r in rows) / max(1, updates),
        # per process (this one, then each shard): the busiest bounds how fast its loop goes
        "process_cpu_s_per_update": [(b - a) / window for a, b in zip(cpu0, cpu1, strict=True)],
        "received_bytes_per_update": (after["bytes_received"] - before["bytes_received"]) / window,
        "sent_bytes_per_update": (after["bytes_sent"] - before["bytes_sent"]) / window,
        "shard_written_bytes_per_update": (wrote1 - wrote0) / window,
    }


def _paired_client(
    urls: list[str],
    secret: bytes,
    n: int,
    partition: int,
    windows: list[tuple[int, float]],
    sync: Any,
    out: Any,
) -> None:
    """One client process of the interleaved auth comparison: for each ``(server, seconds)``
    window, wait for every client at the barrier, then push+pull against that server."""
    delta = {"w": np.full(n, 1e-6, np.float32)}
    clients = [
        ParameterClient(
            url,
            secret=secret if i == 1 else None,
            timeout=120,
            ps_timeout=30,
            recycle_responses=True,
        )
        for i, url in enumerate(urls)
    ]
    seqs = [0, 0]
    try:
        for which, client in enumerate(clients):
            client.join(partition, 0)
            for _ in range(_WARMUP_PUSHES):
                client.push(delta, _meta(partition, seqs[which]))
                seqs[which] += 1
        for window, (which, seconds) in enumerate(windows):
            sync.wait(120)
            client, done, t0 = clients[which], 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                if client.push(delta, _meta(partition, seqs[which])).status != "applied":
                    raise RuntimeError("push not applied")
                seqs[which] += 1
                done += 1
            out.put((window, partition, done, time.perf_counter() - t0))
    finally:
        for client in clients:
            client.close()


def measure_auth_interleaved(
    n: int, clients: int, seconds: float, pairs: int
) -> list[dict[str, float]]:
    """Authentication cost with the drift of a shared machine cancelled out.

    Two servers run side by side, one unsigned and one signed, and the same warm client
    processes push to them in turns of ``seconds`` (ABBA order), all clients on the same
    server at a time. Returns one ``{"unsigned", "signed"}`` pair of updates/s per pair of
    adjacent windows.
    """
    ctx = mp.get_context("spawn")
    order = [w for i in range(pairs) for w in ((0, 1) if i % 2 == 0 else (1, 0))]
    windows = [(which, seconds) for which in order]
    with (
        ParameterServer(_model(n), authenticate=False) as plain,
        ParameterServer(_model(n)) as signed,
    ):
        secret = signed.client_options()["secret"]
        sync = ctx.Barrier(clients)
        out = ctx.Queue()
        procs = [
            ctx.Process(
                target=_paired_client,
                args=([plain.url, signed.url], secret, n, p, windows, sync, out),
            )
            for p in range(clients)
        ]
        for proc in procs:
            proc.start()
        rows: list[Any] = []
        try:
            rows = _collect(
                out,
                procs,
                clients * len(windows),
                time.monotonic() + len(windows) * (seconds + 30) + 120,
            )
        finally:  # after a failure the other clients would wait at the barrier: stop them
            complete = bool(rows)
            for proc in procs:
                proc.join(60 if complete else 0)
                if proc.is_alive():
                    proc.terminate()
                    proc.join(10)
        got: dict[int, list[tuple[int, float]]] = {}
        for window, _, done, elapsed in rows:
            got.setdefault(window, []).append((done, elapsed))
        sent = [
            sum(d for w, per in got.items() if order[w] == which for d, _ in per)
            for which in (0, 1)
        ]
        applied = [plain.status()["applied_pushes"], signed.status()["applied_pushes"]]
        if applied != [s + clients * _WARMUP_PUSHES for s in sent]:
            raise RuntimeError(f"servers applied {applied} pushes, clients sent {sent} (+ warm-up)")
    rates = [sum(d for d, _ in got[w]) / max(e for _, e in got[w]) for w in range(len(windows))]
    result = []
    for i in range(pairs):
        a, b = rates[2 * i], rates[2 * i + 1]
        unsigned, signed_rate = (a, b) if order[2 * i] == 0 else (b, a)
        result.append({"unsigned": unsigned, "signed": signed_rate})
    return result


def measure_memcpy(nbytes: int, seconds: float = 1.0) -> float:
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds or reps < 3:
        np.copyto(dst, src)
        reps += 1
    return reps * nbytes / (time.perf_counter() - t0) / MB


def _tcp_sender(port: int, nbytes: int, seconds: float) -> None:
    data = np.ones(nbytes, np.uint8)
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            sock.sendall(memoryview(data))
        sock.shutdown(socket.SHUT_WR)


def measure_tcp(nbytes: int, seconds: float) -> float:
    """Raw loopback TCP: another process streams ``nbytes`` messages; we receive them."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(60)
        proc = mp.get_context("spawn").Process(
            target=_tcp_sender, args=(listener.getsockname()[1], nbytes, seconds)
        )
        proc.start()
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(60)
            buf = bytearray(min(nbytes, 1 << 20))
            view = memoryview(buf)
            got, t0 = 0, None
            while True:
                n = conn.recv_into(view)
                if t0 is None:
                    t0 = time.perf_counter()
                if not n:
                    break
                got += n
            elapsed = time.perf_counter() - (t0 or time.perf_counter())
        proc.join(60)
    return got / elapsed / MB


def measure_hashes(nbytes: int = 100 * 1024 * 1024) -> dict[str, float]:
    from tensorspark.ps import auth

    data = np.ones(nbytes, np.uint8)
    view = memoryview(data)
    out = {}
    makers: dict[str, Any] = {
        "sha256": lambda: hashlib.sha256(),
        "blake2b": lambda: hashlib.blake2b(),
    }
    try:
        import blake3

        makers["blake3"] = lambda: blake3.blake3()
    except ImportError:  # not a dependency; compared when installed
        pass
    key = auth.body_key(b"k" * 32)
    for name in ("gmac", *makers):
        t0 = time.perf_counter()
        if name == "gmac":
            signing = auth.Signing(b"k" * 32, key, "POST", "/push", nbytes, None)
            for i in range(0, nbytes, 1 << 20):
                signing.update(view[i : i + (1 << 20)])
            signing.trailer()
        else:
            h = makers[name]()
            for i in range(0, nbytes, 1 << 20):
                h.update(view[i : i + (1 << 20)])
            h.digest()
        out[name] = nbytes / (time.perf_counter() - t0) / MB
    return out


def _run_row(
    size: str, c: int, seconds: float, authenticate: bool, baselines: dict[str, Any]
) -> dict[str, Any]:
    row = measure_ps(SIZES[size], c, seconds, authenticate)
    row["size"] = size
    row["vs_tcp"] = row["mb_per_s"] / baselines[size]["tcp_mb_per_s"]
    row["vs_memcpy"] = row["mb_per_s"] / baselines[size]["memcpy_mb_per_s"]
    print(
        f"{size:>6} {c:>7} {'on' if authenticate else 'off':>5} "
        f"{row['updates_per_s']:>10.0f} {row['mb_per_s']:>8.0f} "
        f"{row['vs_tcp']:>7.2f} {row['vs_memcpy']:>9.2f} "
        f"{row['p50_ms']:>8.2f} {row['p99_ms']:>8.2f}",
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", default="10k,1M,25M", help="comma-separated of " + ",".join(SIZES)
    )
    parser.add_argument("--clients", default="1,2,4,8")
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument(
        "--auth-size", default="1M", help="model size for the auth on/off comparison"
    )
    parser.add_argument(
        "--auth-pairs", type=int, default=10, help="unsigned/signed window pairs per client count"
    )
    parser.add_argument(
        "--auth-seconds", type=float, default=1.0, help="length of one auth comparison window"
    )
    parser.add_argument(
        "--shards", default="1,2,4", help="shard counts for the sharded rows (1 client)"
    )
    parser.add_argument("--shard-sizes", default="25M", help="model sizes of the sharded rows")
    parser.add_argument("--compressions", default="none,int8", help="codecs of the sharded rows")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "ps_throughput.json"))
    args = parser.parse_args(argv)
    record = run_record.begin("ps_throughput")
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    clients = [int(c) for c in args.clients.split(",")]
    shard_sizes = [s.strip() for s in args.shard_sizes.split(",") if s.strip()]
    sizes += [s for s in shard_sizes if s not in sizes and args.shards]

    hashes = measure_hashes()
    print(
        "body digest over 100 MB: "
        + ", ".join(
            f"{k} {v:.0f} MB/s" + (" (used)" if k == "gmac" else "") for k, v in hashes.items()
        )
    )
    baselines = {}
    for size in sizes:
        nbytes = SIZES[size] * 4
        baselines[size] = {
            "memcpy_mb_per_s": measure_memcpy(nbytes),
            "tcp_mb_per_s": measure_tcp(nbytes, args.seconds),
        }
        print(
            f"{size:>4}: memcpy {baselines[size]['memcpy_mb_per_s']:.0f} MB/s, "
            f"loopback TCP {baselines[size]['tcp_mb_per_s']:.0f} MB/s"
        )

    runs = []
    print(
        f"{'params':>6} {'clients':>7} {'auth':>5} {'updates/s':>10} {'MB/s':>8} {'vs TCP':>7} "
        f"{'vs memcpy':>9} {'p50 ms':>8} {'p99 ms':>8}"
    )
    plan = [(s, c, True) for s in sizes for c in clients if s in args.sizes.split(",")]
    for size, c, authenticate in plan:
        runs.append(_run_row(size, c, args.seconds, authenticate, baselines))
    shard_runs = []
    if args.shards:
        print(
            "one client, push+pull through 1..N shards; 'vs TCP' counts the model's bytes "
            "both ways "
            "(float32: what crosses the wire; compressed: what the client gets done) "
            "over loopback TCP "
            "measured just before the row (the machine drifts); each row twice, in ABBA order"
        )
        print(
            f"{'params':>6} {'shards':>6} {'codec':>5} {'updates/s':>10} {'MB/s':>8} "
            f"{'TCP MB/s':>8} {'vs TCP':>7} "
            f"{'wire MB/s':>9} {'srv CPU ms/upd':>14} {'p50 ms':>8}"
        )
        counts = [int(x) for x in args.shards.split(",")]
        for size in shard_sizes:
            for codec in [c.strip() for c in args.compressions.split(",") if c.strip()]:
                for n_shards in counts + counts[::-1]:
                    tcp = measure_tcp(SIZES[size] * 4, 2.0)
                    row = measure_ps(
                        SIZES[size],
                        1,
                        args.seconds,
                        True,
                        n_shards,
                        None if codec == "none" else codec,
                    )
                    row["size"] = size
                    row["tcp_mb_per_s"] = tcp
                    row["vs_tcp"] = row["mb_per_s"] / tcp
                    wire_bytes = row["received_bytes_per_update"] + row["sent_bytes_per_update"]
                    row["wire_mb_per_s"] = row["updates_per_s"] * wire_bytes / MB
                    shard_runs.append(row)
                    print(
                        f"{size:>6} {n_shards:>6} {codec:>5} {row['updates_per_s']:>10.1f} "
                        f"{row['mb_per_s']:>8.0f} "
                        f"{tcp:>8.0f} {row['vs_tcp']:>7.2f} {row['wire_mb_per_s']:>9.0f} "
                        f"{row['server_cpu_s_per_update'] * 1e3:>14.1f} {row['p50_ms']:>8.1f}",
                        flush=True,
                    )
        for size in shard_sizes:
            for codec in [c.strip() for c in args.compressions.split(",") if c.strip()]:
                for n_shards in counts:
                    mine = [
                        r["vs_tcp"]
                        for r in shard_runs
                        if (r["size"], r["shards"], r["compression"] or "none")
                        == (size, n_shards, codec)
                    ]
                    print(
                        f"{size} {codec} {n_shards} shard(s): {statistics.mean(mine):.2f}x TCP "
                        f"(runs {', '.join(f'{v:.2f}' for v in mine)})"
                    )
    auth_cost: dict[int, float] = {}
    auth_pairs: dict[int, list[dict[str, float]]] = {}
    if args.auth_size in sizes:
        for c in clients:
            pairs = measure_auth_interleaved(
                SIZES[args.auth_size], c, args.auth_seconds, args.auth_pairs
            )
            auth_pairs[c] = pairs
            auth_cost[c] = 1 - statistics.median(p["signed"] / p["unsigned"] for p in pairs)
            costs = sorted(1 - p["signed"] / p["unsigned"] for p in pairs)
            print(
                f"{args.auth_size:>6} {c:>7}  auth cost {auth_cost[c]:+.1%} "
                f"(pairs {costs[0]:+.0%} to {costs[-1]:+.0%}): "
                "signed/unsigned updates/s per pair "
                + " ".join(f"{p['signed']:.0f}/{p['unsigned']:.0f}" for p in pairs),
                flush=True,
            )
        print(
            f"authentication cost at {args.auth_size} "
            f"(median over {args.auth_pairs} pairs of adjacent "
            f"{args.auth_seconds:g} s windows, same clients, ABBA order): "
            + ", ".join(f"{c} clients {v:+.1%}" for c, v in auth_cost.items())
        )
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "seconds": args.seconds,
        "hash_mb_per_s": hashes,
        "baselines": baselines,
        "runs": runs,
        "shard_runs": shard_runs,
        "auth_cost": {str(k): v for k, v in auth_cost.items()},
        "auth_pairs": {str(k): v for k, v in auth_pairs.items()},
        "auth_seconds": args.auth_seconds,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    run_record.write(Path(args.out), result, record)
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
