"""redis-flock: the client half of flock's fenced locks for Redis.

    from redis import Redis
    from redis_flock import Flock

    flock = Flock(Redis())
    with flock.lock("orders:42:lock", ttl_ms=10_000) as lease:
        lease.fenced("SET", "orders:42:state", "paid")

The asyncio client is ``redis_flock.aio.Flock``.
"""
from ._core import (
    FencedError,
    FlockError,
    InvalidArgumentError,
    LeaseTooShortError,
    LockBusyError,
    LockLostError,
    LockNotDurableError,
)
from ._errors import LOSS_REASONS
from ._election import Leader
from ._inspect import Holder, Waiter
from ._sync import Flock, Lease

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
    "LOSS_REASONS",
    "Leader",
]
__version__ = "0.1.0"
