"""The asyncio client: ``Flock`` over ``redis.asyncio`` ``Redis`` or ``RedisCluster``.

    from redis.asyncio import Redis
    from redis_flock.aio import Flock

    flock = Flock(Redis())
    async with flock.lock("orders:42:lock", 10_000) as lease:
        await lease.fenced("SET", "orders:42:state", "paid")

Same rules and names as the sync client; every call that talks to the server is a coroutine
(``acquire``, ``release``, ``revoke``, and the lease's ``check``, ``renew``, ``fenced``,
``release``, ``wait_lost``); ``lost``, ``remaining_ms()`` and ``ensure()`` are local and
synchronous. The watchdog of a lease is an asyncio task that only holds the lease weakly.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import math
import time
import weakref
from typing import Any, Dict, List, Optional, Set, Tuple, Union

import redis.asyncio
from redis.asyncio.cluster import RedisCluster
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
    FlockError,
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

__all__ = [
    "Flock",
    "Lease",
    "FlockError",
    "LockBusyError",
    "LockLostError",
    "LeaseTooShortError",
    "FencedError",
]

log = logging.getLogger("redis_flock")
monotonic = time.monotonic
Addr = Optional[Tuple[str, int]]
_NETWORK_ERRORS = (ConnectionError, TimeoutError, OSError, asyncio.TimeoutError)
_REROUTE_ERRORS = (TryAgainError, ClusterDownError)
_MAX_REDIRECTS = 16
_background: Set["asyncio.Task[Any]"] = set()


async def _maybe_await(x: Any) -> Any:
    if inspect.isawaitable(x):
        return await x
    return x


async def _read(conn: Any, timeout: Optional[float]) -> Any:
    """The reply of the command just sent. timeout: None = the connection's socket timeout;
    math.inf = no limit; else at most that many seconds (then the connection is dropped, so a
    late reply is never read as the answer to a later command)."""
    if timeout is None:
        return await conn.read_response()
    if math.isinf(timeout):
        return await conn.read_response(timeout=math.inf)
    if timeout <= 0:
        await conn.disconnect()
        raise TimeoutError("flock: no reply in time")
    try:
        # a cancelled read disconnects (redis-py closes the connection on BaseException)
        return await asyncio.wait_for(conn.read_response(timeout=math.inf), timeout)
    except asyncio.TimeoutError:
        await conn.disconnect()
        raise TimeoutError("flock: no reply in time") from None


async def _roundtrip(conn: Any, args: Tuple[Any, ...], timeout: Optional[float],
                     asking: bool) -> Any:
    if asking:
        await conn.send_command("ASKING")
        await _read(conn, timeout)
    await conn.send_command(*args)
    return await _read(conn, timeout)


class _Slot:
    """A connection checked out for one call (or one BOUND lease), and how to give it back."""
    __slots__ = ("conn", "_pool", "_node")

    def __init__(self, conn: Any, pool: Any = None, node: Any = None) -> None:
        self.conn, self._pool, self._node = conn, pool, node

    async def give_back(self) -> None:
        if self._node is not None:
            release = getattr(self._node, "release", None)
            if release is not None:
                release(self.conn)
            else:  # redis-py 5.0: the node's free list
                self._node._free.append(self.conn)
        else:
            await _maybe_await(self._pool.release(self.conn))


class _Transport:
    def __init__(self, client: Any) -> None:
        self.client = client
        self.cluster = isinstance(client, RedisCluster)
        #: the client's socket_timeout (None: none): bounds release()'s wait for a renewal
        self.socket_timeout = socket_timeout_of(client)

    async def checkout(self, key: Any, addr: Addr) -> _Slot:
        if not self.cluster:
            pool = self.client.connection_pool
            try:
                conn = await pool.get_connection()
            except TypeError:  # redis-py 5.0-5.2 wants a command name
                conn = await pool.get_connection("FLOCK")
            return _Slot(conn, pool=pool)
        c = self.client
        await c.initialize()
        if addr is None:
            node = c.get_node_from_key(key)
        else:
            node = c.get_node(host=addr[0], port=addr[1])
            if node is None:
                await c.nodes_manager.initialize()
                node = c.get_node(host=addr[0], port=addr[1])
                if node is None:
                    raise ConnectionError(f"flock: redirected to unknown node {addr[0]}:{addr[1]}")
        return _Slot(node.acquire_connection(), node=node)

    async def call(self, key: Any, *args: Any, timeout: Optional[float] = None,
                   addr: Addr = None, attempts: int = 1) -> Tuple[Any, Addr]:
        asking = False
        redirects = 0
        failures = 0
        while True:
            slot = await self.checkout(key, addr)
            try:
                return await _roundtrip(slot.conn, args, timeout, asking), addr
            except MovedError as e:
                addr, asking = (e.host, int(e.port)), False
            except AskError as e:
                addr, asking = (e.host, int(e.port)), True
            except _REROUTE_ERRORS:
                addr, asking = None, False
                await asyncio.sleep(min(0.2, 0.01 * (1 << min(redirects, 5))))
            except _NETWORK_ERRORS:
                failures += 1
                if failures >= attempts:
                    raise
                continue
            finally:
                await slot.give_back()
            redirects += 1
            if redirects > _MAX_REDIRECTS:
                raise ConnectionError(f"flock: too many redirects for {args[0]}")


def _spawn(coro: Any) -> None:
    task = asyncio.ensure_future(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)


async def _release_quietly(transport: _Transport, key: Any, owner: str, token: Optional[int],
                           addr: Addr, slot: Optional[_Slot] = None) -> None:
    try:
        args = ("FLOCK.RELEASE", key, owner) + ((token,) if token is not None else ())
        if slot is not None:  # a BOUND lease: on its own connection, which then goes back
            try:
                await _roundtrip(slot.conn, args, None, False)
            except _NETWORK_ERRORS:
                await slot.conn.disconnect()
            finally:
                await slot.give_back()
            return
        await transport.call(key, *args, addr=addr, attempts=2)
    except Exception:
        log.warning("flock: background release of %r failed", key, exc_info=True)


def _release_in_background(loop: asyncio.AbstractEventLoop, transport: _Transport, key: Any,
                           owner: str, token: int, addr: Addr, slot: Optional[_Slot]) -> None:
    """A lease garbage-collected unreleased: its watchdog has stopped (it held the lease
    weakly); end the grant on the lease's loop."""
    try:
        if not loop.is_closed():
            loop.call_soon_threadsafe(_spawn, _release_quietly(transport, key, owner, token, addr,
                                                               slot))
    except RuntimeError:
        pass


