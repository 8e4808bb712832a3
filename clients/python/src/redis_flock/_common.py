"""What the sync and the asyncio client share: errors, arguments, owners, small helpers."""
from __future__ import annotations

import math
import secrets
from typing import Any, List, Optional, Union

__all__ = [
    "FlockError",
    "LockBusyError",
    "LockLostError",
    "LeaseTooShortError",
    "FencedError",
]


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


Number = Union[int, float]

#: How much longer than the server-side BLOCK timeout the socket waits for the reply.
BLOCK_REPLY_MARGIN_S = 5.0
#: A "forever" read timeout (asyncio read timeouts need a number).
FOREVER_S = 365 * 86400.0
#: How much past the local deadline release() waits for a renewal under way (the renewal
#: itself gives up at that deadline; this covers dropping its connection and waking up).
RENEWAL_WAIT_MARGIN_S = 0.1


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
