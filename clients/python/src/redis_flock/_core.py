"""The lease core that the sync client (``_sync``) and the asyncio client (``aio``) share.

Everything that decides anything lives here once: argument checks, reply parsing, the lease's
state (token, local deadline, lost flag and reason, release), when the next renewal is due,
fenced writes, redirect and retry handling, and the errors. It does no I/O itself.

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

import asyncio
import logging
import math
import secrets
import time
from typing import Any, Generator, List, NamedTuple, Optional, Tuple, Union

from redis.exceptions import (
    AskError,
    ClusterDownError,
    ConnectionError,
    MovedError,
    ResponseError,
    TimeoutError,
    TryAgainError,
)

__all__ = [
    "FlockError",
    "LockBusyError",
    "LockLostError",
    "LeaseTooShortError",
    "FencedError",
    "LockNotDurableError",
]

log = logging.getLogger("redis_flock")
monotonic = time.monotonic


# --- errors --------------------------------------------------------------------------------------

class FlockError(Exception):
    """Base class of every error this client raises itself (redis-py's own errors, such as
    ``redis.ConnectionError``, pass through unchanged)."""


class LockBusyError(FlockError):
    """The lock was not granted within ``wait_ms`` (``flock.lock``)."""


class LockLostError(FlockError):
    """The lease is lost: released by nobody but ended by expiry, REVOKE, a refused renewal,
    a stale fenced write, or its local deadline passing (rule 1)."""


class LeaseTooShortError(LockLostError):
    """``lease.ensure(min_ms)``: the lease is live but has less than ``min_ms`` left."""


class FencedError(FlockError):
    """FLOCK.FENCED refused the lease's token as stale; nothing ran and the lease is lost."""


class LockNotDurableError(FlockError):
    """``replicas=`` / ``fsync=`` (rule 10): fewer replicas than asked acknowledged the grant
    (or, with ``fsync=True``, the local AOF did not fsync it) within ``durable_timeout_ms``.

    From ``acquire()`` / ``lock()``: the grant was released (token-qualified) and no lease is
    handed over. From ``lease.renew()``: the server renewed, but the lease's local deadline
    stays where the last acknowledged renewal put it; the lease is still held.

    ``acknowledged``: how many replicas acknowledged; ``requested``: how many were asked;
    ``fsync``: whether the local AOF fsync was asked; ``fsynced``: whether it happened (None
    when it was not asked, or when the server answered with an error)."""

    def __init__(self, message: str, key: Any = None, acknowledged: int = 0,
                 requested: int = 0, fsync: bool = False,
                 fsynced: Optional[bool] = None) -> None:
        super().__init__(message)
        self.key = key
        self.acknowledged = acknowledged
        self.requested = requested
        self.fsync = fsync
        self.fsynced = fsynced


Number = Union[int, float]
#: (host, port) of the node a key's commands were last redirected to; None: the slot's owner
#: as the client's own slot table says (always None without a cluster)
Addr = Optional[Tuple[str, int]]

#: Failures of the connection itself. asyncio.TimeoutError is a distinct class before Python
#: 3.11 and only the asyncio driver raises it; listing it here costs the sync driver nothing.
NETWORK_ERRORS = (ConnectionError, TimeoutError, OSError, asyncio.TimeoutError)
#: The slot is between owners: ask the client's slot table again after a short pause.
REROUTE_ERRORS = (TryAgainError, ClusterDownError)
#: redirects / TRYAGAINs one call follows before giving up (waits follow them until their end)
MAX_REDIRECTS = 16
#: How much longer than the server-side BLOCK timeout the socket waits for the reply.
BLOCK_REPLY_MARGIN_S = 5.0
#: How much past the local deadline release() waits for a renewal under way (the renewal
#: itself gives up at that deadline; this covers dropping its connection and waking up).
RENEWAL_WAIT_MARGIN_S = 0.1


# --- argument checks and small rules -----------------------------------------------------------

def socket_timeout_of(client: Any) -> Optional[float]:
    """The ``socket_timeout`` the redis-py client was made with (a ``Redis``' pool, a sync
    ``RedisCluster``'s nodes manager, an asyncio ``RedisCluster`` itself), or None when it has
    none (or it cannot be found)."""
    for holder in (getattr(client, "connection_pool", None),
                   getattr(client, "nodes_manager", None), client):
        kw = getattr(holder, "connection_kwargs", None)
        if isinstance(kw, dict):
            t = kw.get("socket_timeout")
            return float(t) if isinstance(t, (int, float)) and t > 0 else None
    return None


