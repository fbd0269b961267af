"""A userspace delay line between two TCP peers, for a benchmark that needs a service a fixed
time away where the kernel has no ``tc netem``: a process (:func:`relay_main`) accepting one
port and forwarding to another, a reader and a writer thread per direction, each chunk written
a fixed delay after it was read. Sub-millisecond delays need a spin: epoll's timeouts are 1 ms,
so the writer sleeps to within :data:`SPIN_S` of a chunk's time and spins the rest.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

SPIN_S = 150e-6  # the relay sleeps until this close to a chunk's time, then spins
LATENESS_KEPT = 200_000  # the relay keeps at most this many lateness samples


class DelayLine:
    """One direction of the relay: chunks in arrival order, each released ``delay_s`` after
    it arrived; chunks due together leave as one write (they would have been one read too)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self._chunks: collections.deque[tuple[float, bytes]] = collections.deque()

    def __len__(self) -> int:
        return len(self._chunks)

    def push(self, arrived: float, data: bytes) -> None:
        self._chunks.append((arrived + self.delay_s, data))

    def next_due(self) -> float | None:
        """When the oldest chunk may leave (None: nothing waits)."""
        return self._chunks[0][0] if self._chunks else None

    def pop_due(self, now: float) -> tuple[bytes, float | None]:
        """Every chunk due at ``now``, joined in order, and the earliest one's due time (to
        measure how late it left); ``(b"", None)`` when none is due."""
        out: list[bytes] = []
        first: float | None = None
        while self._chunks and self._chunks[0][0] <= now:
            due, data = self._chunks.popleft()
            first = due if first is None else first
            out.append(data)
        return b"".join(out), first


def wait_until(due: float) -> None:
    """Until ``perf_counter() >= due``: a sleep to within SPIN_S, then a spin (a sleep alone
    overshoots by the timer slack and the scheduler's wake-up; 50-100 µs here)."""
    while True:
        left = due - time.perf_counter()
        if left <= 0:
            return
        if left > SPIN_S:
            time.sleep(left - SPIN_S)


class _Direction:
    """Reads ``src`` into a :class:`DelayLine`; another thread writes it to ``dst`` on time."""

    def __init__(self, src: socket.socket, dst: socket.socket, delay_s: float, late: list[float]):
        self.src, self.dst, self.line = src, dst, DelayLine(delay_s)
        self.late, self.closed = late, False
        self.cond = threading.Condition()

    def start(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._write, daemon=True).start()

    def _read(self) -> None:
        try:
            while data := self.src.recv(65536):
                with self.cond:
                    self.line.push(time.perf_counter(), data)
                    self.cond.notify()
        except OSError:
            pass  # the peer reset: what was read still goes out, then the write side closes
        with self.cond:
            self.closed = True
            self.cond.notify()

    def _write(self) -> None:
        try:
            while True:
                with self.cond:
                    while not self.line and not self.closed:
                        self.cond.wait()
                    due = self.line.next_due()
                if due is None:
                    break  # closed and drained
                wait_until(due)
                with self.cond:
                    data, first = self.line.pop_due(time.perf_counter())
                if first is not None:
                    sent = time.perf_counter()
                    self.dst.sendall(data)
                    if len(self.late) < LATENESS_KEPT:
                        self.late.append(sent - first)
            self.dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                self.src.shutdown(socket.SHUT_RD)


def _fine_timer_slack() -> None:
    """1 µs of timer slack for this process (Linux's default is 50 µs): sleeps end on time."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK, ns


def relay_main(argv: list[str] | None = None) -> None:
    """``listen_port upstream_host upstream_port delay_us stats_path``: relay TCP connections
    from 127.0.0.1:listen_port to the upstream, each chunk ``delay_us`` late each way; on
    SIGTERM, write how late chunks left (seconds past their due time) to ``stats_path``."""
    port, host, up_port, delay_us, stats = argv if argv is not None else sys.argv[1:]
    delay_s = int(delay_us) / 1e6
    _fine_timer_slack()
    sys.setswitchinterval(5e-5)  # a spinning writer hands the GIL over within 50 µs
    late: list[float] = []

    def stop(*_: object) -> None:
        Path(stats).write_text(json.dumps(late))
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    server = socket.create_server(("127.0.0.1", int(port)))
    while True:
        conn, _ = server.accept()
        try:
            upstream = socket.create_connection((host, int(up_port)), timeout=5)
        except OSError:
            conn.close()
            continue
        upstream.settimeout(None)
        for s in (conn, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _Direction(conn, upstream, delay_s, late).start()
        _Direction(upstream, conn, delay_s, late).start()


# --- the cache, 0.5 ms away -------------------------------------------------------------------
