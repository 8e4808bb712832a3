"""The synchronous client: ``Flock`` over redis-py ``Redis`` or ``RedisCluster``.

A driver of the lease core (``_core``): it sends the core's commands and carries out the ops of
its plans with blocking calls on connections of redis-py's pools, renews leases on a few
watchdog threads, and guards each lease's state with a lock (those threads share it with the
caller's).
"""
from __future__ import annotations

import functools
import heapq
import itertools
import math
import os
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, NoReturn, Optional, Tuple, Union

import redis
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError, ResponseError, TimeoutError

from ._core import (
    NETWORK_ERRORS,
    NO_LOCK,
    ROUTE_ERRORS,
    WAIT,
    WAITAOF_PROBE,
    Addr,
    Checkout,
    Disconnect,
    Durability,
    Forget,
    GiveBack,
    Grant,
    LeaseCore,
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
    release_args,
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
    SharedPool,
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


# --- raw calls on a connection of our own ----------------------------------------------------

def _read(conn: Any, timeout: Optional[float]) -> Any:
    """The reply of the command just sent (timeout as in ``_core.Send``)."""
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


def _send_all(conn: Any, commands: Tuple[Tuple[Any, ...], ...], timeout: float,
              asking: bool) -> List[Any]:
    """``_core.SendAll``: the commands in one write, their replies (an error reply in its
    place) read within timeout in all."""
    if asking:
        commands = (("ASKING",),) + commands
    conn.send_packed_command(conn.pack_commands(commands))
    end = monotonic() + timeout
    out: List[Any] = []
    for _ in commands:
        try:
            out.append(_read(conn, end - monotonic()))
        except ResponseError as e:
            out.append(e)
    if asking:
        if isinstance(out[0], Exception):
            raise out[0]
        del out[0]
    return out


def _get_connection(pool: Any) -> Any:
    try:
        return pool.get_connection()
    except TypeError:  # redis-py 5.0-5.2 wants a command name
        return pool.get_connection("FLOCK")


class _Slot:
    """A connection checked out for one call (or one BOUND lease), and its pool."""
    __slots__ = ("conn", "pool")

    def __init__(self, conn: Any, pool: Any) -> None:
        self.conn, self.pool = conn, pool


class _Transport:
    """Carries out the core's ops for one client: a key's connections come from the client's
    pool (Redis) or the pool of the node that serves the key's slot (RedisCluster)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.cluster = isinstance(client, RedisCluster)
        #: the client's socket_timeout (None: none): bounds release()'s wait for a renewal
        self.socket_timeout = socket_timeout_of(client)
        #: whether the server has WAITAOF (fsync=True); None: not asked yet
        self.waitaof: Optional[bool] = None

    def _pool(self, key: Any, addr: Addr) -> Any:
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

    def checkout(self, key: Any, addr: Addr) -> _Slot:
        pool = self._pool(key, addr)
        return _Slot(_get_connection(pool), pool)

    def call(self, key: Any, args: Tuple[Any, ...], timeout: Optional[float] = None,
             addr: Addr = None, attempts: int = 1) -> Tuple[Any, Addr]:
        """``_core.routed_call`` with its first try made here, without a plan: one round trip
        on a connection of the key's pool; only a redirect or a network error hands over to
        the plan. Returns (reply, address it came from)."""
        pool = self.client.connection_pool if not self.cluster else self._pool(key, addr)
        try:  # (as _get_connection, without its call: this is the hot path)
            conn = pool.get_connection()
        except TypeError:
            conn = pool.get_connection("FLOCK")
        try:
            return _roundtrip(conn, args, timeout, False), addr
        except ROUTE_ERRORS as e:
            plan = routed_call(key, args, timeout, addr, attempts, e)
        finally:
            pool.release(conn)
        return self.run(plan)

    def perform(self, op: Any) -> Any:
        """One op of a plan, as a blocking call."""
        kind = type(op)
        if kind is Send:
            return _roundtrip(op.slot.conn, op.args, op.timeout, op.asking)
        if kind is SendAll:
            return _send_all(op.slot.conn, op.commands, op.timeout, op.asking)
        if kind is Checkout:
            return self.checkout(op.key, op.addr)
        if kind is GiveBack:
            op.slot.pool.release(op.slot.conn)
        elif kind is Disconnect:
            op.slot.conn.disconnect()
        elif kind is Sleep:
            time.sleep(op.seconds)
        elif kind is AwaitWork:
            op.lane.event.wait(op.seconds)
            op.lane.event.clear()
        elif kind is Forget:
            try:  # at once: a sync caller waits for the error anyway
                self.call(op.key, release_args(op.key, op.owner, None), addr=op.addr)
            except Exception:
                pass
        else:
            raise TypeError(f"flock: no sync meaning for {op!r}")
        return None

    def run(self, plan: Plan) -> Any:
        """Runs a plan to its end: each op's result is sent back into it, each op's exception
        (any BaseException: the plan's finally clauses give connections back) thrown in."""
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
                    reply, error = perform(op), None
                except BaseException as e:
                    reply, error = None, e
        finally:
            # An error raised out of here holds this frame in its traceback: the frame must
            # not hold the error in turn (a cycle that only the gc would break).
            error = None


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
                           addr: Addr, slot: Optional[_Slot]) -> None:
    """A lease that was garbage-collected unreleased: end its grant (and the watchdog already
    stopped, since it only held the lease weakly); a BOUND lease's connection goes back to its
    pool."""
    def job() -> None:
        try:
            transport.run(release_quietly(key, owner, token, addr, slot))
        except Exception:
            log.warning("flock: background release of %r failed", key, exc_info=True)
    try:
        _watchdog.run(job)
    except Exception:  # interpreter shutdown
        pass


# --- the lease ---------------------------------------------------------------------------------

class Lease(LeaseCore):
    """One grant of one lock. ``key``, ``owner`` and ``token`` name it; ``lost`` says whether it
    is gone; ``remaining_ms()`` how long it certainly still runs (rule 1)."""

    def __init__(self, flock: "Flock", grant: Grant, renew: bool,
                 durable: Optional[Durability] = None) -> None:
        self._state = threading.Lock()  # the core's state: watchdog threads share it
        super().__init__(grant, renew, durable)
        self._t = flock._t
        self._io = threading.Lock()  # one RENEW at a time (and the bound connection)
        #: made by the first wait_lost() (most leases never have one): set once lost or released
        self._lost_evt: Optional[threading.Event] = None
        self._finalizer = weakref.finalize(self, _release_in_background, self._t, self.key,
                                           self.owner, self.token, self._addr, self._slot)
        self._finalizer.atexit = False
        if renew:
            _watchdog.at(self._next_due, weakref.ref(self))

    def _on_lost(self) -> None:
        if self._lost_evt is not None:
            self._lost_evt.set()
        if self._callbacks:
            _watchdog.run(functools.partial(self._run_callbacks, self._take_callbacks()))

    def _io_call(self, *args: Any, timeout: Optional[float] = None) -> Any:
        """A command about this grant, on the bound connection or routed to the grant's node
        (timeout as in ``_core.Send``). Every command about the grant passes here."""
        slot = self._slot
        if slot is not None:
            try:
                return _roundtrip(slot.conn, args, timeout, False)
            except NETWORK_ERRORS:
                self._bound_failed()
                raise
        reply, addr = self._t.call(self.key, args, timeout, self._addr)
        if addr is not None:  # redirected: the grant's commands go there from now on
            self._addr = addr
        return reply

    def _bound_io(self) -> Any:
        """The lock a command takes: a BOUND lease's connection carries one command at a time."""
        return self._io if self._slot is not None else NO_LOCK

    def wait_lost(self, timeout_ms: Optional[Number] = None) -> bool:
        """Blocks until the lease is lost (True) or timeout_ms passed (False); None: no limit.
        Returns False at once for a released lease."""
        end = self._wait_end(timeout_ms)
        evt = self._lost_evt
        if evt is None:
            with self._state:  # _on_lost() sets it under _state once it is there
                evt = self._lost_evt
                if evt is None:
                    evt = self._lost_evt = threading.Event()
                    if self._lost or self._released:
                        evt.set()
        while True:
            done, step = self._wait_lost_step(end)
            if done is not None:
                return done
            evt.wait(step)

    def check(self) -> int:
        """The server's FLOCK.CHECK: remaining ms of this grant, 0 (and the lease lost) when it
        is not live; 0 at once, and not lost, after a clean release."""
        if self._released:
            return 0
        with self._bound_io():
            return self._on_check_reply(self._io_call(*self._check_command()))

    def holders(self) -> List[Holder]:
        """Every live grant of this lease's key (FLOCK.HOLDERS), oldest first."""
        with self._bound_io():
            return on_holders(self._io_call(*holders_command(self.key)))

    def renew(self, ttl_ms: Optional[int] = None) -> None:
        """Renews now with a token-qualified RENEW (and the watchdog goes on with the new ttl).
        Raises LockLostError when the grant is gone or the local deadline has passed. A durable
        lease (replicas= / fsync=) raises LockNotDurableError when too few acknowledged the
        renewal: it is still held, its local deadline where it was."""
        ttl = self.ttl_ms if ttl_ms is None else check_ttl(ttl_ms)
        with self._io:
            self._renew_once(ttl, True)

    def _renew_once(self, ttl: int, raise_lost: bool) -> bool:
        """One RENEW (the caller holds _io): True renewed, False lost (or released)."""
        if self._durable is not None:
            return self._renew_durably(ttl, raise_lost)
        command = self._renew_command(ttl, raise_lost)
        if command is None:
            return False
        args, timeout, sent = command
        return self._on_renew_reply(self._io_call(*args, timeout=timeout), sent, ttl, raise_lost)

    def _renew_durably(self, ttl: int, raise_lost: bool) -> bool:
        """One RENEW pipelined with its WAIT / WAITAOF on a connection of the grant's node."""
        commands = self._durable_renew_commands(ttl, raise_lost)
        if commands is None:
            return False
        pair, timeout, sent, wait_ms = commands
        replies, addr = self._t.run(routed_all(self.key, pair, timeout, self._addr))
        if addr is not None:  # redirected: the grant's commands go there from now on
            self._addr = addr
        return self._on_durable_renew_replies(replies, sent, ttl, wait_ms, raise_lost)

    def _tick(self) -> None:
        """The watchdog's renewal (on a worker thread)."""
        if not self._watching:
            return
        with self._io:
            if not self._watching:
                return
            sent = monotonic()
            try:
                ok = self._renew_once(self.ttl_ms, False)
            except Exception as e:
                go_on = self._on_watchdog_error(e)
            else:
                go_on = self._on_watchdog_renewed(ok, sent)
            if go_on:
                _watchdog.at(self._next_due, weakref.ref(self))

    def fenced(self, *command: Any) -> Any:
        """FLOCK.FENCED key token command...: runs command only while this grant is live.
        A refusal (stale token) marks the lease lost and raises FencedError."""
        with self._bound_io():
            try:
                return self._io_call(*self._fenced_command(command))
            except ResponseError as e:
                self._on_fenced_error(e)
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
        (then the lease is lost). Idempotent. A reentrant lease held more than once only drops
        a hold (True, nothing sent): the last release() ends the grant (rule 11)."""
        if self._holds > 1 and self._drop_hold():
            return True
        first, watched = self._begin_release()
        if not first:
            return self._released_ok
        self._finalizer.detach()
        self._untrack()
        if watched:
            _watchdog.forget()
        if self._slot is None:
            self._wait_for_renewal()
        try:
            if self._slot is None:
                try:
                    n, _ = self._t.call(self.key, self._release_command(), None, self._addr)
                except NETWORK_ERRORS:
                    n = self._t.run(self._release_retry_plan())
            else:
                with self._io:
                    n = self._t.run(self._release_bound_plan())
        finally:
            evt = self._lost_evt  # (one made after _begin_release() is set when made)
            if evt is not None:
                evt.set()  # wakes wait_lost() callers: it answers False now
        return self._end_release(n)

    def _wait_for_renewal(self) -> None:
        """Waits (bounded) for a renewal of this lease already under way: renewals hold _io
        from their check of _released to their reply, and _released is set, so none can start
        after this. (A BOUND lease's release takes _io for its connection anyway.)"""
        if self._io.acquire(False):  # none under way (the usual case)
            self._io.release()
            return
        wait = renewal_wait_s(self._deadline, monotonic(), self._t.socket_timeout)
        if self._io.acquire(timeout=wait):
            self._io.release()
        else:
            log.debug("flock: release of %r did not wait longer than %.3f s for a renewal under "
                      "way", self.key, wait)

    # -- with lease: ... -----------------------------------------------------------------------
    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.release()
            if self._lost:
                raise self._lost_while_held()
            return
        try:
            self.release()
        except Exception:
            log.warning("flock: release of %r after an error failed", self.key, exc_info=True)
        # the block's own exception goes on unchanged


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
            raise busy_error(self._args[0], self._kw.get("wait_ms"))
        self._lease = lease
        return lease

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        lease, self._lease = self._lease, None
        assert lease is not None
        lease.__exit__(exc_type, exc, tb)


class _ManyContext:
    """``flock.lock_many()``: the leases of every key, released together on leaving."""
    __slots__ = ("_flock", "_args", "_kw", "_leases")

    def __init__(self, flock: "Flock", args: Tuple[Any, ...], kw: Dict[str, Any]) -> None:
        self._flock = flock
        self._args = args
        self._kw = kw
        self._leases: Optional[List[Lease]] = None

    def __enter__(self) -> List[Lease]:
        leases = self._flock.acquire_many(*self._args, **self._kw)
        if leases is None:
            raise many_busy_error(self._args[0], self._kw.get("wait_ms"))
        self._leases = leases
        return list(leases)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        leases, self._leases = self._leases, None
        assert leases is not None
        first: Optional[BaseException] = None
        for lease in leases:  # every one is released, whatever happens to the others
            try:
                lease.release()
            except Exception as e:
                if exc_type is not None:
                    log.warning("flock: release of %r after an error failed", lease.key,
                                exc_info=True)
                elif first is None:
                    first = e
        raise_after_release_all(leases, first, exc_type)


# --- leader election ----------------------------------------------------------------------------

class Observer:
    """``election.observe()``: an iterator of leader changes (``Leader(owner, token)``, or None
    while nobody leads), the current state first; driven by FLOCK.WATCH on a connection of its
    own. ``close()`` (also from another thread, or by leaving its ``with`` block) ends it."""

    def __init__(self, transport: _Transport, key: Any) -> None:
        self._t = transport
        self._plan = observe_plan(key)
        self._slot: Optional[_Slot] = None
        self._closed = False

    def __iter__(self) -> "Observer":
        return self

    def __next__(self) -> Optional[Leader]:
        reply: Any = None
        error: Optional[BaseException] = None
        while True:
            if self._closed:
                raise StopIteration
            op = self._plan.send(reply) if error is None else self._plan.throw(error)
            if type(op) is Emit:
                return op.value
            try:
                reply, error = self._t.perform(op), None
            except BaseException as e:
                if self._closed:
                    raise StopIteration from None
                reply, error = None, e
            if type(op) is Checkout:
                self._slot = reply
            elif type(op) is GiveBack:
                self._slot = None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        slot, self._slot = self._slot, None
        if slot is not None:
            slot.conn.disconnect()  # ends a WATCH under way in another thread, too
            slot.pool.release(slot.conn)

    def __enter__(self) -> "Observer":
        return self

    def __exit__(self, *a: Any) -> None:
        self.close()


class Election:
    """Leader election over one key (``flock.election(key, ttl_ms)``): the leader holds the
    key's exclusive BOUND grant, renewed by the watchdog and watched (rule 9)."""

    def __init__(self, flock: "Flock", key: Any, ttl_ms: int, owner: Optional[str]) -> None:
        acquire_command(key, ttl_ms, None, False, None, True, owner)  # checks (rule 12)
        self._flock, self.key, self.ttl_ms, self.owner = flock, key, ttl_ms, owner
        self.lease: Optional[Lease] = None

    def campaign(self, wait_ms: Optional[Number] = None) -> Lease:
        """Waits in line (BLOCK) until this candidate leads, and returns its lease (lost when
        its term ends: see ``lease.lost``, ``wait_lost()``, ``on_lost()``). ``wait_ms``: None
        is no limit; not leading within it raises LockBusyError."""
        lease = self._flock.acquire(self.key, self.ttl_ms, wait_ms=campaign_args(wait_ms)[0],
                                    bound=True, owner=self.owner)
        if lease is None:
            raise busy_error(self.key, wait_ms)
        self.lease = lease
        return lease

    def leader(self) -> Optional[Leader]:
        """The current leader, or None."""
        return leader_of(self._flock._read(self.key, info_command(self.key)))

    def observe(self) -> Observer:
        return Observer(self._flock._t, self.key)

    def resign(self) -> bool:
        """Ends this candidate's term (the next in line leads); False when it did not lead."""
        lease, self.lease = self.lease, None
        return lease.release() if lease is not None else False


# --- the factory --------------------------------------------------------------------------------

class Flock:
    """Fenced locks over a redis-py ``Redis`` or ``RedisCluster`` client."""

    def __init__(self, client: Union["redis.Redis", RedisCluster]) -> None:
        self.client: Any = client
        self._t = _Transport(client)
        #: the live leases handed out, per key (rule 11) and per watch lane (rule 9)
        self._track = Tracker(self._t.cluster)
        #: reentrant=True without an owner: one owner per thread
        self._local = threading.local()

    def lock(self, key: Any, ttl_ms: int, *, wait_ms: Optional[Number] = None,
             shared: bool = False, limit: Optional[int] = None, bound: bool = False,
             renew: bool = True, owner: Optional[str] = None, reentrant: bool = False,
             replicas: int = 0, fsync: bool = False, durable_timeout_ms: Optional[int] = None,
             **unknown: NoReturn) -> _LockContext:
        """``with flock.lock(key, ttl_ms) as lease:`` acquires (LockBusyError when not granted
        within wait_ms), and always releases on leaving; leaving raises LockLostError when the
        lease was lost meanwhile, unless the block raised (its error goes on unchanged)."""
        refuse_unknown(unknown)
        return _LockContext(self, (key, ttl_ms), dict(
            wait_ms=wait_ms, shared=shared, limit=limit, bound=bound, renew=renew, owner=owner,
            reentrant=reentrant, replicas=replicas, fsync=fsync,
            durable_timeout_ms=durable_timeout_ms))

    def acquire(self, key: Any, ttl_ms: int, *, wait_ms: Optional[Number] = None,
                shared: bool = False, limit: Optional[int] = None, bound: bool = False,
                renew: bool = True, owner: Optional[str] = None, reentrant: bool = False,
                replicas: int = 0, fsync: bool = False, durable_timeout_ms: Optional[int] = None,
                **unknown: NoReturn) -> Optional[Lease]:
        """A Lease, or None when not granted within wait_ms (None or 0: one try; math.inf:
        no limit).

        Rule 11: the same owner acquiring a key this Flock holds raises LockBusyError at once,
        unless reentrant=True: then the held lease is returned with one more hold (without an
        owner, the owner is one per thread). A wait on a key this thread holds a lease of is
        one try, and LockBusyError when not granted (it would wait on itself).

        replicas=n / fsync=True (rule 10): the lease is handed over only once n replicas
        acknowledged the grant (WAIT) / the AOF has it on disk (WAITAOF), within
        durable_timeout_ms (default a third of the ttl); else the grant is released and
        LockNotDurableError raised."""
        if unknown:
            refuse_unknown(unknown)
        if renew is not True and renew is not False:
            check_flag("renew", renew)
        own_owner = owner is None
        if reentrant is not False:
            check_flag("reentrant", reentrant)
            if owner is None:
                owner = self._thread_owner()
        command, wait_s = acquire_command(key, ttl_ms, wait_ms, shared, limit, bound, owner)
        ctx = threading.get_ident()
        again, own_wait = self._track.reenter(as_bytes(key), owner, ctx, reentrant, command[4:])
        if again is not None:
            return again
        if own_wait and wait_s is not None:
            wait_s = None  # one try: a wait would wait on this thread's own lease
        durable = durability(replicas, fsync, durable_timeout_ms, command[3], bound)
        sent = monotonic()
        grant = WAIT
        if durable is not None:
            if durable.fsync:
                self._check_waitaof(key)
                sent = monotonic()
        elif not bound:  # the first try: one call on the shared pool (see acquire_command)
            reply, addr = self._t.call(key, command, None, None, 2)
            grant = on_acquire_reply(command, wait_s, reply, sent, addr)
        if grant is WAIT:
            grant = self._t.run(acquire_wait_plan(command, wait_s, sent, bound,
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
        if self._track.refresh_due is None or due < self._track.refresh_due:
            self._schedule_refresh(due)
        return lease

    def lock_many(self, keys: Any, ttl_ms: int, *, wait_ms: Optional[Number] = None,
                  bound: bool = False, renew: bool = True, owner: Optional[str] = None,
                  replicas: int = 0, fsync: bool = False,
                  durable_timeout_ms: Optional[int] = None,
                  **unknown: NoReturn) -> "_ManyContext":
        """``with flock.lock_many(keys, ttl_ms) as leases:`` acquires every key or none
        (LockBusyError when not granted within wait_ms; nothing is then held), one Lease per
        key in the order given, and releases them all on leaving; leaving raises LockLostError
        when one was lost meanwhile, unless the block raised (its error goes on unchanged)."""
        refuse_unknown(unknown)
        command, _ = acquire_many_command(keys, ttl_ms, wait_ms, owner, bound)  # rule 12
        durability(replicas, fsync, durable_timeout_ms, many_parts(command)[2], bound)
        return _ManyContext(self, (keys, ttl_ms), dict(
            wait_ms=wait_ms, bound=bound, renew=renew, owner=owner, replicas=replicas,
            fsync=fsync, durable_timeout_ms=durable_timeout_ms))

    def acquire_many(self, keys: Any, ttl_ms: int, *, wait_ms: Optional[Number] = None,
                     bound: bool = False, renew: bool = True, owner: Optional[str] = None,
                     replicas: int = 0, fsync: bool = False,
                     durable_timeout_ms: Optional[int] = None,
                     **unknown: NoReturn) -> Optional[List[Lease]]:
        """FLOCK.MACQUIRE: a list of Leases, one per key in the order given (each an ordinary
        exclusive lease: renewed, watched, fenced, released alone), or None when they were not
        all granted within wait_ms (None or 0: one try; math.inf: no limit), and then none is
        held. A wait waits in every key's queue at once. In a cluster all keys must be in one
        slot (a hash tag). Rule 11: a key this Flock holds with the same owner raises
        LockBusyError at once (there is no reentrant lock_many).

        bound=True: every grant lives on one connection of their own (MACQUIRE ... BOUND),
        which goes back to its pool when the last of the leases is released.
        replicas=n / fsync=True (rule 10, not with bound): the WAIT / WAITAOF follows the
        MACQUIRE on its connection; too few acknowledgements, and every key is released and
        LockNotDurableError raised."""
        if unknown:
            refuse_unknown(unknown)
        if renew is not True and renew is not False:
            check_flag("renew", renew)
        command, wait_s = acquire_many_command(keys, ttl_ms, wait_ms, owner, bound)
        keys_, _, ttl = many_parts(command)
        durable = durability(replicas, fsync, durable_timeout_ms, ttl, bound)
        ctx = threading.get_ident()
        own_key = None
        for key in keys_:
            if self._track.reenter(as_bytes(key), owner, ctx, False, ())[1]:
                own_key = key
        if own_key is not None and wait_s is not None:
            wait_s = None  # one try: a wait would wait on this thread's own lease
        if durable is not None and durable.fsync:
            self._check_waitaof(keys_[0])
        grants = self._t.run(acquire_many_plan(command, wait_s, monotonic(), owner is None,
                                               durable))
        if grants is None:
            if own_key is not None and wait_ms:
                raise busy_on_self(own_key)
            return None
        if bound:  # one connection for them all: back to its pool with the last release
            slot = grants[0][6]
            shared = _Slot(slot.conn, SharedPool(slot.pool, len(grants)))
            grants = [g[:6] + (shared,) for g in grants]
        leases = [self._new_lease(g, renew, durable, (), ctx) for g in grants]
        if bound:
            link_bound_set(leases)
        return leases

    def _thread_owner(self) -> str:
        own = getattr(self._local, "owner", None)
        if own is None:
            own = self._local.owner = new_owner()
        return own

    # -- rule 9: the watch lanes -------------------------------------------------------------
    def _start_lane(self, lane: Lane) -> None:
        lane.event = threading.Event()
        threading.Thread(target=self._run_lane, args=(lane,), name="flock-watch",
                         daemon=True).start()

    def _run_lane(self, lane: Lane) -> None:
        try:
            self._t.run(lane_plan(lane))
        except BaseException:
            log.exception("flock: the watch of %r ended", lane.key)
            lane.running = False

    def _schedule_refresh(self, due: float) -> None:
        track = self._track
        with track.refresh_lock:
            if track.refresh_due is not None and track.refresh_due <= due:
                return
            track.refresh_due = due
        ref = weakref.ref(self)

        def job() -> None:
            flock = ref()
            if flock is not None:
                flock._refresh()
        _watchdog.at(due, job)

    def _refresh(self) -> None:
        """Makes every lane's WATCH name the leases old enough to watch (see ``_watch``)."""
        with self._track.refresh_lock:
            self._track.refresh_due = None
        todo, soonest = next_refresh(list(self._track.lanes.values()), monotonic())
        for lane, action in todo:
            if action == "wake":
                lane.event.set()
                continue
            try:
                self._t.call(lane.key, ("CLIENT", "UNBLOCK", lane.client_id), None, lane.addr)
            except Exception as e:  # (a refused CLIENT: the WATCH's own timeout re-arms it)
                log.debug("flock: CLIENT UNBLOCK of the watch failed: %s", e)
        if soonest is not None:
            self._schedule_refresh(soonest)

    def _check_waitaof(self, key: Any) -> None:
        """fsync=True needs WAITAOF: asked of the server once per client (COMMAND INFO)."""
        if self._t.waitaof is None:
            reply, _ = self._t.call(key, WAITAOF_PROBE, None, None, 2)
            self._t.waitaof = has_waitaof(reply)
        if not self._t.waitaof:
            raise no_waitaof_error(key)

    def release(self, key: Any, owner: str, token: Optional[int] = None) -> bool:
        """FLOCK.RELEASE key owner [token] from any process (a supervisor's takeover)."""
        args = checked_release_args(key, owner, token)
        return bool(self._t.call(key, args, None, None, 2)[0])

    def revoke(self, key: Any, owner: Optional[str] = None) -> int:
        """FLOCK.REVOKE key [owner]: the number of live grants ended."""
        args = revoke_args(key, owner)
        return int(self._t.call(key, args)[0])

    def election(self, key: Any, ttl_ms: int, *, owner: Optional[str] = None) -> Election:
        """Leader election over key: ``campaign()``, ``leader()``, ``observe()``,
        ``resign()``."""
        return Election(self, key, ttl_ms, owner)

    # -- inspection: no lease needed -------------------------------------------------------------
    def _read(self, key: Any, args: Tuple[Any, ...]) -> Any:
        return self._t.call(key, args, None, None, 2)[0]

    def info(self, key: Any) -> Optional[Dict[str, Any]]:
        """FLOCK.INFO as a dict (``owner``, ``token``, ``ttl``, ``waiters``, ``mode``,
        ``holders``, ``limit``, ``delayed``), or None when nobody holds, waits for or delays
        key."""
        return on_info(self._read(key, info_command(key)))

    def holders(self, key: Any) -> List[Holder]:
        """Every live grant of key, oldest first, as ``Holder(owner, token, ttl_ms)``."""
        return on_holders(self._read(key, holders_command(key)))

    def waiters(self, key: Any, count: Optional[int] = None) -> List[Waiter]:
        """The requests waiting for key, first in line first, as ``Waiter(owner, mode,
        waited_ms)`` (at most count)."""
        return on_waiters(self._read(key, waiters_command(key, count)))

    def locked(self, key: Any) -> bool:
        """Whether a live grant holds key."""
        return on_locked(self._read(key, info_command(key)))

    def check(self, key: Any, token: int) -> int:
        """FLOCK.CHECK key token: the ms left of that grant, 0 when it is not live."""
        return int(self._read(key, check_command(key, token)))

    def stats(self, *classes: Any) -> Dict[str, Any]:
        """FLOCK.STATS GET [class ...] as a dict: ``classes`` (class -> figures) and
        ``overflow``. (In a cluster: of the node that serves the first class's slot, or any.)"""
        args = stats_command(classes)
        if self._t.cluster:
            key = classes[0] if classes else "flock"
            return on_stats(self._read(key, args))
        return on_stats(self.client.execute_command(*args))