def renewal_wait_s(deadline: float, now: float, socket_timeout: Optional[float]) -> float:
    """How long release() waits for a renewal already under way: no longer than that renewal
    can itself wait for its reply (until the lease's local deadline, rule 2), and no longer
    than the client's socket_timeout when it has one."""
    wait = max(deadline - now, 0.0) + RENEWAL_WAIT_MARGIN_S
    return wait if socket_timeout is None else min(wait, socket_timeout)


def new_owner() -> str:
    """A random 128-bit owner (rule 7)."""
    return secrets.token_hex(16)


def check_ttl(ttl_ms: Any) -> int:
    if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int) or ttl_ms < 1:
        raise ValueError(f"ttl_ms must be a positive integer of milliseconds, not {ttl_ms!r}")
    return ttl_ms


def wait_seconds(wait_ms: Optional[Number]) -> Optional[float]:
    """None: one try; math.inf: no limit; else seconds."""
    if wait_ms is None or wait_ms == 0:
        return None
    if isinstance(wait_ms, bool) or not isinstance(wait_ms, (int, float)) or wait_ms < 0 \
            or math.isnan(wait_ms):
        raise ValueError(f"wait_ms must be None, 0, a positive number or math.inf, not {wait_ms!r}")
    return math.inf if math.isinf(wait_ms) else wait_ms / 1000.0


def kind_args(shared: bool, limit: Optional[int], bound: bool) -> List[Any]:
    """SHARED / LIMIT n / BOUND (SPEC 'Lock kinds', 'BOUND')."""
    out: List[Any] = []
    if shared and limit is not None:
        raise ValueError("shared=True and limit=n exclude each other (a LIMIT key is a semaphore)")
    if shared:
        out.append("SHARED")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive integer, not {limit!r}")
        out += ["LIMIT", limit]
    if bound:
        out.append("BOUND")
    return out


def block_ms(left_s: float) -> int:
    """The BLOCK argument for a wait of left_s seconds (0 = no limit on the server)."""
    if math.isinf(left_s):
        return 0
    return max(1, int(math.ceil(left_s * 1000.0)))


def is_fenced_refusal(err: Exception) -> bool:
    return str(err).startswith("FENCED")


def ms_left(deadline: float, now: float) -> int:
    """Whole milliseconds from now to deadline (floor: never more than the truth)."""
    left = deadline - now
    if left <= 0:
        return 0
    return int(left * 1000.0)


def renew_interval(ttl_ms: int) -> float:
    """Rule 2: renew at a third of the ttl."""
    return ttl_ms / 3000.0


def reroute_pause_s(redirects: int) -> float:
    """The pause before asking again after TRYAGAIN / CLUSTERDOWN: 10 ms doubling to 200 ms."""
    return min(0.2, 0.01 * (1 << min(redirects, 5)))


def release_args(key: Any, owner: str, token: Optional[int]) -> Tuple[Any, ...]:
    return ("FLOCK.RELEASE", key, owner) + ((token,) if token is not None else ())


def revoke_args(key: Any, owner: Optional[str]) -> Tuple[Any, ...]:
    return ("FLOCK.REVOKE", key) + ((owner,) if owner is not None else ())


def busy_error(key: Any, wait_ms: Optional[Number]) -> LockBusyError:
    """What ``with flock.lock(...)`` raises when the lock was not granted."""
    return LockBusyError(f"lock {key!r} not granted"
                         + (f" within {wait_ms} ms" if wait_ms else " (held by another owner)"))


# --- durable grants (rule 10) ------------------------------------------------------------------

