"""The synchronous client: ``Flock`` over redis-py ``Redis`` or ``RedisCluster``."""
from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import redis
from redis.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ConnectionError,
    MovedError,
    ResponseError,
    TimeoutError,
    TryAgainError,
)

from ._common import (
    BLOCK_REPLY_MARGIN_S,
    FencedError,
    LeaseTooShortError,
    LockBusyError,
    LockLostError,
    Number,
    block_ms,
    check_ttl,
    is_fenced_refusal,
    kind_args,
    ms_left,
    new_owner,
    renew_interval,
    renewal_wait_s,
    socket_timeout_of,
    wait_seconds,
)

log = logging.getLogger("redis_flock")
monotonic = time.monotonic

Addr = Optional[Tuple[str, int]]
_NETWORK_ERRORS = (ConnectionError, TimeoutError, OSError)
_REROUTE_ERRORS = (TryAgainError, ClusterDownError)
#: redirects / TRYAGAINs one call follows before giving up (waits follow them until their end)
_MAX_REDIRECTS = 16


# --- raw calls on a connection of our own ----------------------------------------------------

def _checkout(pool: Any) -> Any:
    try:
        return pool.get_connection()
    except TypeError:  # redis-py 5.0-5.2 wants a command name
        return pool.get_connection("FLOCK")


def _read(conn: Any, timeout: Optional[float]) -> Any:
    """The reply of the command just sent. timeout: None = the connection's own socket
    timeout; math.inf = no limit; else at most that many seconds (then the connection is
    dropped, so that a late reply can never be read as the answer to a later command)."""
    if timeout is not None:
        if timeout <= 0 or not conn.can_read(timeout=None if math.isinf(timeout) else timeout):
            conn.disconnect()
            raise TimeoutError("flock: no reply in time")
    return conn.read_response()


def _roundtrip(conn: Any, args: Tuple[Any, ...], timeout: Optional[float], asking: bool) -> Any:
    if asking:
        conn.send_command("ASKING")
        _read(conn, timeout)
    conn.send_command(*args)
    return _read(conn, timeout)


