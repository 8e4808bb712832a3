"""The ops a plan yields (see ``_core``), and the plans that route a command, acquire (with
a wait) and release in the background. No I/O of their own: a driver carries out the ops."""
from __future__ import annotations

import asyncio
import math
from typing import Any, Generator, NamedTuple, Optional, Tuple

from redis.exceptions import AskError, ConnectionError, MovedError

from ._durable import Durability
from ._rules import (
    BLOCK_REPLY_MARGIN_S,
    MAX_REDIRECTS,
    NETWORK_ERRORS,
    REROUTE_ERRORS,
    Addr,
    Number,
    block_ms,
    check_ttl,
    kind_args,
    check_key,
    check_owner,
    log,
    monotonic,
    new_owner,
    release_args,
    reroute_pause_s,
    wait_seconds,
)

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


def send_with_ack(slot: Any, command: Tuple[Any, ...], durable: Optional[Durability], ttl: int,
                  timeout: Optional[float], asking: bool) -> Plan:
    """``command`` on ``slot``, and for a durable lease (rule 10) its WAIT/WAITAOF in the same
    write, within ``timeout`` (a durable one's default: the server's wait plus a margin).
    Result: ``(reply, ack)``, ``ack`` None when not durable; an error reply of the command is
    raised (a redirect is then followed by the caller: only a grant counts)."""
    if durable is None:
        reply = yield Send(slot, command, timeout, asking)
        return reply, None
    wait_ms = durable.wait_ms(ttl)
    if timeout is None:
        timeout = wait_ms / 1000.0 + BLOCK_REPLY_MARGIN_S
    reply, ack = yield SendAll(slot, (command, durable.command(wait_ms)), timeout, asking)
    if isinstance(reply, Exception):
        raise reply
    return reply, ack


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
    check_key(key)
    ttl = check_ttl(ttl_ms)
    wait_s = wait_seconds(wait_ms)
    extra = kind_args(shared, limit, bound)
    own = new_owner() if owner is None else check_owner(owner)
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
                token, ack = yield from send_with_ack(slot, command, durable, ttl, None, asking)
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
                again, ack = yield from send_with_ack(slot, renew, durable, ttl, ttl / 1000.0,
                                                      asking)
                if again is None:
                    continue  # expired before we could use it: wait again
            if durable is not None:
                short = durable.shortfall(key, ack, durable.wait_ms(ttl), False)
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