class Durability:
    """A lease's ``replicas=`` / ``fsync=``: the command that follows its ACQUIRE and each of
    its RENEWs on the same connection (``WAIT replicas ms``, or ``WAITAOF 1 replicas ms`` with
    fsync), and how that command's reply is judged. WAIT and WAITAOF count what the connection
    itself wrote, so they must follow the granting (or renewing) command on its connection:
    that is also the one connection that reaches the key's node in a cluster."""

    __slots__ = ("replicas", "fsync", "timeout_ms")

    def __init__(self, replicas: int, fsync: bool, timeout_ms: Optional[int]) -> None:
        self.replicas = replicas
        self.fsync = fsync
        #: durable_timeout_ms as given; None: a third of the ttl of each grant or renewal
        self.timeout_ms = timeout_ms

    def wait_ms(self, ttl_ms: int, cap_ms: Optional[int] = None) -> int:
        """How long the server waits for the acknowledgements: durable_timeout_ms (default a
        third of ttl_ms), at most cap_ms (a renewal: no longer than the lease's local deadline,
        after which its answer no longer matters), at least 1 (0 would mean no limit)."""
        ms = self.timeout_ms if self.timeout_ms is not None else ttl_ms // 3
        if cap_ms is not None and cap_ms < ms:
            ms = cap_ms
        return ms if ms >= 1 else 1

    def command(self, wait_ms: int) -> Tuple[Any, ...]:
        if self.fsync:
            return ("WAITAOF", 1, self.replicas, wait_ms)
        return ("WAIT", self.replicas, wait_ms)

    def shortfall(self, key: Any, reply: Any, wait_ms: int, renewal: bool
                  ) -> Optional[LockNotDurableError]:
        """None when the WAIT / WAITAOF reply says the grant (renewal) is durable as asked;
        else the error that says how far it fell short."""
        what = "renewal" if renewal else "grant"
        then = ("the lease's local deadline stays where the last acknowledged renewal put it"
                if renewal else "the grant was released")
        name = "WAITAOF" if self.fsync else "WAIT"
        if isinstance(reply, Exception):
            return LockNotDurableError(
                f"{what} of {key!r} is not durable: {name} failed: {reply}; {then}",
                key, 0, self.replicas, self.fsync, None)
        fsynced: Optional[bool] = None
        try:
            if self.fsync:
                local, acked = int(reply[0]), int(reply[1])
                fsynced = local >= 1
            else:
                acked = int(reply)
        except (TypeError, ValueError, IndexError):
            return LockNotDurableError(
                f"{what} of {key!r} is not durable: {name} answered {reply!r}; {then}",
                key, 0, self.replicas, self.fsync, None)
        if acked >= self.replicas and fsynced is not False:
            return None
        parts = []
        if self.replicas:
            parts.append(f"{acked} of {self.replicas} replicas "
                         f"{'fsynced' if self.fsync else 'acknowledged'}")
        if fsynced is False:
            parts.append("the local AOF was not fsynced")
        return LockNotDurableError(
            f"{what} of {key!r} is not durable: {' and '.join(parts)} within {wait_ms} ms; "
            f"{then}", key, acked, self.replicas, self.fsync, fsynced)


def durability(replicas: Any, fsync: Any, durable_timeout_ms: Any, ttl_ms: int, bound: bool
               ) -> Optional[Durability]:
    """Checks an acquire's replicas / fsync / durable_timeout_ms (after acquire_command checked
    its ttl): a Durability, or None for a plain lease. Raises ValueError before anything is
    sent."""
    if type(replicas) is int and replicas == 0 and fsync is False and durable_timeout_ms is None:
        return None  # a plain lease (the usual case)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise ValueError(f"replicas must be a non-negative integer, not {replicas!r}")
    if not isinstance(fsync, bool):
        raise ValueError(f"fsync must be True or False, not {fsync!r}")
    if durable_timeout_ms is not None:
        if isinstance(durable_timeout_ms, bool) or not isinstance(durable_timeout_ms, int) \
                or durable_timeout_ms < 1:
            raise ValueError("durable_timeout_ms must be None or a positive integer of "
                             f"milliseconds, not {durable_timeout_ms!r}")
        if durable_timeout_ms >= ttl_ms:
            raise ValueError(f"durable_timeout_ms ({durable_timeout_ms}) must be shorter than "
                             f"ttl_ms ({ttl_ms}): a lease handed over after its ttl is no lease")
    if replicas == 0 and not fsync:
        return None
    if bound:
        raise ValueError("bound=True cannot be durable (replicas= / fsync=True): a BOUND grant "
                         "ends at any promotion by design")
    return Durability(replicas, fsync, durable_timeout_ms)


#: Asked once per client before its first fsync=True acquire: nil on a server without WAITAOF
#: (Redis before 7.2).
WAITAOF_PROBE = ("COMMAND", "INFO", "WAITAOF")