class _Transport:
    """Routes a key's commands to a connection checked out of the right pool: the client's
    pool (Redis) or the pool of the node that serves the key's slot (RedisCluster)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.cluster = isinstance(client, RedisCluster)
        #: the client's socket_timeout (None: none): bounds release()'s wait for a renewal
        self.socket_timeout = socket_timeout_of(client)

    def pool(self, key: Any, addr: Addr) -> Any:
        if not self.cluster:
            return self.client.connection_pool
        if addr is None:
            node = self.client.get_node_from_key(key)
        else:
            node = self.client.get_node(host=addr[0], port=addr[1])
            if node is None:
                self.client.nodes_manager.initialize()
                node = self.client.get_node(host=addr[0], port=addr[1])
                if node is None:
                    raise ConnectionError(f"flock: redirected to unknown node {addr[0]}:{addr[1]}")
        rc = node.redis_connection
        if rc is None:
            rc = self.client.get_redis_connection(node)
        return rc.connection_pool

    def call(self, key: Any, *args: Any, timeout: Optional[float] = None,
             addr: Addr = None, attempts: int = 1) -> Tuple[Any, Addr]:
        """One command, following MOVED/ASK/TRYAGAIN; network errors retried up to
        ``attempts`` times in all. Returns (reply, address it came from)."""
        asking = False
        redirects = 0
        failures = 0
        while True:
            pool = self.pool(key, addr)
            conn = _checkout(pool)
            try:
                return _roundtrip(conn, args, timeout, asking), addr
            except MovedError as e:
                addr, asking = (e.host, int(e.port)), False
            except AskError as e:
                addr, asking = (e.host, int(e.port)), True
            except _REROUTE_ERRORS:
                addr, asking = None, False
                time.sleep(min(0.2, 0.01 * (1 << min(redirects, 5))))
            except _NETWORK_ERRORS:
                failures += 1
                if failures >= attempts:
                    raise
                continue
            finally:
                pool.release(conn)
            redirects += 1
            if redirects > _MAX_REDIRECTS:
                raise ConnectionError(f"flock: too many redirects for {args[0]}")


# --- the watchdog: one timetable thread and a few renewal workers per process ---------------

class _Watchdog:
    """Keeps the renewal timetable of every lease in this process, on a few daemon threads that
    share it (leader/followers): the idle thread that waits for the next due renewal sends it
    itself (one wake-up between "due" and "sent"), and another thread is started whenever none
    is left idle, so a slow node never delays another lease's renewal. Holds leases only by
    weak reference: it can never keep a lease alive."""

    MAX_THREADS = 64

    def __init__(self) -> None:
        self._seq = itertools.count()
        self._reset()
        if hasattr(os, "register_at_fork"):
            # A forked child has none of these threads, and the copies of its parent's leases
            # are not its own grants: it renews none of them (they run out by its clock).
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: List[Tuple[float, int, Any]] = []
        self._idle = 0
        self._threads = 0
        self._stale = 0

    def forget(self) -> None:
        """A lease stopped renewing: its pending entry is stale. Now and then the watchdog
        drops them all (a program that takes many long leases briefly would pile them up)."""
        with self._cond:
            self._stale += 1
            if self._stale > 1024 and self._stale * 2 > len(self._heap):
                self._stale = -(1 << 30)  # one compaction at a time
                self._ensure_idle_locked()
                heapq.heappush(self._heap, (0.0, next(self._seq), self._compact))
                self._cond.notify()

    def _compact(self) -> None:
        with self._cond:
            entries = list(self._heap)
        live = []
        for entry in entries:  # without the lock: derefs and reads only
            job = entry[2]
            if isinstance(job, weakref.ref):
                lease = job()
                if lease is None or not lease._watching:
                    continue
            live.append(entry)
        with self._cond:
            # entries pushed meanwhile are kept; those popped meanwhile are not brought back
            now = set(id(e) for e in self._heap)
            kept = [e for e in live if id(e) in now]
            seen = set(id(e) for e in entries)
            kept += [e for e in self._heap if id(e) not in seen]
            heapq.heapify(kept)
            self._heap = kept
            self._stale = 0
            self._cond.notify()

    def _ensure_idle_locked(self) -> None:
        if self._idle == 0 and self._threads < self.MAX_THREADS:
            self._threads += 1
            self._idle += 1  # counted as idle from now, so that only one is started
            threading.Thread(target=self._thread, name="flock-watchdog", daemon=True).start()

    def at(self, due: float, job: Any) -> None:
        """Runs job() at due (monotonic). job is a weakref to a lease or a plain callable."""
        with self._cond:
            self._ensure_idle_locked()
            heapq.heappush(self._heap, (due, next(self._seq), job))
            if self._heap[0][2] is job:
                self._cond.notify()

    def run(self, job: Callable[[], None]) -> None:
        self.at(0.0, job)

    def _thread(self) -> None:
        while True:
            with self._cond:
                while True:
                    if not self._heap:
                        self._cond.wait()
                        continue
                    wait = self._heap[0][0] - monotonic()
                    if wait > 0:
                        self._cond.wait(wait)
                        continue
                    job = heapq.heappop(self._heap)[2]
                    break
                self._idle -= 1
                self._ensure_idle_locked()  # someone keeps watching the timetable
                if self._heap:
                    self._cond.notify()
            try:
                if isinstance(job, weakref.ref):
                    lease = job()
                    if lease is not None and lease._watching:
                        lease._tick()
                    del lease
                else:
                    job()
            except BaseException:  # a job never kills the thread
                log.exception("flock: watchdog job failed")
            del job
            with self._cond:
                self._idle += 1


_watchdog = _Watchdog()


def _release_in_background(transport: _Transport, key: Any, owner: str, token: int,
                           addr: Addr, conn: Any = None, pool: Any = None) -> None:
    """A lease that was garbage-collected unreleased: end its grant (and the watchdog already
    stopped, since it only held the lease weakly); a BOUND lease's connection goes back to its
    pool."""
    def job() -> None:
        try:
            if conn is not None:
                try:
                    _roundtrip(conn, ("FLOCK.RELEASE", key, owner, token), None, False)
                except _NETWORK_ERRORS:
                    conn.disconnect()
                finally:
                    pool.release(conn)
            else:
                transport.call(key, "FLOCK.RELEASE", key, owner, token, addr=addr, attempts=2)
        except Exception:
            log.warning("flock: background release of %r failed", key, exc_info=True)
    try:
        _watchdog.run(job)
    except Exception:  # interpreter shutdown
        pass


# --- the lease ---------------------------------------------------------------------------------

class Lease:
    """One grant of one lock. ``key``, ``owner`` and ``token`` name it; ``lost`` says whether it
    is gone; ``remaining_ms()`` how long it certainly still runs (rule 1)."""

    def __init__(self, flock: "Flock", key: Any, owner: str, token: int, ttl_ms: int,
                 sent: float, renew: bool, addr: Addr, conn: Any = None, pool: Any = None) -> None:
        self.key = key
        self.owner = owner
        self.token: int = token
        self.ttl_ms = ttl_ms
        self.bound = conn is not None
        #: why the lease was lost (None while it is not)
        self.lost_reason: Optional[str] = None
        self._t = flock._t
        self._addr = addr
        self._conn = conn  # BOUND: the connection the grant lives on
        self._pool = pool
        self._deadline = sent + ttl_ms / 1000.0
        self._lock = threading.Lock()        # state
        self._io = threading.Lock()          # one RENEW at a time (and the bound connection)
        self._lost_evt = threading.Event()
        self._lost = False
        self._released = False
        self._released_ok = False
        self._watching = renew
        self._backoff = 0.0
        self._finalizer = weakref.finalize(self, _release_in_background, self._t, key, owner,
                                           token, addr, conn, pool)
        self._finalizer.atexit = False
        if renew:
            _watchdog.at(sent + renew_interval(ttl_ms), weakref.ref(self))

    def __repr__(self) -> str:
        state = "lost" if self._lost else "released" if self._released else "live"
        return f"<Lease key={self.key!r} owner={self.owner!r} token={self.token} {state}>"

    # -- state -------------------------------------------------------------------------------
    def _set_lost_locked(self, reason: str) -> None:
        if not self._lost:
            self._lost = True
            self.lost_reason = reason
            self._watching = False
            self._lost_evt.set()

    def _set_lost(self, reason: str) -> None:
        with self._lock:
            self._set_lost_locked(reason)

    @property
    def lost(self) -> bool:
        """True once the lease is gone (a refused renewal, REVOKE seen, a stale fenced write,
        a release answered 0, or its local deadline passed). Never true after a clean release."""
        if self._lost:
            return True
        if self._released:
            return False
        if monotonic() >= self._deadline:
            with self._lock:
                if not self._released:
                    self._set_lost_locked("the local deadline passed (rule 1)")
            return self._lost
        return False

    def remaining_ms(self) -> int:
        """Milliseconds the lease certainly still runs by this process's own clock, never more
        than the server's FLOCK.CHECK would answer; 0 once lost or released."""
        if self._lost or self._released:
            return 0
        left = ms_left(self._deadline, monotonic())
        if left == 0:
            self.lost  # noqa: B018 (marks it)
        return left

    def wait_lost(self, timeout_ms: Optional[Number] = None) -> bool:
        """Blocks until the lease is lost (True) or timeout_ms passed (False); None: no limit.
        Returns False at once for a released lease."""
        end = math.inf if timeout_ms is None else monotonic() + timeout_ms / 1000.0
        while True:
            if self.lost:
                return True
            if self._released:
                return False
            now = monotonic()
            if now >= end:
                return False
            step = min(end, self._deadline) - now
            self._lost_evt.wait(max(step, 0.0005) if not math.isinf(step) else None)

    def ensure(self, min_ms: Number = 0) -> None:
        """Before a critical step: raises LockLostError when the lease is lost (or released),
        LeaseTooShortError when it has less than min_ms left. By the local clock alone: no
        round trip, so a process that was paused learns it at once."""
        if self.lost:
            raise LockLostError(f"lease of {self.key!r} is lost: {self.lost_reason}")
        if self._released:
            raise LockLostError(f"lease of {self.key!r} was released")
        left = self.remaining_ms()
        if left < min_ms:
            if left == 0 and self.lost:
                raise LockLostError(f"lease of {self.key!r} is lost: {self.lost_reason}")
            raise LeaseTooShortError(
                f"lease of {self.key!r} has {left} ms left, less than the {min_ms} ms needed")

    # -- calls -------------------------------------------------------------------------------
    def _io_call(self, *args: Any, timeout: Optional[float] = None) -> Any:
        """A command about this grant, on the bound connection or routed to the grant's node."""
        if self._conn is not None:
            try:
                return _roundtrip(self._conn, args, timeout, False)
            except _NETWORK_ERRORS:
                self._set_lost("the connection of the BOUND lease failed")
                raise
        reply, addr = self._t.call(self.key, *args, timeout=timeout, addr=self._addr)
        if addr is not None:
            self._addr = addr
        return reply

    def check(self) -> int:
        """The server's FLOCK.CHECK: remaining ms of this grant, 0 (and the lease lost) when it
        is not live."""
        with self._io if self._conn is not None else _nolock:
            left = self._io_call("FLOCK.CHECK", self.key, self.token)
        if not left:
            self._set_lost("FLOCK.CHECK answered 0: the grant is gone")
            return 0
        return int(left)

    def renew(self, ttl_ms: Optional[int] = None) -> None:
        """Renews now with a token-qualified RENEW (and the watchdog goes on with the new ttl).
        Raises LockLostError when the grant is gone or the local deadline has passed."""
        ttl = self.ttl_ms if ttl_ms is None else check_ttl(ttl_ms)
        with self._io:
            self._renew_locked(ttl, raise_lost=True)

    def _renew_locked(self, ttl: int, raise_lost: bool) -> bool:
        """RENEW once (caller holds _io). True: renewed; False: lost. Network errors pass."""
        now = monotonic()
        with self._lock:
            if self._released:
                if raise_lost:
                    raise LockLostError(f"lease of {self.key!r} was released")
                return False
            if not self._lost and now >= self._deadline:
                self._set_lost_locked("the local deadline passed before a renewal (rule 2)")
            if self._lost:
                if raise_lost:
                    raise LockLostError(f"lease of {self.key!r} is lost: {self.lost_reason}")
                return False
            deadline = self._deadline
        sent = monotonic()
        # The reply can only matter before the local deadline: wait no longer than that.
        reply = self._io_call("FLOCK.RENEW", self.key, self.owner, ttl, self.token,
                              timeout=deadline - sent)
        with self._lock:
            if self._released:
                return False
            if reply is None:
                self._set_lost_locked("FLOCK.RENEW answered nil: the grant is gone")
            elif not self._lost:
                self._deadline = sent + ttl / 1000.0
                self.ttl_ms = ttl
            lost = self._lost
        if lost and raise_lost:
            raise LockLostError(f"lease of {self.key!r} is lost: {self.lost_reason}")
        return not lost

    def _tick(self) -> None:
        """The watchdog's renewal (on a worker thread)."""
        if not self._watching:
            return
        with self._io:
            if not self._watching:
                return
            sent = monotonic()
            try:
                ok = self._renew_locked(self.ttl_ms, raise_lost=False)
            except Exception as e:  # network, redirect, LOADING...: retry until the deadline
                # Retry soon, but never past the local deadline (checked before each send).
                if self._conn is not None:
                    self._set_lost(f"the connection of the BOUND lease failed: {e}")
                    return
                self._backoff = min(max(self._backoff * 2, 0.01), 0.25, self.ttl_ms / 12000.0)
                due = min(monotonic() + self._backoff, self._deadline)
                log.debug("flock: renewal of %r failed (%s); retrying", self.key, e)
                if self._watching:
                    _watchdog.at(due, weakref.ref(self))
                return
            self._backoff = 0.0
            if ok and self._watching:
                _watchdog.at(sent + renew_interval(self.ttl_ms), weakref.ref(self))

    def fenced(self, *command: Any) -> Any:
        """FLOCK.FENCED key token command...: runs command only while this grant is live.
        A refusal (stale token) marks the lease lost and raises FencedError."""
        try:
            if self._conn is not None:
                with self._io:
                    return self._io_call("FLOCK.FENCED", self.key, self.token, *command)
            return self._io_call("FLOCK.FENCED", self.key, self.token, *command)
        except ResponseError as e:
            if is_fenced_refusal(e):
                self._set_lost(f"a fenced write was refused: {e}")
                raise FencedError(str(e)) from e
            raise

    def release(self) -> bool:
        """Ends the grant: FLOCK.RELEASE key owner token (rule 4), retried once after a
        connection error (a retry answered 0 counts as released). Stops the watchdog first:
        no renewal starts once release() has begun, and one already under way is waited for
        before the RELEASE is sent, so that when release() returns no RENEW of the lease is in
        flight. That wait is bounded: at most until the lease's local deadline (a renewal
        never waits for its reply past it, rule 2) and at most the client's socket_timeout;
        a renewal stuck longer (on a dead connection) is left behind, its late reply ignored.
        A renewal's reply that comes after release() began never marks the lease lost.
        True when the grant was live and is now released; False when it was already gone
        (then the lease is lost). Idempotent."""
        with self._lock:
            if self._released:
                return self._released_ok
            if not self._lost and monotonic() >= self._deadline:
                self._set_lost_locked("the local deadline passed (rule 1)")
            self._released = True
            watched, self._watching = self._watching, False
        self._finalizer.detach()
        if watched:
            _watchdog.forget()
        if self._conn is None:
            self._wait_for_renewal()
        try:
            if self._conn is not None:
                with self._io:
                    n = self._release_bound()
            else:
                try:
                    n, _ = self._t.call(self.key, "FLOCK.RELEASE", self.key, self.owner,
                                        self.token, addr=self._addr)
                except _NETWORK_ERRORS:
                    n, _ = self._t.call(self.key, "FLOCK.RELEASE", self.key, self.owner,
                                        self.token, addr=self._addr)
                    n = 1 if n == 0 else n  # the first one may have landed
        finally:
            self._lost_evt.set()  # wakes wait_lost() callers: it answers False now
        with self._lock:
            if n == 1:
                self._released_ok = True
            else:
                self._set_lost_locked("FLOCK.RELEASE answered 0: the grant had ended")
        return self._released_ok

    def _wait_for_renewal(self) -> None:
        """Waits (bounded) for a renewal of this lease already under way: renewals hold _io
        from their check of _released to their reply, and _released is set, so none can start
        after this. (A BOUND lease's release takes _io for its connection anyway.)"""
        wait = renewal_wait_s(self._deadline, monotonic(), self._t.socket_timeout)
        if self._io.acquire(timeout=wait):
            self._io.release()
        else:
            log.debug("flock: release of %r did not wait longer than %.3f s for a renewal under "
                      "way", self.key, wait)

    def _release_bound(self) -> int:
        conn, self._conn = self._conn, None
        try:
            n = _roundtrip(conn, ("FLOCK.RELEASE", self.key, self.owner, self.token), None, False)
        except _NETWORK_ERRORS:
            # the binding died with the connection: the server ends the grant by itself
            conn.disconnect()
            self._pool.release(conn)
            self._set_lost("the connection of the BOUND lease failed")
            return 0
        self._pool.release(conn)
        return int(n)

    # -- with lease: ... -----------------------------------------------------------------------
    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.release()
            if self._lost:
                raise LockLostError(f"lease of {self.key!r} was lost while held: {self.lost_reason}")
            return
        try:
            self.release()
        except Exception:
            log.warning("flock: release of %r after an error failed", self.key, exc_info=True)
        # the block's own exception goes on unchanged


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: Any) -> None:
        return None