async def _watch(ref: "weakref.ref[Lease]") -> None:
    """A lease's watchdog task: sleeps until the next renewal is due, renews, and stops when the
    lease is lost, released or gone."""
    while True:
        lease = ref()
        if lease is None or not lease._watching:
            return
        delay = lease._next_due - monotonic()
        del lease
        if delay > 0:
            await asyncio.sleep(delay)
        lease = ref()
        if lease is None or not lease._watching:
            return
        await lease._tick()
        del lease


class Lease:
    """One grant of one lock (asyncio). See the sync ``redis_flock.Lease``."""

    def __init__(self, flock: "Flock", key: Any, owner: str, token: int, ttl_ms: int,
                 sent: float, renew: bool, addr: Addr, slot: Optional[_Slot] = None) -> None:
        self.key = key
        self.owner = owner
        self.token: int = token
        self.ttl_ms = ttl_ms
        self.bound = slot is not None
        self.lost_reason: Optional[str] = None
        self._t = flock._t
        self._addr = addr
        self._slot = slot
        self._deadline = sent + ttl_ms / 1000.0
        self._io = asyncio.Lock()
        self._lost_evt: Optional[asyncio.Event] = None
        self._lost = False
        self._released = False
        self._released_ok = False
        self._watching = renew
        self._renewing = False
        self._backoff = 0.0
        self._next_due = sent + renew_interval(ttl_ms)
        self._finalizer = weakref.finalize(self, _release_in_background,
                                           asyncio.get_running_loop(), self._t, key, owner,
                                           token, addr, slot)
        self._finalizer.atexit = False
        self._task: Optional["asyncio.Task[None]"] = None
        if renew:
            self._task = asyncio.ensure_future(_watch(weakref.ref(self)))

    def __repr__(self) -> str:
        state = "lost" if self._lost else "released" if self._released else "live"
        return f"<Lease key={self.key!r} owner={self.owner!r} token={self.token} {state}>"

    def _set_lost(self, reason: str) -> None:
        if not self._lost:
            self._lost = True
            self.lost_reason = reason
            self._stop_watchdog()
            if self._lost_evt is not None:
                self._lost_evt.set()

    def _stop_watchdog(self) -> None:
        self._watching = False
        task, self._task = self._task, None
        if task is not None and not self._renewing and task is not asyncio.current_task():
            task.cancel()  # it only sleeps: nothing in flight

    @property
    def lost(self) -> bool:
        if self._lost:
            return True
        if self._released:
            return False
        if monotonic() >= self._deadline:
            self._set_lost("the local deadline passed (rule 1)")
            return True
        return False

    def remaining_ms(self) -> int:
        if self._lost or self._released:
            return 0
        left = ms_left(self._deadline, monotonic())
        if left == 0:
            self.lost  # noqa: B018 (marks it)
        return left

    def ensure(self, min_ms: Number = 0) -> None:
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

    async def wait_lost(self, timeout_ms: Optional[Number] = None) -> bool:
        """Waits until the lease is lost (True) or timeout_ms passed (False; None: no limit)."""
        end = math.inf if timeout_ms is None else monotonic() + timeout_ms / 1000.0
        if self._lost_evt is None:
            self._lost_evt = asyncio.Event()
            if self._lost or self._released:
                self._lost_evt.set()
        while True:
            if self.lost:
                return True
            if self._released:
                return False
            now = monotonic()
            if now >= end:
                return False
            step = min(end, self._deadline) - now
            try:
                await asyncio.wait_for(self._lost_evt.wait(),
                                       None if math.isinf(step) else max(step, 0.0005))
            except asyncio.TimeoutError:
                pass

    async def _io_call(self, *args: Any, timeout: Optional[float] = None) -> Any:
        if self._slot is not None:
            try:
                return await _roundtrip(self._slot.conn, args, timeout, False)
            except _NETWORK_ERRORS:
                self._set_lost("the connection of the BOUND lease failed")
                raise
        reply, addr = await self._t.call(self.key, *args, timeout=timeout, addr=self._addr)
        if addr is not None:
            self._addr = addr
        return reply

    async def check(self) -> int:
        if self._slot is not None:
            async with self._io:
                left = await self._io_call("FLOCK.CHECK", self.key, self.token)
        else:
            left = await self._io_call("FLOCK.CHECK", self.key, self.token)
        if not left:
            self._set_lost("FLOCK.CHECK answered 0: the grant is gone")
            return 0
        return int(left)

    async def renew(self, ttl_ms: Optional[int] = None) -> None:
        ttl = self.ttl_ms if ttl_ms is None else check_ttl(ttl_ms)
        async with self._io:
            await self._renew_locked(ttl, raise_lost=True)

    async def _renew_locked(self, ttl: int, raise_lost: bool) -> bool:
        if self._released:
            if raise_lost:
                raise LockLostError(f"lease of {self.key!r} was released")
            return False
        if self.lost:
            if raise_lost:
                raise LockLostError(f"lease of {self.key!r} is lost: {self.lost_reason}")
            return False
        sent = monotonic()
        reply = await self._io_call("FLOCK.RENEW", self.key, self.owner, ttl, self.token,
                                    timeout=self._deadline - sent)
        if self._released:
            return False
        if reply is None:
            self._set_lost("FLOCK.RENEW answered nil: the grant is gone")
        elif not self._lost:
            self._deadline = sent + ttl / 1000.0
            self.ttl_ms = ttl
        if self._lost and raise_lost:
            raise LockLostError(f"lease of {self.key!r} is lost: {self.lost_reason}")
        return not self._lost

    async def _tick(self) -> None:
        async with self._io:
            if not self._watching:
                return
            self._renewing = True
            sent = monotonic()
            try:
                ok = await self._renew_locked(self.ttl_ms, raise_lost=False)
            except Exception as e:  # network, redirect, LOADING...: retry until the deadline
                if self._slot is not None:
                    self._set_lost(f"the connection of the BOUND lease failed: {e}")
                    return
                self._backoff = min(max(self._backoff * 2, 0.01), 0.25, self.ttl_ms / 12000.0)
                self._next_due = min(monotonic() + self._backoff, self._deadline)
                log.debug("flock: renewal of %r failed (%s); retrying", self.key, e)
                return
            finally:
                self._renewing = False
            self._backoff = 0.0
            if ok:
                self._next_due = sent + renew_interval(self.ttl_ms)

    async def fenced(self, *command: Any) -> Any:
        try:
            if self._slot is not None:
                async with self._io:
                    return await self._io_call("FLOCK.FENCED", self.key, self.token, *command)
            return await self._io_call("FLOCK.FENCED", self.key, self.token, *command)
        except ResponseError as e:
            if is_fenced_refusal(e):
                self._set_lost(f"a fenced write was refused: {e}")
                raise FencedError(str(e)) from e
            raise

    async def release(self) -> bool:
        """Ends the grant (see the sync ``Lease.release``): no renewal starts once release()
        has begun, and one under way is awaited (at most until the local deadline, and at most
        the client's socket_timeout) before the RELEASE is sent; a renewal's reply that comes
        after release() began never marks the lease lost."""
        if self._released:
            return self._released_ok
        if not self._lost and monotonic() >= self._deadline:
            self._set_lost("the local deadline passed (rule 1)")
        self._released = True
        self._stop_watchdog()
        self._finalizer.detach()
        if self._slot is None:
            await self._wait_for_renewal()
        try:
            if self._slot is not None:
                async with self._io:
                    n = await self._release_bound()
            else:
                try:
                    n, _ = await self._t.call(self.key, "FLOCK.RELEASE", self.key, self.owner,
                                              self.token, addr=self._addr)
                except _NETWORK_ERRORS:
                    n, _ = await self._t.call(self.key, "FLOCK.RELEASE", self.key, self.owner,
                                              self.token, addr=self._addr)
                    n = 1 if n == 0 else n  # the first one may have landed
        finally:
            if self._lost_evt is not None:
                self._lost_evt.set()
        if n == 1:
            self._released_ok = True
        else:
            self._set_lost("FLOCK.RELEASE answered 0: the grant had ended")
        return self._released_ok

    async def _wait_for_renewal(self) -> None:
        """Waits (bounded) for a renewal of this lease under way: renewals hold _io from their
        check of _released / _watching to their reply, and both are set, so none can start
        after this. (A BOUND lease's release takes _io for its connection anyway.)"""
        if not self._io.locked():
            return
        wait = renewal_wait_s(self._deadline, monotonic(), self._t.socket_timeout)
        try:
            await asyncio.wait_for(self._io.acquire(), wait)
        except asyncio.TimeoutError:
            log.debug("flock: release of %r did not wait longer than %.3f s for a renewal under "
                      "way", self.key, wait)
            return
        self._io.release()

    async def _release_bound(self) -> int:
        slot, self._slot = self._slot, None
        assert slot is not None
        try:
            n = await _roundtrip(slot.conn, ("FLOCK.RELEASE", self.key, self.owner, self.token),
                                 None, False)
        except _NETWORK_ERRORS:
            await slot.conn.disconnect()
            await slot.give_back()
            self._set_lost("the connection of the BOUND lease failed")
            return 0
        await slot.give_back()
        return int(n)

    async def __aenter__(self) -> "Lease":
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            await self.release()
            if self._lost:
                raise LockLostError(f"lease of {self.key!r} was lost while held: {self.lost_reason}")
            return
        try:
            await self.release()
        except Exception:
            log.warning("flock: release of %r after an error failed", self.key, exc_info=True)


