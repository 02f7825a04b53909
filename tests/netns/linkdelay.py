"""Delay packets by a fixed time: what ``tc qdisc ... netem delay`` does, without netem.

Some kernels (this machine's among them) are built without ``sch_netem``. This program
gets the packets through netfilter's NFQUEUE instead: an iptables rule in a network
namespace sends them to queue ``N``, and this program, run in the same namespace, holds each
one for the delay and then lets it go (verdict ACCEPT), in arrival order. The kernel keeps
the packets; only their ids travel (copy mode "meta"). It speaks nfnetlink_queue over a
plain netlink socket, so it needs no library, only root (CAP_NET_ADMIN) in the namespace.

Usage (tests/netns/conftest.py does this)::

    ip netns exec NS iptables -I OUTPUT -d DRIVER -j NFQUEUE --queue-num 7 --queue-bypass
    ip netns exec NS python -m tests.netns.linkdelay --queue 7 --delay-ms 50

It prints ``ready`` once bound to the queue and runs until SIGTERM or SIGINT. With
``--queue-bypass`` on the rule, packets pass undelayed whenever no program is bound.
"""

from __future__ import annotations

import argparse
import errno
import heapq
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT = 1
NFQNL_MSG_CONFIG = 2
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQA_CFG_MASK = 4
NFQA_CFG_FLAGS = 5
NFQA_CFG_F_FAIL_OPEN = 1
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NF_ACCEPT = 1
NLMSG_ERROR = 2
NLM_F_REQUEST = 1
NLM_F_ACK = 4
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
_ATTR = struct.Struct("=HH")  # nlattr: length, type


def _attr(kind: int, data: bytes) -> bytes:
    length = _ATTR.size + len(data)
    return _ATTR.pack(length, kind) + data + b"\0" * (-length % 4)


def _message(kind: int, flags: int, queue: int, family: int, payload: bytes) -> bytes:
    body = struct.pack("=BBH", family, 0, socket.htons(queue)) + payload  # nfgenmsg
    return (
        _HEADER.pack(_HEADER.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, flags, 0, 0) + body
    )


class Delayer:
    """Holds the packets of one NFQUEUE for ``delay`` seconds each. Not thread-safe."""

    def __init__(self, queue: int, delay: float, max_len: int = 10000) -> None:
        self.queue = queue
        self.delay = delay
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        # A burst of packets must not overflow the socket (net.core.rmem_max would cap a
        # plain SO_RCVBUF): the kernel would drop the packets it cannot report, and TCP
        # would see losses the test did not ask for. Root may force the size.
        self.sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), 32 << 20)
        self.sock.bind((0, 0))
        self._config(
            _attr(
                NFQA_CFG_CMD,
                struct.pack("=BBH", NFQNL_CFG_CMD_BIND, 0, socket.htons(socket.AF_INET)),
            )
        )
        self._config(
            _attr(NFQA_CFG_PARAMS, struct.pack(">IB", 0, NFQNL_COPY_META))
            + _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack(">I", max_len))
            # A full queue lets packets through (undelayed) rather than dropping them.
            + _attr(NFQA_CFG_MASK, struct.pack(">I", NFQA_CFG_F_FAIL_OPEN))
            + _attr(NFQA_CFG_FLAGS, struct.pack(">I", NFQA_CFG_F_FAIL_OPEN))
        )
        self.sock.setblocking(False)
        self._due: list[tuple[float, int]] = []
        self.packets = 0
        self.overruns = 0

    def _config(self, attrs: bytes) -> None:
        self.sock.send(
            _message(NFQNL_MSG_CONFIG, NLM_F_REQUEST | NLM_F_ACK, self.queue, socket.AF_INET, attrs)
        )
        self.sock.settimeout(5.0)
        self._receive(self.sock.recv(1 << 16))

    def _drain(self) -> None:
        """Read every message waiting on the socket."""
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except BlockingIOError:
                return
            except OSError as err:
                if err.errno != errno.ENOBUFS:
                    raise
                self.overruns += 1  # some packets were not reported (and so not delayed)
                continue
            self._receive(data)

    def _receive(self, data: bytes) -> None:
        """Parse netlink messages: queue packets, raise on errors the kernel reports."""
        offset = 0
        while offset + _HEADER.size <= len(data):
            length, kind, _, _, _ = _HEADER.unpack_from(data, offset)
            if length < _HEADER.size:
                break
            if kind == NLMSG_ERROR:
                (code,) = struct.unpack_from("=i", data, offset + _HEADER.size)
                if code:
                    raise OSError(
                        -code, f"nfnetlink_queue refused a request for queue {self.queue}"
                    )
            elif kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                attr = offset + _HEADER.size + 4  # after nfgenmsg
                while attr + _ATTR.size <= offset + length:
                    attr_len, attr_kind = _ATTR.unpack_from(data, attr)
                    if attr_len < _ATTR.size:
                        break
                    if attr_kind & 0x3FFF == NFQA_PACKET_HDR:
                        (packet_id,) = struct.unpack_from(">I", data, attr + _ATTR.size)
                        heapq.heappush(self._due, (time.monotonic() + self.delay, packet_id))
                        self.packets += 1
                    attr += (attr_len + 3) & ~3
            offset += (length + 3) & ~3

    def _release_due(self) -> None:
        now = time.monotonic()
        while self._due and self._due[0][0] <= now:
            _, packet_id = heapq.heappop(self._due)
            verdict = _attr(NFQA_VERDICT_HDR, struct.pack(">II", NF_ACCEPT, packet_id))
            self.sock.send(
                _message(NFQNL_MSG_VERDICT, NLM_F_REQUEST, self.queue, socket.AF_UNSPEC, verdict)
            )

    def run(self, stop: list[bool]) -> None:
        """Delay packets until ``stop[0]`` is set, then let every held packet go."""
        while not stop[0]:
            self._release_due()
            wait = max(0.0, self._due[0][0] - time.monotonic()) if self._due else 0.5
            try:
                ready, _, _ = select.select([self.sock], [], [], min(wait, 0.5))
            except InterruptedError:
                continue
            if ready:
                self._drain()
        for _, packet_id in sorted(self._due):
            verdict = _attr(NFQA_VERDICT_HDR, struct.pack(">II", NF_ACCEPT, packet_id))
            self.sock.send(
                _message(NFQNL_MSG_VERDICT, NLM_F_REQUEST, self.queue, socket.AF_UNSPEC, verdict)
            )
        self.sock.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Delay the packets of one NFQUEUE.")
    parser.add_argument("--queue", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, required=True)
    args = parser.parse_args(argv)
    stop = [False]

    def request_stop(*_: object) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    delayer = Delayer(args.queue, args.delay_ms / 1000.0)
    print("ready", flush=True)  # noqa: T201 - the parent waits for this line
    delayer.run(stop)
    print(f"delayed {delayer.packets} packets ({delayer.overruns} socket overruns)", flush=True)  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