_nolock = _NoLock()


class _LockContext:
    __slots__ = ("_flock", "_args", "_kw", "_lease")

    def __init__(self, flock: "Flock", args: Tuple[Any, ...], kw: Dict[str, Any]) -> None:
        self._flock = flock
        self._args = args
        self._kw = kw
        self._lease: Optional[Lease] = None

    def __enter__(self) -> Lease:
        lease = self._flock.acquire(*self._args, **self._kw)
        if lease is None:
            wait = self._kw.get("wait_ms")
            raise LockBusyError(f"lock {self._args[0]!r} not granted"
                                + (f" within {wait} ms" if wait else " (held by another owner)"))
        self._lease = lease
        return lease

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        lease, self._lease = self._lease, None
        assert lease is not None
        lease.__exit__(exc_type, exc, tb)


# --- the factory --------------------------------------------------------------------------------

class Flock:
    """Fenced locks over a redis-py ``Redis`` or ``RedisCluster`` client."""

    def __init__(self, client: Union["redis.Redis", RedisCluster]) -> None:
        self.client: Any = client
        self._t = _Transport(client)

    def lock(self, key: Any, ttl_ms: int, *, wait_ms: Optional[Number] = None,
             shared: bool = False, limit: Optional[int] = None, bound: bool = False,
             renew: bool = True, owner: Optional[str] = None) -> _LockContext:
        """``with flock.lock(key, ttl_ms) as lease:`` acquires (LockBusyError when not granted
        within wait_ms), and always releases on leaving; leaving raises LockLostError when the
        lease was lost meanwhile, unless the block raised (its error goes on unchanged)."""
        return _LockContext(self, (key, ttl_ms), dict(
            wait_ms=wait_ms, shared=shared, limit=limit, bound=bound, renew=renew, owner=owner))

    def acquire(self, key: Any, ttl_ms: int, *, wait_ms: Optional[Number] = None,
                shared: bool = False, limit: Optional[int] = None, bound: bool = False,
                renew: bool = True, owner: Optional[str] = None) -> Optional[Lease]:
        """A Lease, or None when not granted within wait_ms (None or 0: one try; math.inf:
        no limit)."""
        ttl = check_ttl(ttl_ms)
        wait_s = wait_seconds(wait_ms)
        extra = kind_args(shared, limit, bound)
        own = owner if owner is not None else new_owner()
        if bound or wait_s is not None:
            start = monotonic()
            if not bound:
                # Free key: one round trip on the shared pool, as without wait.
                sent = monotonic()
                token, addr = self._t.call(key, "FLOCK.ACQUIRE", key, own, ttl, *extra,
                                           attempts=2)
                if token is not None:
                    return Lease(self, key, own, int(token), ttl, sent, renew, addr)
            return self._acquire_dedicated(key, own, ttl, extra, wait_s, start, bound, renew,
                                           owner is None)
        sent = monotonic()
        # A retry after a lost reply is safe: the same owner gets the same token (G4); the
        # deadline counts from the first send.
        token, addr = self._t.call(key, "FLOCK.ACQUIRE", key, own, ttl, *extra, attempts=2)
        if token is None:
            return None
        return Lease(self, key, own, int(token), ttl, sent, renew, addr)

    def _acquire_dedicated(self, key: Any, owner: str, ttl: int, extra: List[Any],
                           wait_s: Optional[float], start: float, bound: bool, renew: bool,
                           own_owner: bool) -> Optional[Lease]:
        """ACQUIRE [BLOCK] on a connection of its own (rule 8): a wait never holds up another
        lease's commands; a BOUND grant keeps the connection. Follows TRYAGAIN / MOVED / ASK
        (a slot moved while waiting) to the slot's new owner (rule 5)."""
        end = math.inf if wait_s is None or math.isinf(wait_s) else start + wait_s
        addr: Addr = None
        asking = False
        redirects = 0
        failures = 0
        while True:
            left = end - monotonic()
            if wait_s is not None and left <= 0:
                return None
            pool = self._t.pool(key, addr)
            conn = _checkout(pool)
            keep = False
            try:
                if wait_s is None:
                    sent = monotonic()
                    token = _roundtrip(conn, ("FLOCK.ACQUIRE", key, owner, ttl, *extra), None,
                                       asking)
                    if token is None:
                        return None
                else:
                    timeout = left + BLOCK_REPLY_MARGIN_S
                    token = _roundtrip(conn, ("FLOCK.ACQUIRE", key, owner, ttl, *extra, "BLOCK",
                                              block_ms(left)), timeout, asking)
                    if token is None:
                        return None  # the server's BLOCK timeout
                    # Rule 1: the wait may have outlasted the ttl. Renew at once, token-qualified,
                    # and count from this RENEW.
                    sent = monotonic()
                    again = _roundtrip(conn, ("FLOCK.RENEW", key, owner, ttl, token),
                                       ttl / 1000.0, asking)
                    if again is None:
                        continue  # expired before we could use it: wait again
                keep = bound
                return Lease(self, key, owner, int(token), ttl, sent, renew, addr,
                             conn=conn if bound else None, pool=pool if bound else None)
            except MovedError as e:
                addr, asking = (e.host, int(e.port)), False
            except AskError as e:
                addr, asking = (e.host, int(e.port)), True
            except _REROUTE_ERRORS:
                addr, asking = None, False
                time.sleep(min(0.2, 0.01 * (1 << min(redirects, 5))))
            except _NETWORK_ERRORS:
                # A retried ACQUIRE of the same owner is safe: it takes the earlier request's
                # place, or gets the same token back if the lost reply was a grant.
                failures += 1
                if failures >= 2:
                    if own_owner:
                        self._forget(key, owner, addr)
                    raise
                continue
            finally:
                if not keep:
                    pool.release(conn)
            redirects += 1
            if redirects > _MAX_REDIRECTS and wait_s is None:
                raise ConnectionError("flock: too many redirects for FLOCK.ACQUIRE")
            if redirects > 4:  # a cluster in flux: do not spin
                time.sleep(min(0.2, 0.01 * (1 << min(redirects - 4, 5))))

    def _forget(self, key: Any, owner: str, addr: Addr) -> None:
        """After a failed wait: a grant whose reply was lost must not stay held until its ttl."""
        try:
            self._t.call(key, "FLOCK.RELEASE", key, owner, addr=addr)
        except Exception:
            pass

    def release(self, key: Any, owner: str, token: Optional[int] = None) -> bool:
        """FLOCK.RELEASE key owner [token] from any process (a supervisor's takeover)."""
        args: List[Any] = ["FLOCK.RELEASE", key, owner]
        if token is not None:
            args.append(token)
        return bool(self.client.execute_command(*args))

    def revoke(self, key: Any, owner: Optional[str] = None) -> int:
        """FLOCK.REVOKE key [owner]: the number of live grants ended."""
        args: List[Any] = ["FLOCK.REVOKE", key]
        if owner is not None:
            args.append(owner)
        return int(self.client.execute_command(*args))