class _LockContext:
    __slots__ = ("_flock", "_args", "_kw", "_lease")

    def __init__(self, flock: "Flock", args: Tuple[Any, ...], kw: Dict[str, Any]) -> None:
        self._flock = flock
        self._args = args
        self._kw = kw
        self._lease: Optional[Lease] = None

    async def __aenter__(self) -> Lease:
        lease = await self._flock.acquire(*self._args, **self._kw)
        if lease is None:
            wait = self._kw.get("wait_ms")
            raise LockBusyError(f"lock {self._args[0]!r} not granted"
                                + (f" within {wait} ms" if wait else " (held by another owner)"))
        self._lease = lease
        return lease

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        lease, self._lease = self._lease, None
        assert lease is not None
        await lease.__aexit__(exc_type, exc, tb)


class Flock:
    """Fenced locks over a ``redis.asyncio`` ``Redis`` or ``RedisCluster`` client."""

    def __init__(self, client: Union["redis.asyncio.Redis", RedisCluster]) -> None:
        self.client: Any = client
        self._t = _Transport(client)

    def lock(self, key: Any, ttl_ms: int, *, wait_ms: Optional[Number] = None,
             shared: bool = False, limit: Optional[int] = None, bound: bool = False,
             renew: bool = True, owner: Optional[str] = None) -> _LockContext:
        """``async with flock.lock(key, ttl_ms) as lease:`` (see the sync ``Flock.lock``)."""
        return _LockContext(self, (key, ttl_ms), dict(
            wait_ms=wait_ms, shared=shared, limit=limit, bound=bound, renew=renew, owner=owner))

    async def acquire(self, key: Any, ttl_ms: int, *, wait_ms: Optional[Number] = None,
                      shared: bool = False, limit: Optional[int] = None, bound: bool = False,
                      renew: bool = True, owner: Optional[str] = None) -> Optional[Lease]:
        ttl = check_ttl(ttl_ms)
        wait_s = wait_seconds(wait_ms)
        extra = kind_args(shared, limit, bound)
        own = owner if owner is not None else new_owner()
        if bound or wait_s is not None:
            start = monotonic()
            if not bound:
                sent = monotonic()
                token, addr = await self._t.call(key, "FLOCK.ACQUIRE", key, own, ttl, *extra,
                                                 attempts=2)
                if token is not None:
                    return Lease(self, key, own, int(token), ttl, sent, renew, addr)
            return await self._acquire_dedicated(key, own, ttl, extra, wait_s, start, bound,
                                                 renew, owner is None)
        sent = monotonic()
        token, addr = await self._t.call(key, "FLOCK.ACQUIRE", key, own, ttl, *extra, attempts=2)
        if token is None:
            return None
        return Lease(self, key, own, int(token), ttl, sent, renew, addr)

    async def _acquire_dedicated(self, key: Any, owner: str, ttl: int, extra: List[Any],
                                 wait_s: Optional[float], start: float, bound: bool,
                                 renew: bool, own_owner: bool) -> Optional[Lease]:
        end = math.inf if wait_s is None or math.isinf(wait_s) else start + wait_s
        addr: Addr = None
        asking = False
        redirects = 0
        failures = 0
        while True:
            left = end - monotonic()
            if wait_s is not None and left <= 0:
                return None
            slot = await self._t.checkout(key, addr)
            keep = False
            try:
                if wait_s is None:
                    sent = monotonic()
                    token = await _roundtrip(slot.conn, ("FLOCK.ACQUIRE", key, owner, ttl, *extra),
                                             None, asking)
                    if token is None:
                        return None
                else:
                    timeout = left + BLOCK_REPLY_MARGIN_S if not math.isinf(left) else math.inf
                    token = await _roundtrip(slot.conn, ("FLOCK.ACQUIRE", key, owner, ttl, *extra,
                                                         "BLOCK", block_ms(left)), timeout, asking)
                    if token is None:
                        return None
                    sent = monotonic()  # rule 1: renew at once, count from this RENEW
                    again = await _roundtrip(slot.conn, ("FLOCK.RENEW", key, owner, ttl, token),
                                             ttl / 1000.0, asking)
                    if again is None:
                        continue
                keep = bound
                return Lease(self, key, owner, int(token), ttl, sent, renew, addr,
                             slot=slot if bound else None)
            except MovedError as e:
                addr, asking = (e.host, int(e.port)), False
            except AskError as e:
                addr, asking = (e.host, int(e.port)), True
            except _REROUTE_ERRORS:
                addr, asking = None, False
                await asyncio.sleep(min(0.2, 0.01 * (1 << min(redirects, 5))))
            except _NETWORK_ERRORS:
                failures += 1
                if failures >= 2:
                    if own_owner:
                        _spawn(_release_quietly(self._t, key, owner, None, addr))
                    raise
                continue
            except asyncio.CancelledError:
                # a grant whose reply was cut off must not stay held until its ttl
                if own_owner:
                    _spawn(_release_quietly(self._t, key, owner, None, addr))
                raise
            finally:
                if not keep:
                    await slot.give_back()
            redirects += 1
            if redirects > _MAX_REDIRECTS and wait_s is None:
                raise ConnectionError("flock: too many redirects for FLOCK.ACQUIRE")
            if redirects > 4:  # a cluster in flux: do not spin
                await asyncio.sleep(min(0.2, 0.01 * (1 << min(redirects - 4, 5))))

    async def release(self, key: Any, owner: str, token: Optional[int] = None) -> bool:
        args: List[Any] = ["FLOCK.RELEASE", key, owner]
        if token is not None:
            args.append(token)
        return bool(await self.client.execute_command(*args))

    async def revoke(self, key: Any, owner: Optional[str] = None) -> int:
        args: List[Any] = ["FLOCK.REVOKE", key]
        if owner is not None:
            args.append(owner)
        return int(await self.client.execute_command(*args))