def has_waitaof(reply: Any) -> bool:
    """WAITAOF_PROBE's reply: whether the server knows WAITAOF."""
    return isinstance(reply, (list, tuple)) and len(reply) > 0 and reply[0] is not None


def no_waitaof_error(key: Any) -> FlockError:
    return FlockError(f"fsync=True needs WAITAOF (Redis 7.2 or later, or Valkey), and this "
                      f"server has none: nothing was sent for {key!r}")


# --- the ops a plan yields, and what each one's result is ---------------------------------------

class Checkout(NamedTuple):
    """A connection for key's commands: from the client's pool, or (cluster) from the pool of
    addr or of the node serving key's slot. Result: a slot (``slot.conn`` is the connection)
    that the plan gives back with GiveBack."""
    key: Any
    addr: Addr


class GiveBack(NamedTuple):
    """The slot's connection goes back to its pool. Result: None."""
    slot: Any


class Send(NamedTuple):
    """One command on the slot's connection (after ASKING when asking). timeout: None = the
    connection's socket timeout; math.inf = no limit; else at most that many seconds, after
    which the driver drops the connection (so a late reply is never read as the answer to a
    later command) and raises TimeoutError. Result: the reply; a redis error is raised."""
    slot: Any
    args: Tuple[Any, ...]
    timeout: Optional[float]
    asking: bool


class SendAll(NamedTuple):
    """Several commands written at once on the slot's connection (ASKING first when asking),
    their replies read in order, all within timeout (as Send's, but never None). Result: the
    list of the replies, a redis error reply in its place as the exception instance (not
    raised: the replies after it are read all the same); a network error is raised."""
    slot: Any
    commands: Tuple[Tuple[Any, ...], ...]
    timeout: float
    asking: bool


class Disconnect(NamedTuple):
    """Closes the slot's connection (it may hold a half-read reply). Result: None."""
    slot: Any


class Sleep(NamedTuple):
    seconds: float


class Forget(NamedTuple):
    """A wait that failed may have been granted with its reply lost: end any grant of owner on
    key so it is not held until its ttl. The driver does it however it can without holding up
    the error being raised (the sync driver at once, the asyncio one in a task); its failure
    is never reported. Result: None."""
    key: Any
    owner: str
    addr: Addr


Plan = Generator[Any, Any, Any]

#: What a routed command follows (redirects, TRYAGAIN / CLUSTERDOWN) or retries (network
#: errors): a driver's own first try hands these to ``routed_call(..., failed=error)``.
ROUTE_ERRORS = (AskError,) + REROUTE_ERRORS + NETWORK_ERRORS  # MovedError is an AskError


def routed_call(key: Any, args: Tuple[Any, ...], timeout: Optional[float] = None,
                addr: Addr = None, attempts: int = 1,
                failed: Optional[BaseException] = None) -> Plan:
    """One command on a connection checked out for key, following MOVED / ASK / TRYAGAIN
    (rule 5); network errors are retried up to ``attempts`` times in all. Returns (reply,
    address it came from).

    ``failed``: a driver's fast path already made the first try itself (on addr, without
    ASKING, its connection given back) and it failed with this error (one of ROUTE_ERRORS);
    the plan goes on from there as if its own first try had failed so."""
    asking = False
    redirects = 0
    failures = 0
    while True:
        if failed is None:
            slot = yield Checkout(key, addr)
            try:
                return (yield Send(slot, args, timeout, asking)), addr
            except ROUTE_ERRORS as e:
                failed = e
            finally:
                yield GiveBack(slot)
        err, failed = failed, None
        try:
            if isinstance(err, MovedError):
                addr, asking = (err.host, int(err.port)), False
            elif isinstance(err, AskError):
                addr, asking = (err.host, int(err.port)), True
            elif isinstance(err, REROUTE_ERRORS):
                addr, asking = None, False
                yield Sleep(reroute_pause_s(redirects))
            else:  # NETWORK_ERRORS
                failures += 1
                if failures >= attempts:
                    raise err
                continue
        finally:
            err = None  # (the error's traceback holds this frame)
        redirects += 1
        if redirects > MAX_REDIRECTS:
            raise ConnectionError(f"flock: too many redirects for {args[0]}")


