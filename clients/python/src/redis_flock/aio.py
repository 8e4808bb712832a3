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

A driver of the lease core (``_core``), as the sync client is: it awaits the core's commands
and the ops of its plans. All of a lease's state is touched on its loop's thread only, so the
state needs no lock.
"""
from __future__ import annotations

import asyncio
import inspect
import math
import sys
import threading
import weakref
from typing import Any, Dict, List, NoReturn, Optional, Set, Tuple, Union

import redis.asyncio
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError, ResponseError, TimeoutError

from ._core import (
    NETWORK_ERRORS,
    ROUTE_ERRORS,
    WAIT,
    WAITAOF_PROBE,
    Addr,
    Checkout,
    Disconnect,
    Durability,
    FencedError,
    FlockError,
    Forget,
    InvalidArgumentError,
    GiveBack,
    Grant,
    LeaseCore,
    LeaseTooShortError,
    LockBusyError,
    LockLostError,
    LockNotDurableError,
    Number,
    Plan,
    Send,
    SendAll,
    Sleep,
    acquire_command,
    acquire_wait_plan,
    busy_error,
    check_flag,
    check_ttl,
    checked_release_args,
    durability,
    has_waitaof,
    log,
    monotonic,
    new_owner,
    no_waitaof_error,
    on_acquire_reply,
    refuse_unknown,
    release_quietly,
    renewal_wait_s,
    revoke_args,
    routed_all,
    routed_call,
    socket_timeout_of,
)
from ._election import Emit, Leader, campaign_args, leader_of, observe_plan
from ._inspect import (
    Holder,
    Waiter,
    check_command,
    holders_command,
    info_command,
    on_holders,
    on_info,
    on_locked,
    on_stats,
    on_waiters,
    stats_command,
    waiters_command,
)
from ._many import (
    acquire_many_command,
    acquire_many_plan,
    link_bound_set,
    many_busy_error,
    many_parts,
    raise_after_release_all,
)
from ._watch import (
    WATCH_AFTER_S,
    AwaitWork,
    Lane,
    Tracker,
    as_bytes,
    busy_on_self,
    lane_plan,
    next_refresh,
)

__all__ = [
    "Flock",
    "Lease",
    "FlockError",
    "LockBusyError",
    "LockLostError",
    "LeaseTooShortError",
    "FencedError",
    "LockNotDurableError",
    "InvalidArgumentError",
    "Holder",
    "Waiter",
    "Leader",
    "Election",
]

#: tasks started in the background (a strong reference, so that they are not collected)
_background: Set["asyncio.Task[Any]"] = set()


async def _maybe_await(x: Any) -> Any:
    if inspect.isawaitable(x):
        return await x
    return x


#: asyncio.timeout (Python 3.11.3 and later, as redis-py uses it): a time limit without a task of
#: its own; before that, asyncio.wait_for (one task per limit)
_timeout: Any = asyncio.timeout if sys.version_info >= (3, 11, 3) else None


async def _read(conn: Any, timeout: Optional[float]) -> Any:
    """The reply of the command just sent (timeout as in ``_core.Send``)."""
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


async def _read_replies(conn: Any, n: int) -> List[Any]:
    """The replies of the n commands just sent, an error reply in its place (no time limit of
    its own: the caller bounds it)."""
    out: List[Any] = []
    for _ in range(n):
        try:
            out.append(await conn.read_response(timeout=math.inf))
        except ResponseError as e:
            out.append(e)
    return out


async def _send_all(conn: Any, commands: Tuple[Tuple[Any, ...], ...], timeout: float,
                    asking: bool) -> List[Any]:
    """``_core.SendAll``: the commands in one write, their replies (an error reply in its
    place) read within timeout in all: one time limit around all the reads (a durable round
    trip's ACQUIRE and WAIT), not a task and a timer per reply."""
    if asking:
        commands = (("ASKING",),) + commands
    await conn.send_packed_command(conn.pack_commands(commands))
    if timeout <= 0:
        await conn.disconnect()
        raise TimeoutError("flock: no reply in time")
    try:
        # a cancelled read disconnects (redis-py closes the connection on BaseException)
        if math.isinf(timeout):
            out = await _read_replies(conn, len(commands))
        elif _timeout is not None:
            async with _timeout(timeout):
                out = await _read_replies(conn, len(commands))
        else:
            out = await asyncio.wait_for(_read_replies(conn, len(commands)), timeout)
    except asyncio.TimeoutError:
        await conn.disconnect()
        raise TimeoutError("flock: no reply in time") from None
    if asking:
        if isinstance(out[0], Exception):
            raise out[0]
        del out[0]
    return out


async def _get_connection(pool: Any) -> Any:
    try:
        return await pool.get_connection()
    except TypeError:  # redis-py 5.0-5.2 wants a command name
        return await pool.get_connection("FLOCK")


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


class _SharedSlot(_Slot):
    """The one connection that the BOUND leases of one lock_many share: given back with the
    last of them."""
    __slots__ = ("_left",)

    def __init__(self, conn: Any, pool: Any, node: Any, n: int) -> None:
        super().__init__(conn, pool, node)
        self._left = n

    async def give_back(self) -> None:
        self._left -= 1
        if self._left == 0:
            await super().give_back()


def _spawn(coro: Any) -> None:
    task = asyncio.ensure_future(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)


class _Transport:
    """Carries out the core's ops for one client, awaiting them."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.cluster = isinstance(client, RedisCluster)
        #: the client's socket_timeout (None: none): bounds release()'s wait for a renewal
        self.socket_timeout = socket_timeout_of(client)
        #: whether the server has WAITAOF (fsync=True); None: not asked yet
        self.waitaof: Optional[bool] = None

    async def checkout(self, key: Any, addr: Addr) -> _Slot:
        if not self.cluster:
            pool = self.client.connection_pool
            return _Slot(await _get_connection(pool), pool=pool)
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

    async def call(self, key: Any, args: Tuple[Any, ...], timeout: Optional[float] = None,
                   addr: Addr = None, attempts: int = 1) -> Tuple[Any, Addr]:
        """``_core.routed_call`` with its first try made here, without a plan: one round trip
        on a connection of the key's pool (or node); only a redirect or a network error hands
        over to the plan. Returns (reply, address it came from)."""
        if not self.cluster:
            pool = self.client.connection_pool
            try:  # (as _get_connection, without its coroutine: this is the hot path)
                conn = await pool.get_connection()
            except TypeError:
                conn = await pool.get_connection("FLOCK")
            try:
                return await _roundtrip(conn, args, timeout, False), addr
            except ROUTE_ERRORS as e:
                plan = routed_call(key, args, timeout, addr, attempts, e)
            finally:
                released = pool.release(conn)
                if released is not None:  # a coroutine in the redis-py versions that lock the pool
                    await released
        else:
            slot = await self.checkout(key, addr)
            try:
                return await _roundtrip(slot.conn, args, timeout, False), addr
            except ROUTE_ERRORS as e:
                plan = routed_call(key, args, timeout, addr, attempts, e)
            finally:
                await slot.give_back()
        return await self.run(plan)

    async def perform(self, op: Any) -> Any:
        """One op of a plan, awaited."""
        kind = type(op)
        if kind is Send:
            return await _roundtrip(op.slot.conn, op.args, op.timeout, op.asking)
        if kind is SendAll:
            return await _send_all(op.slot.conn, op.commands, op.timeout, op.asking)
        if kind is Checkout:
            return await self.checkout(op.key, op.addr)
        if kind is GiveBack:
            await op.slot.give_back()
        elif kind is Disconnect:
            await op.slot.conn.disconnect()
        elif kind is Sleep:
            await asyncio.sleep(op.seconds)
        elif kind is AwaitWork:
            try:
                await asyncio.wait_for(op.lane.event.wait(), op.seconds)
            except asyncio.TimeoutError:
                pass
            op.lane.event.clear()
        elif kind is Forget:
            # in a task: this may run while the caller is being cancelled
            _spawn(_release_quietly(self, op.key, op.owner, None, op.addr))
        else:
            raise TypeError(f"flock: no asyncio meaning for {op!r}")
        return None

    async def run(self, plan: Plan) -> Any:
        """Runs a plan to its end: each op's result is sent back into it, each op's exception
        (cancellation too: the plan's finally clauses give connections back) thrown in."""
        perform = self.perform
        reply: Any = None
        error: Optional[BaseException] = None
        try:
            while True:
                try:
                    op = plan.send(reply) if error is None else plan.throw(error)
                except StopIteration as done:
                    return done.value
                try:
                    reply, error = await perform(op), None
                except BaseException as e:
                    reply, error = None, e
        finally:
            # An error raised out of here holds this frame in its traceback: the frame must
            # not hold the error in turn (a cycle that only the gc would break).
            error = None


async def _release_quietly(transport: _Transport, key: Any, owner: str, token: Optional[int],
                           addr: Addr, slot: Optional[_Slot] = None) -> None:
    try:
        await transport.run(release_quietly(key, owner, token, addr, slot))
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


class Lease(LeaseCore):
    """One grant of one lock (asyncio). See the sync ``redis_flock.Lease``."""

    def __init__(self, flock: "Flock", grant: Grant, renew: bool,
                 durable: Optional[Durability] = None) -> None:
        self._state = threading.Lock()  # never contended: cheaper than NO_LOCK (see LeaseCore)
        super().__init__(grant, renew, durable)
        self._t = flock._t
        self._io = asyncio.Lock()  # one RENEW at a time (and the bound connection)
        self._lost_evt: Optional[asyncio.Event] = None  # made by the first wait_lost()
        self._renewing = False
        self._finalizer = weakref.finalize(self, _release_in_background,
                                           asyncio.get_running_loop(), self._t, self.key,
                                           self.owner, self.token, self._addr, self._slot)
        self._finalizer.atexit = False
        self._loop = asyncio.get_running_loop()
        self._task: Optional["asyncio.Task[None]"] = None
        if renew:
            self._task = asyncio.ensure_future(_watch(weakref.ref(self)))

    def _on_lost(self) -> None:
        self._stop_watchdog()
        if self._lost_evt is not None:
            self._lost_evt.set()
        if self._callbacks:
            self._loop.call_soon(self._run_callbacks, self._take_callbacks())

    def _stop_watchdog(self) -> None:
        self._watching = False
        task, self._task = self._task, None
        if task is not None and not self._renewing and task is not asyncio.current_task():
            task.cancel()  # it only sleeps: nothing in flight

    async def _io_call(self, *args: Any, timeout: Optional[float] = None) -> Any:
        """A command about this grant, on the bound connection or routed to the grant's node
        (timeout as in ``_core.Send``). Every command about the grant passes here."""
        slot = self._slot
        if slot is not None:
            try:
                return await _roundtrip(slot.conn, args, timeout, False)
            except NETWORK_ERRORS:
                self._bound_failed()
                raise
        reply, addr = await self._t.call(self.key, args, timeout, self._addr)
        if addr is not None:  # redirected: the grant's commands go there from now on
            self._addr = addr
        return reply

    def _bound_io(self) -> Any:
        """The lock a command takes: a BOUND lease's connection carries one command at a time."""
        return self._io if self._slot is not None else _NO_ASYNC_LOCK

    async def wait_lost(self, timeout_ms: Optional[Number] = None) -> bool:
        """Waits until the lease is lost (True) or timeout_ms passed (False; None: no limit)."""
        end = self._wait_end(timeout_ms)
        if self._lost_evt is None:
            self._lost_evt = asyncio.Event()
            if self._lost or self._released:
                self._lost_evt.set()
        while True:
            done, step = self._wait_lost_step(end)
            if done is not None:
                return done
            try:
                await asyncio.wait_for(self._lost_evt.wait(), step)
            except asyncio.TimeoutError:
                pass

    async def check(self) -> int:
        """See the sync ``Lease.check``."""
        if self._released:
            return 0
        async with self._bound_io():
            return self._on_check_reply(await self._io_call(*self._check_command()))

    async def holders(self) -> List[Holder]:
        """Every live grant of this lease's key (FLOCK.HOLDERS), oldest first."""
        async with self._bound_io():
            return on_holders(await self._io_call(*holders_command(self.key)))

    async def renew(self, ttl_ms: Optional[int] = None) -> None:
        ttl = self.ttl_ms if ttl_ms is None else check_ttl(ttl_ms)
        async with self._io:
            await self._renew_once(ttl, True)

    async def _renew_once(self, ttl: int, raise_lost: bool) -> bool:
        """One RENEW (the caller holds _io): True renewed, False lost (or released)."""
        if self._durable is not None:
            return await self._renew_durably(ttl, raise_lost)
        command = self._renew_command(ttl, raise_lost)
        if command is None:
            return False
        args, timeout, sent = command
        return self._on_renew_reply(await self._io_call(*args, timeout=timeout), sent, ttl,
                                    raise_lost)

    async def _renew_durably(self, ttl: int, raise_lost: bool) -> bool:
        """One RENEW pipelined with its WAIT / WAITAOF on a connection of the grant's node."""
        commands = self._durable_renew_commands(ttl, raise_lost)
        if commands is None:
            return False
        pair, timeout, sent, wait_ms = commands
        replies, addr = await self._t.run(routed_all(self.key, pair, timeout, self._addr))
        if addr is not None:  # redirected: the grant's commands go there from now on
            self._addr = addr
        return self._on_durable_renew_replies(replies, sent, ttl, wait_ms, raise_lost)

    async def _tick(self) -> None:
        """The watchdog task's renewal; the task reads _next_due and _watching afterwards."""
        async with self._io:
            if not self._watching:
                return
            self._renewing = True  # the task is busy: losing the lease must not cancel it
            try:
                sent = monotonic()
                try:
                    ok = await self._renew_once(self.ttl_ms, False)
                except Exception as e:
                    self._on_watchdog_error(e)
                else:
                    self._on_watchdog_renewed(ok, sent)
            finally:
                self._renewing = False

    async def fenced(self, *command: Any) -> Any:
        async with self._bound_io():
            try:
                return await self._io_call(*self._fenced_command(command))
            except ResponseError as e:
                self._on_fenced_error(e)
                raise

    async def release(self) -> bool:
        """Ends the grant (see the sync ``Lease.release``): no renewal starts once release()
        has begun, and one under way is awaited (at most until the local deadline, and at most
        the client's socket_timeout) before the RELEASE is sent; a renewal's reply that comes
        after release() began never marks the lease lost. A reentrant lease held more than
        once only drops a hold (rule 11)."""
        if self._holds > 1 and self._drop_hold():
            return True
        first, _ = self._begin_release()
        if not first:
            return self._released_ok
        self._stop_watchdog()
        self._finalizer.detach()
        self._untrack()
        if self._slot is None and self._io.locked():
            await self._wait_for_renewal()
        try:
            if self._slot is None:
                try:
                    n, _ = await self._t.call(self.key, self._release_command(), None,
                                              self._addr)
                except NETWORK_ERRORS:
                    n = await self._t.run(self._release_retry_plan())
            else:
                async with self._io:
                    n = await self._t.run(self._release_bound_plan())
        finally:
            if self._lost_evt is not None:
                self._lost_evt.set()
        return self._end_release(n)

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

    async def __aenter__(self) -> "Lease":
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            await self.release()
            if self._lost:
                raise self._lost_while_held()
            return
        try:
            await self.release()
        except Exception:
            log.warning("flock: release of %r after an error failed", self.key, exc_info=True)


class _NoAsyncLock:
    """``async with`` that takes nothing (a lease without a connection of its own)."""

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *a: Any) -> None:
        return None


_NO_ASYNC_LOCK = _NoAsyncLock()


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
            raise busy_error(self._args[0], self._kw.get("wait_ms"))
        self._lease = lease
        return lease

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        lease, self._lease = self._lease, None
        assert lease is not None
        await lease.__aexit__(exc_type, exc, tb)


class _ManyContext:
    """``flock.lock_many()``: the leases of every key, released together on leaving."""
    __slots__ = ("_flock", "_args", "_kw", "_leases")

    def __init__(self, flock: "Flock", args: Tuple[Any, ...], kw: Dict[str, Any]) -> None:
        self._flock = flock
        self._args = args
        self._kw = kw
        self._leases: Optional[List[Lease]] = None

    async def __aenter__(self) -> List[Lease]:
        leases = await self._flock.acquire_many(*self._args, **self._kw)
        if leases is None:
            raise many_busy_error(self._args[0], self._kw.get("wait_ms"))
        self._leases = leases
        return list(leases)

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        leases, self._leases = self._leases, None
        assert leases is not None
        first: Optional[BaseException] = None
        for lease in leases:  # every one is released, whatever happens to the others
            try:
                await lease.release()
            except Exception as e:
                if exc_type is not None:
                    log.warning("flock: release of %r after an error failed", lease.key,
                                exc_info=True)
                elif first is None:
                    first = e
        raise_after_release_all(leases, first, exc_type)


class Observer:
    """``election.observe()`` (asyncio): an async iterator of leader changes (see the sync
    ``Observer``); ``close()`` or leaving its ``async with`` block ends it."""

    def __init__(self, transport: _Transport, key: Any) -> None:
        self._t = transport
        self._plan = observe_plan(key)
        self._slot: Optional[_Slot] = None
        self._closed = False

    def __aiter__(self) -> "Observer":
        return self

    async def __anext__(self) -> Optional[Leader]:
        reply: Any = None
        error: Optional[BaseException] = None
        while True:
            if self._closed:
                raise StopAsyncIteration
            op = self._plan.send(reply) if error is None else self._plan.throw(error)
            if type(op) is Emit:
                return op.value
            try:
                reply, error = await self._t.perform(op), None
            except asyncio.CancelledError:
                await self.close()
                raise
            except Exception as e:
                if self._closed:
                    raise StopAsyncIteration from None
                reply, error = None, e
            if type(op) is Checkout:
                self._slot = reply
            elif type(op) is GiveBack:
                self._slot = None

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        slot, self._slot = self._slot, None
        if slot is not None:
            await slot.conn.disconnect()
            await slot.give_back()

    async def __aenter__(self) -> "Observer":
        return self

    async def __aexit__(self, *a: Any) -> None:
        await self.close()


class Election:
    """Leader election over one key (asyncio; see the sync ``Election``)."""

    def __init__(self, flock: "Flock", key: Any, ttl_ms: int, owner: Optional[str]) -> None:
        acquire_command(key, ttl_ms, None, False, None, True, owner)  # checks (rule 12)
        self._flock, self.key, self.ttl_ms, self.owner = flock, key, ttl_ms, owner
        self.lease: Optional[Lease] = None

    async def campaign(self, wait_ms: Optional[Number] = None) -> Lease:
        lease = await self._flock.acquire(self.key, self.ttl_ms,
                                          wait_ms=campaign_args(wait_ms)[0], bound=True,
                                          owner=self.owner)
        if lease is None:
            raise busy_error(self.key, wait_ms)
        self.lease = lease
        return lease

    async def leader(self) -> Optional[Leader]:
        return leader_of(await self._flock._read(self.key, info_command(self.key)))

    def observe(self) -> Observer:
        return Observer(self._flock._t, self.key)

    async def resign(self) -> bool:
        lease, self.lease = self.lease, None
        return await lease.release() if lease is not None else False


class Flock:
    """Fenced locks over a ``redis.asyncio`` ``Redis`` or ``RedisCluster`` client. Use one
    Flock from one event loop (its watch lanes are tasks of that loop)."""

    def __init__(self, client: Union["redis.asyncio.Redis", RedisCluster]) -> None:
        self.client: Any = client
        self._t = _Transport(client)
        #: the live leases handed out, per key (rule 11) and per watch lane (rule 9)
        self._track = Tracker(self._t.cluster)
        #: reentrant=True without an owner: one owner per task
        self._task_owners: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
        self._refresh_due: Optional[float] = None
        self._refresh_handle: Any = None

    def lock(self, key: Any, ttl_ms: int, *, wait_ms: Optional[Number] = None,
             shared: bool = False, limit: Optional[int] = None, bound: bool = False,
             renew: bool = True, owner: Optional[str] = None, reentrant: bool = False,
             replicas: int = 0, fsync: bool = False, durable_timeout_ms: Optional[int] = None,
             **unknown: NoReturn) -> _LockContext:
        """``async with flock.lock(key, ttl_ms) as lease:`` (see the sync ``Flock.lock``)."""
        refuse_unknown(unknown)
        return _LockContext(self, (key, ttl_ms), dict(
            wait_ms=wait_ms, shared=shared, limit=limit, bound=bound, renew=renew, owner=owner,
            reentrant=reentrant, replicas=replicas, fsync=fsync,
            durable_timeout_ms=durable_timeout_ms))

    async def acquire(self, key: Any, ttl_ms: int, *, wait_ms: Optional[Number] = None,
                      shared: bool = False, limit: Optional[int] = None, bound: bool = False,
                      renew: bool = True, owner: Optional[str] = None, reentrant: bool = False,
                      replicas: int = 0, fsync: bool = False,
                      durable_timeout_ms: Optional[int] = None, **unknown: NoReturn
                      ) -> Optional[Lease]:
        """See the sync ``Flock.acquire`` (rule 11 with one owner per task instead of per
        thread; durable grants included)."""
        if unknown:
            refuse_unknown(unknown)
        if renew is not True and renew is not False:
            check_flag("renew", renew)
        own_owner = owner is None
        ctx = asyncio.current_task()
        if reentrant is not False:
            check_flag("reentrant", reentrant)
            if owner is None:
                owner = self._task_owner(ctx)
        command, wait_s = acquire_command(key, ttl_ms, wait_ms, shared, limit, bound, owner)
        again, own_wait = self._track.reenter(as_bytes(key), owner, ctx, reentrant, command[4:])
        if again is not None:
            return again
        if own_wait and wait_s is not None:
            wait_s = None  # one try: a wait would wait on this task's own lease
        durable = durability(replicas, fsync, durable_timeout_ms, command[3], bound)
        sent = monotonic()
        grant = WAIT
        if durable is not None:
            if durable.fsync:
                await self._check_waitaof(key)
                sent = monotonic()
        elif not bound:  # the first try: one call on the shared pool (see acquire_command)
            reply, addr = await self._t.call(key, command, None, None, 2)
            grant = on_acquire_reply(command, wait_s, reply, sent, addr)
        if grant is WAIT:
            grant = await self._t.run(acquire_wait_plan(command, wait_s, sent, bound,
                                                        own_owner, durable))
        if grant is None:
            if own_wait and wait_ms:
                raise busy_on_self(key)
            return None
        return self._new_lease(grant, renew, durable, command[4:], ctx)

    def _new_lease(self, grant: Grant, renew: bool, durable: Optional[Durability],
                   kind: Tuple[Any, ...], ctx: Any) -> Lease:
        """A Lease of a grant, tracked (rule 11) and watched (rule 9)."""
        lease = Lease(self, grant, renew, durable)
        lease._kind, lease._ctx, lease._tracker = kind, ctx, self._track
        lane = self._track.add(lease)
        if lane is not None:
            self._start_lane(lane)
        due = lease._born + WATCH_AFTER_S
        if self._refresh_due is None or due < self._refresh_due:
            self._schedule_refresh(due)
        return lease

    def lock_many(self, keys: Any, ttl_ms: int, *, wait_ms: Optional[Number] = None,
                  bound: bool = False, renew: bool = True, owner: Optional[str] = None,
                  replicas: int = 0, fsync: bool = False,
                  durable_timeout_ms: Optional[int] = None,
                  **unknown: NoReturn) -> "_ManyContext":
        """``async with flock.lock_many(keys, ttl_ms) as leases:`` (see the sync
        ``Flock.lock_many``)."""
        refuse_unknown(unknown)
        command, _ = acquire_many_command(keys, ttl_ms, wait_ms, owner, bound)  # rule 12
        durability(replicas, fsync, durable_timeout_ms, many_parts(command)[2], bound)
        return _ManyContext(self, (keys, ttl_ms), dict(
            wait_ms=wait_ms, bound=bound, renew=renew, owner=owner, replicas=replicas,
            fsync=fsync, durable_timeout_ms=durable_timeout_ms))

    async def acquire_many(self, keys: Any, ttl_ms: int, *, wait_ms: Optional[Number] = None,
                           bound: bool = False, renew: bool = True,
                           owner: Optional[str] = None, replicas: int = 0, fsync: bool = False,
                           durable_timeout_ms: Optional[int] = None,
                           **unknown: NoReturn) -> Optional[List[Lease]]:
        """See the sync ``Flock.acquire_many`` (rule 11 per task instead of per thread)."""
        if unknown:
            refuse_unknown(unknown)
        if renew is not True and renew is not False:
            check_flag("renew", renew)
        command, wait_s = acquire_many_command(keys, ttl_ms, wait_ms, owner, bound)
        keys_, _, ttl = many_parts(command)
        durable = durability(replicas, fsync, durable_timeout_ms, ttl, bound)
        ctx = asyncio.current_task()
        own_key = None
        for key in keys_:
            if self._track.reenter(as_bytes(key), owner, ctx, False, ())[1]:
                own_key = key
        if own_key is not None and wait_s is not None:
            wait_s = None  # one try: a wait would wait on this task's own lease
        if durable is not None and durable.fsync:
            await self._check_waitaof(keys_[0])
        grants = await self._t.run(acquire_many_plan(command, wait_s, monotonic(),
                                                     owner is None, durable))
        if grants is None:
            if own_key is not None and wait_ms:
                raise busy_on_self(own_key)
            return None
        if bound:  # one connection for them all: given back with the last release
            slot = grants[0][6]
            shared = _SharedSlot(slot.conn, slot._pool, slot._node, len(grants))
            grants = [g[:6] + (shared,) for g in grants]
        leases = [self._new_lease(g, renew, durable, (), ctx) for g in grants]
        if bound:
            link_bound_set(leases)
        return leases

    def _task_owner(self, task: Any) -> str:
        if task is None:
            return new_owner()
        own = self._task_owners.get(task)
        if own is None:
            own = self._task_owners[task] = new_owner()
        return own

    # -- rule 9: the watch lanes -------------------------------------------------------------
    def _start_lane(self, lane: Lane) -> None:
        lane.event = asyncio.Event()
        _spawn(self._run_lane(lane))

    async def _run_lane(self, lane: Lane) -> None:
        try:
            await self._t.run(lane_plan(lane))
        except asyncio.CancelledError:
            lane.running = False
            raise
        except BaseException:
            log.exception("flock: the watch of %r ended", lane.key)
            lane.running = False

    def _schedule_refresh(self, due: float) -> None:
        if self._refresh_due is not None and self._refresh_due <= due:
            return
        if self._refresh_handle is not None:
            self._refresh_handle.cancel()
        self._refresh_due = due
        self._refresh_handle = asyncio.get_running_loop().call_later(
            max(due - monotonic(), 0.0), _spawn_refresh, weakref.ref(self))

    async def _refresh(self) -> None:
        """Makes every lane's WATCH name the leases old enough to watch (see ``_watch``)."""
        self._refresh_due = self._refresh_handle = None
        todo, soonest = next_refresh(list(self._track.lanes.values()), monotonic())
        if soonest is not None:
            self._schedule_refresh(soonest)
        for lane, action in todo:
            if action == "wake":
                lane.event.set()
                continue
            try:
                await self._t.call(lane.key, ("CLIENT", "UNBLOCK", lane.client_id), None,
                                   lane.addr)
            except Exception as e:  # (a refused CLIENT: the WATCH's own timeout re-arms it)
                log.debug("flock: CLIENT UNBLOCK of the watch failed: %s", e)

    async def _check_waitaof(self, key: Any) -> None:
        """fsync=True needs WAITAOF: asked of the server once per client (COMMAND INFO)."""
        if self._t.waitaof is None:
            reply, _ = await self._t.call(key, WAITAOF_PROBE, None, None, 2)
            self._t.waitaof = has_waitaof(reply)
        if not self._t.waitaof:
            raise no_waitaof_error(key)

    async def release(self, key: Any, owner: str, token: Optional[int] = None) -> bool:
        args = checked_release_args(key, owner, token)
        return bool((await self._t.call(key, args, None, None, 2))[0])

    async def revoke(self, key: Any, owner: Optional[str] = None) -> int:
        args = revoke_args(key, owner)
        return int((await self._t.call(key, args))[0])

    def election(self, key: Any, ttl_ms: int, *, owner: Optional[str] = None) -> Election:
        """Leader election over key (see the sync ``Flock.election``)."""
        return Election(self, key, ttl_ms, owner)

    # -- inspection: no lease needed (see the sync Flock) -----------------------------------------
    async def _read(self, key: Any, args: Tuple[Any, ...]) -> Any:
        return (await self._t.call(key, args, None, None, 2))[0]

    async def info(self, key: Any) -> Optional[Dict[str, Any]]:
        return on_info(await self._read(key, info_command(key)))

    async def holders(self, key: Any) -> List[Holder]:
        return on_holders(await self._read(key, holders_command(key)))

    async def waiters(self, key: Any, count: Optional[int] = None) -> List[Waiter]:
        return on_waiters(await self._read(key, waiters_command(key, count)))

    async def locked(self, key: Any) -> bool:
        return on_locked(await self._read(key, info_command(key)))

    async def check(self, key: Any, token: int) -> int:
        return int(await self._read(key, check_command(key, token)))

    async def stats(self, *classes: Any) -> Dict[str, Any]:
        args = stats_command(classes)
        if self._t.cluster:
            return on_stats(await self._read(classes[0] if classes else "flock", args))
        return on_stats(await self.client.execute_command(*args))


def _spawn_refresh(ref: "weakref.ref[Flock]") -> None:
    flock = ref()
    if flock is not None:
        _spawn(flock._refresh())
