"""The lease core that the sync client (``_sync``) and the asyncio client (``aio``) share.

Everything that decides anything lives once in the core, which does no I/O: this module holds
the lease's state (token, local deadline, lost flag and reason, holds, release), when the next
renewal is due and fenced writes; the rest is split by concern: ``_errors`` (errors, loss
reasons), ``_rules`` (argument checks, small rules), ``_durable`` (rule 10), ``_plans`` (the
ops, redirects and retries, acquiring and waiting), ``_watch`` (rule 9's WATCH lanes, rule
11's registry), ``_inspect`` and ``_election``. This module re-exports the names the drivers
import.

The hot operations are plain functions and methods, one command each: the core builds the
command and interprets its reply, the driver sends it in between (``acquire_command()`` /
``on_acquire_reply()``, ``LeaseCore._renew_command()`` / ``_on_renew_reply()``,
``_release_command()`` / ``_end_release()``, ...). A driver sends such a command with one
round trip of its own and, only when that fails with a redirect or a network error, hands
the error to ``routed_call``, which goes on from there.

The multi-step flows (a wait, redirects and retries, a BOUND lease's release, a release in
the background) are *plans*: generators that yield the I/O they need as small op objects
(``Send``, ``Checkout``, ``Sleep``, ...) and are sent each op's result back (or have the op's
exception thrown in). A driver runs a plan: ``_sync`` performs the ops with blocking calls,
``aio`` awaits them. So the two clients differ only in how a command or an op is carried out,
how the watchdog is scheduled, and what a lock or an event is.

Plans always run to their end (a driver throws every failure of an op back into the plan,
cancellation included), so their ``finally`` clauses can themselves yield ops, for instance
to give a connection back to its pool.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

from redis.exceptions import ResponseError

from ._durable import *  # noqa: F401,F403 (the drivers import everything from here)
from ._durable import Durability
from ._errors import *  # noqa: F401,F403
from ._errors import (
    CLOSED,
    DEADLINE_PASSED,
    FENCED_REFUSED,
    GONE,
    RELEASED,
    InvalidArgumentError,
    RENEW_REFUSED,
    FencedError,
    LeaseTooShortError,
    LockLostError,
)
from ._plans import *  # noqa: F401,F403
from ._plans import NETWORK_ERRORS, Grant, Plan, Send, Disconnect, GiveBack, routed_call
from ._rules import *  # noqa: F401,F403
from ._rules import Number, is_fenced_refusal, log, monotonic, ms_left, renew_interval

# --- the lease ---------------------------------------------------------------------------------

class NoLock:
    """A lock that is no lock: for state only one thread touches (asyncio), and for commands
    that need no connection of their own to themselves."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: Any) -> None:
        return None


NO_LOCK = NoLock()