def routed_all(key: Any, commands: Tuple[Tuple[Any, ...], ...], timeout: float,
               addr: Addr = None, attempts: int = 1) -> Plan:
    """routed_call for a few commands pipelined on one connection of key's node (the first one
    names key; the rest, such as WAIT, are keyless and must run on that same connection): a
    redirect or TRYAGAIN of the first is followed, and all of them are sent again there.
    Returns (the replies as SendAll's result, the address they came from)."""
    asking = False
    redirects = 0
    failures = 0
    while True:
        slot = yield Checkout(key, addr)
        try:
            replies = yield SendAll(slot, commands, timeout, asking)
        except NETWORK_ERRORS:
            failures += 1
            if failures >= attempts:
                raise
            continue
        finally:
            yield GiveBack(slot)
        first = replies[0]
        if isinstance(first, MovedError):
            addr, asking = (first.host, int(first.port)), False
        elif isinstance(first, AskError):
            addr, asking = (first.host, int(first.port)), True
        elif isinstance(first, REROUTE_ERRORS):
            addr, asking = None, False
            yield Sleep(reroute_pause_s(redirects))
        else:
            return replies, addr
        redirects += 1
        if redirects > MAX_REDIRECTS:
            raise ConnectionError(f"flock: too many redirects for {commands[0][0]}")


def give_up_grant(slot: Any, key: Any, owner: str, token: int, asking: bool) -> Plan:
    """RELEASE key owner token of a grant that is not durable, on the connection that got it
    (token-qualified: a newer grant of the same owner is never ended). A failure is only
    logged: the error that the caller raises next says what matters."""
    try:
        yield Send(slot, release_args(key, owner, token), None, asking)
    except Exception as e:
        log.warning("flock: release of the grant of %r that was not durable failed (%s); it "
                    "ends with its ttl", key, e)


def release_quietly(key: Any, owner: str, token: Optional[int], addr: Addr,
                    slot: Any = None) -> Plan:
    """RELEASE for a lease nobody releases any more (garbage-collected unreleased, or a wait
    that failed): on its BOUND connection, which then goes back to its pool (a network error
    there needs no RELEASE: the binding ended with the connection), or routed with one retry.
    The driver logs a failure; nobody is told."""
    args = release_args(key, owner, token)
    if slot is not None:
        try:
            yield Send(slot, args, None, False)
        except NETWORK_ERRORS:
            yield Disconnect(slot)
        finally:
            yield GiveBack(slot)
        return
    yield from routed_call(key, args, addr=addr, attempts=2)


# --- acquiring --------------------------------------------------------------------------------

#: What a granted acquire gives the driver to make its Lease of: (key, owner, token, ttl_ms,
#: sent, addr, slot). sent: monotonic time the granting command was sent (the local deadline
#: counts from it); slot: BOUND: the slot whose connection the grant lives on, else None.
Grant = Tuple[Any, str, int, int, float, Addr, Any]

#: on_acquire_reply(): the first try was not granted and the acquire waits: the driver runs
#: acquire_wait_plan() next
WAIT: Any = object()


def acquire_command(key: Any, ttl_ms: int, wait_ms: Optional[Number], shared: bool,
                    limit: Optional[int], bound: bool, owner: Optional[str]
                    ) -> Tuple[Tuple[Any, ...], Optional[float]]:
    """Checks an acquire's arguments: (its FLOCK.ACQUIRE key owner ttl [kind] command, the
    wait in seconds: None one try, math.inf no limit). The owner is ``command[2]``: the given
    one or a new random one.

    A driver, right after this: unless BOUND (which needs a connection of its own from the
    start), the first try is one routed call of the command on the shared pool with
    ``attempts=2`` (a free key: one round trip, waiting or not; a retry after a lost reply is
    safe: the same owner gets the same token, G4), its reply passed to on_acquire_reply().
    When that answers WAIT, or at once for BOUND, it runs acquire_wait_plan(). A durable
    acquire (``durability()`` answered a Durability) skips the shared-pool try: it runs
    acquire_wait_plan() at once, which pipelines the WAIT on its own connection."""
    ttl = check_ttl(ttl_ms)
    wait_s = wait_seconds(wait_ms)
    extra = kind_args(shared, limit, bound)
    own = new_owner() if owner is None else owner
    return ("FLOCK.ACQUIRE", key, own, ttl, *extra), wait_s


