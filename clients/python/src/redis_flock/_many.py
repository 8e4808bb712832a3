"""Several keys at once (``lock_many`` / ``acquire_many`` over FLOCK.MACQUIRE): the argument
checks, and the plan that acquires, with a wait, all the keys or none. No I/O of its own: a
driver carries out the plan's ops and makes one ordinary Lease of each Grant it returns."""
from __future__ import annotations

import asyncio
import math
import threading
import weakref
from typing import Any, Optional, Sequence, Tuple

from redis.exceptions import AskError, ConnectionError, MovedError

from ._durable import Durability
from ._errors import InvalidArgumentError, LockBusyError
from ._plans import (Checkout, Forget, GiveBack, Plan, Send, SendAll, Sleep, give_up_grant,
                     send_with_ack)
from ._rules import (
    BLOCK_REPLY_MARGIN_S,
    MAX_REDIRECTS,
    NETWORK_ERRORS,
    REROUTE_ERRORS,
    Addr,
    Number,
    block_ms,
    check_key,
    check_owner,
    check_ttl,
    monotonic,
    new_owner,
    reroute_pause_s,
    wait_seconds,
)

#: FLOCK.MACQUIRE takes 1 to 64 keys (SPEC)
MAX_KEYS = 64


def _key_bytes(key: Any) -> bytes:
    return key.encode() if isinstance(key, str) else bytes(key)


def check_keys(keys: Any) -> Tuple[Any, ...]:
    """Rule 12, before anything is sent: a list or tuple of 1 to 64 keys, each a non-empty str
    or bytes, no key twice ("a" and b"a" are the same key on the server)."""
    if isinstance(keys, (str, bytes)) or not isinstance(keys, (list, tuple)):
        raise InvalidArgumentError(f"keys must be a list or tuple of keys, not {keys!r}")
    if not keys:
        raise InvalidArgumentError("keys must name at least one key")
    if len(keys) > MAX_KEYS:
        raise InvalidArgumentError(f"keys names {len(keys)} keys, more than the {MAX_KEYS} "
                                   "FLOCK.MACQUIRE takes")
    seen = set()
    for key in keys:
        kb = _key_bytes(check_key(key))
        if kb in seen:
            raise InvalidArgumentError(f"keys names {key!r} twice")
        seen.add(kb)
    return tuple(keys)


def acquire_many_command(keys: Any, ttl_ms: int, wait_ms: Optional[Number],
                         owner: Optional[str], bound: Any = False
                         ) -> Tuple[Tuple[Any, ...], Optional[float]]:
    """Checks acquire_many's arguments: (FLOCK.MACQUIRE numkeys key... owner ttl [BOUND], the
    wait in seconds: None one try, math.inf no limit). ``many_parts(command)`` names its
    keys, owner and ttl (the owner: the given one or a new random one)."""
    ks = check_keys(keys)
    ttl = check_ttl(ttl_ms)
    wait_s = wait_seconds(wait_ms)
    if bound is not True and bound is not False:
        raise InvalidArgumentError(f"bound must be True or False, not {bound!r}")
    own = new_owner() if owner is None else check_owner(owner)
    return ("FLOCK.MACQUIRE", len(ks), *ks, own, ttl) + (("BOUND",) if bound else ()), wait_s


def many_parts(command: Tuple[Any, ...]) -> Tuple[Tuple[Any, ...], str, int]:
    """A MACQUIRE command's (keys, owner, ttl)."""
    n = command[1]
    return command[2:2 + n], command[2 + n], command[3 + n]


def many_busy_error(keys: Sequence[Any], wait_ms: Optional[Number]) -> LockBusyError:
    """What ``lock_many`` raises when the keys were not granted (none was taken)."""
    return LockBusyError(f"locks {list(keys)!r} not granted together"
                         + (f" within {wait_ms} ms" if wait_ms else " (one is taken)"))