class LeaseCore:
    """One grant of one lock: its names, its state, and its commands (each built and its reply
    interpreted here). A driver's ``Lease`` subclasses it and adds the I/O: sending the
    commands (every command about the grant through its ``_io_call``), running the plans, the
    watchdog, the waiting.

    ``_state`` guards the state below; the sync driver sets a threading.Lock (its watchdog
    threads share the lease with the caller's thread); the asyncio driver needs none, but sets
    one too: a lock nobody else takes costs less than NO_LOCK's two Python calls. Nothing is
    ever awaited or sent while ``_state`` is held (nor is it taken again while held)."""

    _state: Any = NO_LOCK

    def __init__(self, grant: Grant, renew: bool, durable: Optional[Durability] = None) -> None:
        self.key, self.owner, token, ttl_ms, sent, self._addr, slot = grant
        #: replicas= / fsync= (rule 10): each RENEW is followed by WAIT / WAITAOF, and only an
        #: acknowledged one moves the local deadline (None: a plain lease)
        self._durable = durable
        self.token: int = token
        self.ttl_ms = ttl_ms
        self.bound = slot is not None
        #: why the lease was lost (None while it is not)
        self.lost_reason: Optional[str] = None
        self._slot = slot  # BOUND: the connection the grant lives on, until release
        self._deadline = sent + ttl_ms / 1000.0
        self._lost = False
        self._released = False
        self._released_ok = False
        #: the watchdog renews this lease (off once lost or released)
        self._watching = renew
        self._backoff = 0.0
        #: when the watchdog's next renewal is due (monotonic)
        self._next_due = sent + renew_interval(ttl_ms)
        #: rule 9: when the grant was sent for (a lease is watched once WATCH_AFTER_S old), the
        #: key as the WATCH reply names it, and the watch lane the lease is in
        self._born = sent
        self._key_bytes = self.key.encode() if type(self.key) is str else bytes(self.key)
        self._lane: Any = None
        #: rule 11: the holds a reentrant lease counts, the kind it was asked with (SHARED /
        #: LIMIT n / BOUND), the thread or task that acquired it, the Flock's tracker
        self._holds = 1
        self._kind: Tuple[Any, ...] = ()
        self._ctx: Any = None
        self._tracker: Any = None
        #: on_lost() callbacks (None: none registered; most leases have none)
        self._callbacks: Optional[List[Callable[[Any], Any]]] = None
        #: lock_many(bound=True): weak references to every lease of the set (one connection)
        self._bound_set: Optional[List[Any]] = None

    def __repr__(self) -> str:
        state = "lost" if self._lost else "released" if self._released else "live"
        return f"<Lease key={self.key!r} owner={self.owner!r} token={self.token} {state}>"

    def _on_lost(self) -> None:
        """The driver's hook, called once when the lease becomes lost (with _state held):
        wakes its waiters, stops its watchdog, runs the on_lost() callbacks (never while
        _state is held: the driver schedules them)."""

    def on_lost(self, callback: Callable[[Any], Any]) -> None:
        """Calls ``callback(lease)`` once when the lease is lost (rule 3; at once, scheduled,
        when it already is): on a watchdog thread (sync) or on the lease's loop (asyncio).
        Never called for a lease released cleanly."""
        if not callable(callback):
            raise InvalidArgumentError(f"on_lost takes a callable, not {callback!r}")
        with self._state:
            if self._callbacks is None:
                self._callbacks = []
            self._callbacks.append(callback)
            if self._lost:
                self._on_lost()

    def _take_callbacks(self) -> List[Callable[[Any], Any]]:
        cbs, self._callbacks = self._callbacks or [], None
        return cbs

    def _run_callbacks(self, callbacks: List[Callable[[Any], Any]]) -> None:
        for cb in callbacks:
            try:
                cb(self)
            except Exception:
                log.exception("flock: an on_lost callback of %r failed", self.key)

    # -- rule 11: holds ----------------------------------------------------------------------
    @property
    def holds(self) -> int:
        """How many times a reentrant lease is held (release() ends it at the last)."""
        return self._holds

    def _hold(self) -> bool:
        """One more hold of a reentrant lease; False when it is no longer live."""
        with self._state:
            if self._released or self._lost:
                return False
            self._holds += 1
            return True

    def _drop_hold(self) -> bool:
        """release() of a reentrant lease held more than once: True when a hold was dropped
        and the grant stays (nothing is sent)."""
        with self._state:
            if self._holds > 1 and not self._released:
                self._holds -= 1
                return True
            return False

    def _untrack(self) -> None:
        tracker = self._tracker
        if tracker is not None:
            tracker.remove(self)

    # -- state -------------------------------------------------------------------------------
    def _set_lost_locked(self, reason: str) -> None:
        if not self._lost:
            self._lost = True
            self.lost_reason = reason
            self._watching = False
            self._on_lost()

    def _set_lost(self, reason: str) -> None:
        with self._state:
            first = not self._lost
            self._set_lost_locked(reason)
        if first and reason == CLOSED and self._bound_set is not None:
            self._lose_bound_set()

    def _lose_bound_set(self) -> None:
        """A lease of a ``lock_many(bound=True)`` set lost its connection: the server ended
        every grant on it at that moment, so the others of the set are lost with reason
        ``closed`` too, at once (a WATCH reply names one ended grant, and a WATCH sent after
        it would tell the others as ``gone``)."""
        for ref in self._bound_set or ():
            other = ref()
            if other is None or other is self:
                continue
            with other._state:
                if not other._released:
                    other._set_lost_locked(CLOSED)

    @property
    def lost(self) -> bool:
        """True once the lease is gone (a refused renewal, REVOKE seen, a stale fenced write,
        a release answered 0, or its local deadline passed). Never true after a clean release."""
        if self._lost:
            return True
        if self._released:
            return False
        if monotonic() >= self._deadline:
            with self._state:
                if not self._released:
                    self._set_lost_locked(DEADLINE_PASSED)
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

    def ensure(self, min_ms: Number = 0) -> None:
        """Before a critical step: raises LockLostError when the lease is lost (or released),
        LeaseTooShortError when it has less than min_ms left. By the local clock alone: no
        round trip, so a process that was paused learns it at once."""
        if self.lost:
            raise self._lost_error()
        if self._released:
            raise self._released_error()
        left = self.remaining_ms()
        if left < min_ms:
            if left == 0 and self.lost:
                raise self._lost_error()
            raise LeaseTooShortError(
                f"lease of {self.key!r} has {left} ms left, less than the {min_ms} ms needed",
                None, self.key, self.token)

    def _lost_error(self) -> LockLostError:
        return LockLostError(f"lease of {self.key!r} (token {self.token}) is lost: "
                             f"{self.lost_reason}", self.lost_reason, self.key, self.token)

    def _released_error(self) -> LockLostError:
        """What ensure(), renew() and fenced() raise on a released lease: at once, with no
        round trip, and the lease stays not lost (rule 12)."""
        return LockLostError(f"lease of {self.key!r} (token {self.token}) was released",
                             RELEASED, self.key, self.token)

    def _lost_while_held(self) -> LockLostError:
        """What leaving a ``with`` block without an error raises after the release when the
        lease is lost (``_lost``)."""
        return LockLostError(f"lease of {self.key!r} (token {self.token}) was lost while held: "
                             f"{self.lost_reason}", self.lost_reason, self.key, self.token)

    @staticmethod
    def _wait_end(timeout_ms: Optional[Number]) -> float:
        return math.inf if timeout_ms is None else monotonic() + timeout_ms / 1000.0

    def _wait_lost_step(self, end: float) -> Tuple[Optional[bool], Optional[float]]:
        """One turn of wait_lost(): (True, _) lost, (False, _) released or out of time, else
        (None, seconds to sleep on the lost event; None = no limit). The sleep never passes
        the local deadline, which marks the lease lost with no event."""
        if self.lost:
            return True, None
        if self._released:
            return False, None
        now = monotonic()
        if now >= end:
            return False, None
        step = min(end, self._deadline) - now
        return None, None if math.isinf(step) else max(step, 0.0005)

    # -- the lease's commands --------------------------------------------------------------
    def _bound_failed(self) -> None:
        """A command on the BOUND connection failed with a network error (which the driver
        raises on): the binding ends with the connection."""
        self._set_lost(CLOSED)

    def _check_command(self) -> Tuple[Any, ...]:
        return ("FLOCK.CHECK", self.key, self.token)

    def _on_check_reply(self, left: Any) -> int:
        if not left:
            if self._released:
                return 0  # a clean release is no loss (rule 12)
            self._set_lost(GONE)
            return 0
        return int(left)

    def _renew_command(self, ttl: int, raise_lost: bool
                       ) -> Optional[Tuple[Tuple[Any, ...], float, float]]:
        """The first half of one RENEW (the driver holds the lease's I/O lock): (command,
        timeout, sent), or None when there is nothing to renew (lost or released; raised
        instead when raise_lost). The driver sends the command at once with that timeout (the
        reply can only matter before the local deadline) and passes the reply and sent to
        _on_renew_reply; network errors pass."""
        now = monotonic()
        with self._state:
            if self._released:
                if raise_lost:
                    raise self._released_error()
                return None
            if not self._lost and now >= self._deadline:
                self._set_lost_locked(DEADLINE_PASSED)
            if self._lost:
                if raise_lost:
                    raise self._lost_error()
                return None
            deadline = self._deadline
        sent = monotonic()
        return ("FLOCK.RENEW", self.key, self.owner, ttl, self.token), deadline - sent, sent

    def _on_renew_reply(self, reply: Any, sent: float, ttl: int, raise_lost: bool) -> bool:
        """The second half of one RENEW. True: renewed; False: lost (or released)."""
        with self._state:
            if self._released:
                return False  # release() began meanwhile: a late nil is no loss
            if reply is None:
                self._set_lost_locked(RENEW_REFUSED)
            elif not self._lost:
                self._deadline = sent + ttl / 1000.0
                self.ttl_ms = ttl
            lost = self._lost
        if lost and raise_lost:
            raise self._lost_error()
        return not lost

    @property
    def replicas(self) -> int:
        """How many replicas acknowledge each grant and renewal before it counts (0: none)."""
        return 0 if self._durable is None else self._durable.replicas

    @property
    def fsync(self) -> bool:
        """Whether each grant and renewal counts only once the AOF has it on disk."""
        return self._durable is not None and self._durable.fsync

    def _durable_renew_commands(self, ttl: int, raise_lost: bool
                                ) -> Optional[Tuple[Tuple[Tuple[Any, ...], ...], float, float,
                                                    int]]:
        """A durable lease's renewal (rule 10), as _renew_command: (the RENEW and the WAIT /
        WAITAOF that follows it on the same connection, timeout, sent, the WAIT's ms), or None.
        The WAIT never outlasts the local deadline (its answer would come too late to count).
        The driver sends them with routed_all() and passes the replies to
        _on_durable_renew_replies()."""
        command = self._renew_command(ttl, raise_lost)
        if command is None:
            return None
        args, timeout, sent = command
        durable = self._durable
        assert durable is not None
        wait_ms = durable.wait_ms(ttl, int(timeout * 1000.0))
        return (args, durable.command(wait_ms)), timeout, sent, wait_ms

    def _on_durable_renew_replies(self, replies: Any, sent: float, ttl: int, wait_ms: int,
                                  raise_lost: bool) -> bool:
        """The replies of a durable renewal. Acknowledged as asked: as _on_renew_reply (the
        local deadline counts from this renewal). Renewed but too few acknowledged: the local
        deadline stays where it was (never later than this renewal's own ttl, should that be
        the shorter), the lease stays live; renew() raises LockNotDurableError, the watchdog
        tries again at its next tick. True: live (renewed or not), False: lost (or
        released)."""
        reply, ack = replies[0], replies[1]
        if isinstance(reply, Exception):
            raise reply
        short = None
        if reply is not None:
            durable = self._durable
            assert durable is not None
            short = durable.shortfall(self.key, ack, wait_ms, True)
        if short is None:
            return self._on_renew_reply(reply, sent, ttl, raise_lost)
        with self._state:
            if self._released:
                return False
            if not self._lost:
                # the master holds the grant until at least sent + ttl: a shorter ttl than the
                # lease had shortens what the client may believe, a longer one extends nothing
                self._deadline = min(self._deadline, sent + ttl / 1000.0)
            lost = self._lost
        if lost:
            if raise_lost:
                raise self._lost_error()
            return False
        if raise_lost:
            raise short
        log.warning("flock: %s", short)
        return True

    def _on_watchdog_renewed(self, ok: bool, sent: float) -> bool:
        """The watchdog's renewal (begun at sent) ended: ok as _on_renew_reply answered. True
        when the watchdog goes on, its next renewal due at _next_due."""
        self._backoff = 0.0
        if ok and self._watching:
            self._next_due = sent + renew_interval(self.ttl_ms)
            return True
        return False

    def _on_watchdog_error(self, e: Exception) -> bool:
        """The watchdog's renewal failed (network, redirect, LOADING...): retry until the
        deadline. True when the watchdog goes on, its next try due at _next_due."""
        if self._slot is not None:
            self._set_lost(CLOSED)
            return False
        # Retry soon, but never past the local deadline (checked before each send).
        self._backoff = min(max(self._backoff * 2, 0.01), 0.25, self.ttl_ms / 12000.0)
        self._next_due = min(monotonic() + self._backoff, self._deadline)
        log.debug("flock: renewal of %r failed (%s); retrying", self.key, e)
        return self._watching

    def _fenced_command(self, command: Tuple[Any, ...]) -> Tuple[Any, ...]:
        """FLOCK.FENCED key token command... A released lease has no grant to fence with:
        LockLostError (``released``) at once, nothing sent, ``lost`` unchanged (rule 12)."""
        if self._released:
            raise self._released_error()
        if not command:
            raise InvalidArgumentError("fenced() takes the command to run")
        return ("FLOCK.FENCED", self.key, self.token, *command)

    def _on_fenced_error(self, e: ResponseError) -> None:
        """A FLOCK.FENCED answered with an error (the driver calls this in its ``except
        ResponseError`` and re-raises the error when this returns): a refusal (stale token)
        marks the lease lost and raises FencedError."""
        if is_fenced_refusal(e):
            self._set_lost(FENCED_REFUSED)
            raise FencedError(str(e)) from e

    def _begin_release(self) -> Tuple[bool, bool]:
        """The first half of release(), before any I/O: (first, was_watching). first is False
        when release() ran before (its answer is _released_ok). Once this ran no renewal
        starts, and a renewal's reply never marks the lease lost."""
        with self._state:
            if self._released:
                return False, False
            if not self._lost and monotonic() >= self._deadline:
                self._set_lost_locked(DEADLINE_PASSED)
            self._released = True
            watched, self._watching = self._watching, False
        return True, watched

    def _release_command(self) -> Tuple[Any, ...]:
        """FLOCK.RELEASE key owner token (rule 4). A lease without a connection of its own
        sends it routed (from _addr); after a network error it runs _release_retry_plan()."""
        return ("FLOCK.RELEASE", self.key, self.owner, self.token)

    def _release_retry_plan(self) -> Plan:
        """The one retry of a routed RELEASE after a network error: answered 0 it counts as
        released (the first one may have landed). Returns the reply (1 or 0)."""
        n, _ = yield from routed_call(self.key, self._release_command(), addr=self._addr)
        return 1 if n == 0 else n

    def _release_bound_plan(self) -> Plan:
        """A BOUND lease's RELEASE, on its connection, which then goes back to its pool.
        Returns the reply (1 or 0)."""
        slot, self._slot = self._slot, None
        try:
            n = yield Send(slot, self._release_command(), None, False)
        except NETWORK_ERRORS:
            # the binding died with the connection: the server ends the grant by itself
            yield Disconnect(slot)
            yield GiveBack(slot)
            self._bound_failed()
            return 0
        yield GiveBack(slot)
        return int(n)

    def _end_release(self, n: int) -> bool:
        """The second half of release(): True when the grant was live and is now released;
        False when it was already gone (then the lease is lost)."""
        with self._state:
            if n == 1:
                self._released_ok = True
            else:
                self._set_lost_locked(GONE)
        return self._released_ok