def on_acquire_reply(command: Tuple[Any, ...], wait_s: Optional[float], token: Any, sent: float,
                     addr: Addr) -> Any:
    """The first try's reply (sent: when it was sent; a retry counts from the first send): a
    Grant, None (not granted, one try), or WAIT."""
    if token is not None:
        return command[1], command[2], int(token), command[3], sent, addr, None
    return None if wait_s is None else WAIT


def acquire_wait_plan(command: Tuple[Any, ...], wait_s: Optional[float], start: float,
                      bound: bool, own_owner: bool, durable: Optional[Durability] = None
                      ) -> Plan:
    """ACQUIRE [BLOCK] on a connection of its own (rule 8): a wait never holds up another
    lease's commands; a BOUND grant keeps the connection. Follows TRYAGAIN / MOVED / ASK (a
    slot moved while waiting) to the slot's new owner (rule 5). A Grant, or None when not
    granted within wait_s (counted from start); own_owner: the owner is the client's own.

    durable (rule 10; never with bound): the first try is ``ACQUIRE`` and ``WAIT`` /
    ``WAITAOF`` pipelined on the connection, without BLOCK (a free key: one round trip plus
    the acknowledgements); a wait then goes on with ``ACQUIRE ... BLOCK``, and the RENEW that
    follows its grant (rule 1) is pipelined with the WAIT: on the same connection, so it
    counts the grant and the renewal both. A grant that too few acknowledged is released
    (token-qualified, on that connection) and LockNotDurableError raised."""
    key, owner, ttl = command[1], command[2], command[3]
    end = math.inf if wait_s is None or math.isinf(wait_s) else start + wait_s
    addr: Addr = None
    asking = False
    redirects = 0
    failures = 0
    plain_first = durable is not None  # a durable wait tries without BLOCK first
    while True:
        left = end - monotonic()
        if wait_s is not None and left <= 0:
            return None
        slot = yield Checkout(key, addr)
        keep = False
        try:
            if wait_s is None or plain_first:
                sent = monotonic()
                if durable is None:
                    token = yield Send(slot, command, None, asking)
                else:
                    wait_ms = durable.wait_ms(ttl)
                    token, ack = yield SendAll(slot, (command, durable.command(wait_ms)),
                                               wait_ms / 1000.0 + BLOCK_REPLY_MARGIN_S, asking)
                    if isinstance(token, Exception):
                        raise token  # a redirect is followed below; only a grant counts
                if token is None:
                    if wait_s is None:
                        return None
                    plain_first = False
                    continue  # taken: wait for it with BLOCK
            else:
                token = yield Send(slot, command + ("BLOCK", block_ms(left)),
                                   left + BLOCK_REPLY_MARGIN_S, asking)
                if token is None:
                    return None  # the server's BLOCK timeout
                # Rule 1: the wait may have outlasted the ttl. Renew at once, token-qualified,
                # and count from this RENEW.
                sent = monotonic()
                renew = ("FLOCK.RENEW", key, owner, ttl, token)
                if durable is None:
                    again = yield Send(slot, renew, ttl / 1000.0, asking)
                else:
                    wait_ms = durable.wait_ms(ttl)
                    again, ack = yield SendAll(slot, (renew, durable.command(wait_ms)),
                                               ttl / 1000.0, asking)
                    if isinstance(again, Exception):
                        raise again
                if again is None:
                    continue  # expired before we could use it: wait again
            if durable is not None:
                short = durable.shortfall(key, ack, wait_ms, False)
                if short is not None:
                    yield from give_up_grant(slot, key, owner, int(token), asking)
                    raise short
            keep = bound
            return key, owner, int(token), ttl, sent, addr, slot if bound else None
        except MovedError as e:
            addr, asking = (e.host, int(e.port)), False
        except AskError as e:
            addr, asking = (e.host, int(e.port)), True
        except REROUTE_ERRORS:
            addr, asking = None, False
            yield Sleep(reroute_pause_s(redirects))
        except NETWORK_ERRORS:
            # A retried ACQUIRE of the same owner is safe: it takes the earlier request's
            # place, or gets the same token back if the lost reply was a grant.
            failures += 1
            if failures >= 2:
                if own_owner:
                    yield Forget(key, owner, addr)
                raise
            continue
        except asyncio.CancelledError:
            # (only the asyncio driver throws this in) a grant whose reply was cut off must not
            # stay held until its ttl
            if own_owner:
                yield Forget(key, owner, addr)
            raise
        finally:
            if not keep:
                yield GiveBack(slot)
        redirects += 1
        if redirects > MAX_REDIRECTS and wait_s is None:
            raise ConnectionError("flock: too many redirects for FLOCK.ACQUIRE")
        if redirects > 4:  # a cluster in flux: do not spin
            yield Sleep(reroute_pause_s(redirects - 4))


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

    def __repr__(self) -> str:
        state = "lost" if self._lost else "released" if self._released else "live"
        return f"<Lease key={self.key!r} owner={self.owner!r} token={self.token} {state}>"

    def _on_lost(self) -> None:
        """The driver's hook, called once when the lease becomes lost (with _state held):
        wakes its waiters, stops its watchdog."""

    # -- state -------------------------------------------------------------------------------
    def _set_lost_locked(self, reason: str) -> None:
        if not self._lost:
            self._lost = True
            self.lost_reason = reason
            self._watching = False
            self._on_lost()

    def _set_lost(self, reason: str) -> None:
        with self._state:
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
            with self._state:
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

    def ensure(self, min_ms: Number = 0) -> None:
        """Before a critical step: raises LockLostError when the lease is lost (or released),
        LeaseTooShortError when it has less than min_ms left. By the local clock alone: no
        round trip, so a process that was paused learns it at once."""
        if self.lost:
            raise self._lost_error()
        if self._released:
            raise LockLostError(f"lease of {self.key!r} was released")
        left = self.remaining_ms()
        if left < min_ms:
            if left == 0 and self.lost:
                raise self._lost_error()
            raise LeaseTooShortError(
                f"lease of {self.key!r} has {left} ms left, less than the {min_ms} ms needed")

    def _lost_error(self) -> LockLostError:
        return LockLostError(f"lease of {self.key!r} is lost: {self.lost_reason}")

    def _lost_while_held(self) -> LockLostError:
        """What leaving a ``with`` block without an error raises after the release when the
        lease is lost (``_lost``)."""
        return LockLostError(f"lease of {self.key!r} was lost while held: {self.lost_reason}")

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
        self._set_lost("the connection of the BOUND lease failed")

    def _check_command(self) -> Tuple[Any, ...]:
        return ("FLOCK.CHECK", self.key, self.token)

    def _on_check_reply(self, left: Any) -> int:
        if not left:
            self._set_lost("FLOCK.CHECK answered 0: the grant is gone")
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
                    raise LockLostError(f"lease of {self.key!r} was released")
                return None
            if not self._lost and now >= self._deadline:
                self._set_lost_locked("the local deadline passed before a renewal (rule 2)")
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
                self._set_lost_locked("FLOCK.RENEW answered nil: the grant is gone")
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
            self._set_lost(f"the connection of the BOUND lease failed: {e}")
            return False
        # Retry soon, but never past the local deadline (checked before each send).
        self._backoff = min(max(self._backoff * 2, 0.01), 0.25, self.ttl_ms / 12000.0)
        self._next_due = min(monotonic() + self._backoff, self._deadline)
        log.debug("flock: renewal of %r failed (%s); retrying", self.key, e)
        return self._watching

    def _fenced_command(self, command: Tuple[Any, ...]) -> Tuple[Any, ...]:
        return ("FLOCK.FENCED", self.key, self.token, *command)

    def _on_fenced_error(self, e: ResponseError) -> None:
        """A FLOCK.FENCED answered with an error (the driver calls this in its ``except
        ResponseError`` and re-raises the error when this returns): a refusal (stale token)
        marks the lease lost and raises FencedError."""
        if is_fenced_refusal(e):
            self._set_lost(f"a fenced write was refused: {e}")
            raise FencedError(str(e)) from e

    def _begin_release(self) -> Tuple[bool, bool]:
        """The first half of release(), before any I/O: (first, was_watching). first is False
        when release() ran before (its answer is _released_ok). Once this ran no renewal
        starts, and a renewal's reply never marks the lease lost."""
        with self._state:
            if self._released:
                return False, False
            if not self._lost and monotonic() >= self._deadline:
                self._set_lost_locked("the local deadline passed (rule 1)")
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
                self._set_lost_locked("FLOCK.RELEASE answered 0: the grant had ended")
        return self._released_ok