def acquire_many_plan(command: Tuple[Any, ...], wait_s: Optional[float], start: float,
                      own_owner: bool, durable: Optional[Durability] = None) -> Plan:
    """FLOCK.MACQUIRE on a connection of its own (rule 8): one Grant per key in the order
    given, or None when not granted (within wait_s, counted from start; nothing is then
    held). The first try is without BLOCK (a free set of keys: one round trip); a wait goes on
    with BLOCK, waiting in every key's queue at once. Rule 1: a grant after a wait is confirmed
    by a token-qualified RENEW of each key, pipelined, and counted from it; when one of them
    ran out meanwhile, the others are released (token-qualified) and the wait goes on. All
    keys are in one slot: MOVED / ASK / TRYAGAIN are followed as for one key (rule 5).

    BOUND (the command ends with it): every grant lives on the connection that made it, which
    the plan keeps (each Grant names its slot); the driver shares it among the leases.
    durable (rule 10; never with BOUND): the WAIT / WAITAOF is pipelined after the MACQUIRE
    (after a wait: after its RENEWs) on the same connection; too few acknowledgements, and
    every key is released (token-qualified) and LockNotDurableError raised."""
    keys, owner, ttl = many_parts(command)
    bound = command[-1] == "BOUND"
    first = keys[0]
    end = math.inf if wait_s is None or math.isinf(wait_s) else start + wait_s
    addr: Addr = None
    asking = False
    redirects = 0
    failures = 0
    plain_first = True
    while True:
        left = end - monotonic()
        if wait_s is not None and left <= 0:
            return None
        slot = yield Checkout(first, addr)
        keep = False
        try:
            if plain_first:
                sent = monotonic()
                tokens, ack = yield from send_with_ack(slot, command, durable, ttl, None, asking)
                if tokens is None:
                    if wait_s is None:
                        return None
                    plain_first = False
                    continue  # one is taken: wait for all of them with BLOCK
            else:
                tokens = yield Send(slot, command + ("BLOCK", block_ms(left)),
                                    left + BLOCK_REPLY_MARGIN_S, asking)
                if tokens is None:
                    return None  # the server's BLOCK timeout
                sent = monotonic()
                renews = tuple(("FLOCK.RENEW", k, owner, ttl, t) for k, t in zip(keys, tokens))
                if durable is not None:
                    renews += (durable.command(durable.wait_ms(ttl)),)
                again = yield SendAll(slot, renews, ttl / 1000.0, asking)
                if durable is not None:
                    ack = again.pop()
                if any(a is None or isinstance(a, Exception) for a in again):
                    for k, t, a in zip(keys, tokens, again):
                        if a is not None and not isinstance(a, Exception):
                            yield from give_up_grant(slot, k, owner, int(t), asking)
                    continue  # one ran out before we could use it: wait again for all
            if durable is not None:
                short = durable.shortfall(list(keys), ack, durable.wait_ms(ttl), False)
                if short is not None:
                    for k, t in zip(keys, tokens):
                        yield from give_up_grant(slot, k, owner, int(t), asking)
                    raise short
            keep = bound
            return [(k, owner, int(t), ttl, sent, addr, slot if bound else None)
                    for k, t in zip(keys, tokens)]
        except MovedError as e:
            addr, asking = (e.host, int(e.port)), False
        except AskError as e:
            addr, asking = (e.host, int(e.port)), True
        except REROUTE_ERRORS:
            addr, asking = None, False
            yield Sleep(reroute_pause_s(redirects))
        except NETWORK_ERRORS:
            # A retried MACQUIRE of the same owner gets the keys it holds back with their
            # tokens (a lost reply that was a grant); the lost connection took a wait with it.
            failures += 1
            if failures >= 2:
                if own_owner:
                    for k in keys:
                        yield Forget(k, owner, addr)
                raise
            continue
        except asyncio.CancelledError:
            # (asyncio only) grants whose reply was cut off must not stay held until their ttl
            if own_owner:
                for k in keys:
                    yield Forget(k, owner, addr)
            raise
        finally:
            if not keep:
                yield GiveBack(slot)
        redirects += 1
        if redirects > MAX_REDIRECTS and wait_s is None:
            raise ConnectionError("flock: too many redirects for FLOCK.MACQUIRE")
        if redirects > 4:  # a cluster in flux: do not spin
            yield Sleep(reroute_pause_s(redirects - 4))


def raise_after_release_all(leases: Sequence[Any], failed: Optional[BaseException],
                            exc_type: Any) -> None:
    """Leaving ``lock_many``'s block, once every lease's release was tried (failed: the first
    release that raised): the block's own error goes on unchanged (nothing raised here); else
    that release's error, else LockLostError of the first lease lost while held."""
    if exc_type is not None:
        return
    if failed is not None:
        raise failed
    for lease in leases:
        if lease._lost:
            raise lease._lost_while_held()


class SharedPool:
    """(sync) The pool of the one connection that the BOUND leases of one lock_many share: it
    goes back to its pool when the last of them gives it back."""
    __slots__ = ("pool", "left", "lock")

    def __init__(self, pool: Any, n: int) -> None:
        self.pool, self.left, self.lock = pool, n, threading.Lock()

    def release(self, conn: Any) -> None:
        with self.lock:
            self.left -= 1
            last = self.left == 0
        if last:
            self.pool.release(conn)


def link_bound_set(leases: Sequence[Any]) -> None:
    """The leases of one ``lock_many(bound=True)`` share one connection: one command at a time
    on it (one I/O lock), and its loss is every one's (``_bound_set``)."""
    refs = [weakref.ref(lease) for lease in leases]
    for lease in leases:
        lease._io = leases[0]._io
        lease._bound_set = refs
