"""Types, constants, argument checks and the small rules the lease core applies (rules 1, 2,
5, 7 and 12 of docs/CLIENTS.md). No I/O."""
from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from typing import Any, List, Optional, Tuple, Union

from redis.exceptions import ClusterDownError, ConnectionError, TimeoutError, TryAgainError

from ._errors import InvalidArgumentError, LockBusyError

log = logging.getLogger("redis_flock")
monotonic = time.monotonic

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


#: the longest owner, in bytes of UTF-8 (rule 12)
MAX_OWNER_BYTES = 256


def check_key(key: Any) -> Any:
    """Rule 12: a key is a non-empty str or bytes."""
    if type(key) is str or type(key) is bytes:  # (the usual case, checked first)
        if key:
            return key
    elif isinstance(key, (str, bytes)) and key:
        return key
    raise InvalidArgumentError(f"key must be a non-empty str or bytes, not {key!r}")


def check_owner(owner: Any) -> str:
    """Rule 12: an owner is a non-empty str of at most 256 bytes of UTF-8."""
    if isinstance(owner, str) and owner and (len(owner) <= MAX_OWNER_BYTES // 4
                                             or len(owner.encode()) <= MAX_OWNER_BYTES):
        return owner
    raise InvalidArgumentError(f"owner must be a non-empty str of at most {MAX_OWNER_BYTES} "
                               f"bytes, not {owner!r}")


def check_token(token: Any) -> int:
    if isinstance(token, bool) or not isinstance(token, int) or token < 1:
        raise InvalidArgumentError(f"token must be a positive integer, not {token!r}")
    return token


def check_flag(name: str, value: Any) -> bool:
    if value is True or value is False:
        return value
    raise InvalidArgumentError(f"{name} must be True or False, not {value!r}")


def refuse_unknown(unknown: Any) -> None:
    """Rule 12: an option this client does not know (a misspelt ``wait=``) is an error, not
    ignored."""
    if unknown:
        raise InvalidArgumentError(f"unknown option{'s' if len(unknown) > 1 else ''}: "
                                   f"{', '.join(sorted(unknown))}")


def check_ttl(ttl_ms: Any) -> int:
    if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int) or ttl_ms < 1:
        raise InvalidArgumentError(f"ttl_ms must be a positive integer of milliseconds, "
                                   f"not {ttl_ms!r}")
    return ttl_ms


def wait_seconds(wait_ms: Optional[Number]) -> Optional[float]:
    """None: one try; math.inf: no limit; else seconds."""
    if wait_ms is None or wait_ms == 0:
        return None
    if isinstance(wait_ms, bool) or not isinstance(wait_ms, (int, float)) or wait_ms < 0 \
            or math.isnan(wait_ms):
        raise InvalidArgumentError(f"wait_ms must be None, 0, a positive number or math.inf, "
                                   f"not {wait_ms!r}")
    return math.inf if math.isinf(wait_ms) else wait_ms / 1000.0


def kind_args(shared: bool, limit: Optional[int], bound: bool) -> List[Any]:
    """SHARED / LIMIT n / BOUND (SPEC 'Lock kinds', 'BOUND')."""
    out: List[Any] = []
    if shared is not False and shared is not True:
        check_flag("shared", shared)
    if bound is not False and bound is not True:
        check_flag("bound", bound)
    if shared and limit is not None:
        raise InvalidArgumentError("shared=True and limit=n exclude each other (a LIMIT key is a "
                                   "semaphore)")
    if shared:
        out.append("SHARED")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidArgumentError(f"limit must be a positive integer, not {limit!r}")
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


def checked_release_args(key: Any, owner: Any, token: Any) -> Tuple[Any, ...]:
    """``flock.release(key, owner, token=None)``'s command, its arguments checked (rule 12)."""
    return release_args(check_key(key), check_owner(owner),
                        None if token is None else check_token(token))


def revoke_args(key: Any, owner: Optional[str]) -> Tuple[Any, ...]:
    check_key(key)
    if owner is not None:
        check_owner(owner)
    return ("FLOCK.REVOKE", key) + ((owner,) if owner is not None else ())


def busy_error(key: Any, wait_ms: Optional[Number]) -> LockBusyError:
    """What ``with flock.lock(...)`` raises when the lock was not granted."""
    return LockBusyError(f"lock {key!r} not granted"
                         + (f" within {wait_ms} ms" if wait_ms else " (held by another owner)"))

