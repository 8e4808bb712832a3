"""The errors this client raises, and why a lease is lost (rule 12 of docs/CLIENTS.md)."""
from __future__ import annotations

from typing import Any, Optional

# --- errors --------------------------------------------------------------------------------------

class FlockError(Exception):
    """Base class of every error this client raises itself (redis-py's own errors, such as
    ``redis.ConnectionError``, pass through unchanged)."""


class LockBusyError(FlockError):
    """The lock was not granted within ``wait_ms`` (``flock.lock``)."""


class InvalidArgumentError(FlockError, ValueError):
    """An argument the client refused before sending anything (rule 12): an empty key, a ttl
    that is not a positive integer, an owner that is not a non-empty str of at most 256 bytes,
    an unknown option, options that exclude each other..."""


#: Why a lease was lost (``lease.lost_reason``, ``LockLostError.reason``; rule 12):
REVOKED = "revoked"  # FLOCK.REVOKE, or another process released the grant with its owner
EXPIRED = "expired"  # the server says the grant's ttl ran out
CLOSED = "closed"  # the BOUND lease's connection closed
LOST = "lost"  # the server ended the grant another way: DEL, UNLINK, FLUSHALL, eviction...
GONE = "gone"  # the server no longer knows the grant and cannot say how it ended
RENEW_REFUSED = "renew-refused"  # a token-qualified FLOCK.RENEW answered nil
DEADLINE_PASSED = "deadline-passed"  # the local deadline passed (rule 1)
FENCED_REFUSED = "fenced-refused"  # FLOCK.FENCED refused the token as stale
#: not a loss: what LockLostError says of a lease that was released (ensure, renew, fenced)
RELEASED = "released"
LOSS_REASONS = (REVOKED, EXPIRED, CLOSED, LOST, GONE, RENEW_REFUSED, DEADLINE_PASSED,
                FENCED_REFUSED)


class LockLostError(FlockError):
    """The lease is lost: ended by nobody's release but by REVOKE, expiry, its BOUND
    connection closing, a DEL of its key, a refused renewal, a stale fenced write, or its local
    deadline passing (rule 1). ``reason`` says which (one of LOSS_REASONS, or ``"released"``
    when the lease was released, or None for LeaseTooShortError); ``key`` and ``token`` name
    the lease."""

    def __init__(self, message: str, reason: Optional[str] = None, key: Any = None,
                 token: Optional[int] = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.key = key
        self.token = token


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

