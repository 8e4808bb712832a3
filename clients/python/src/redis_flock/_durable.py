"""Durable grants (rule 10 of docs/CLIENTS.md): the WAIT / WAITAOF that follows a grant or a
renewal, and how its reply is judged. No I/O."""
from __future__ import annotations

from typing import Any, Optional, Tuple

from ._errors import FlockError, InvalidArgumentError, LockNotDurableError

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
    its ttl): a Durability, or None for a plain lease. Raises InvalidArgumentError before anything is
    sent."""
    if type(replicas) is int and replicas == 0 and fsync is False and durable_timeout_ms is None:
        return None  # a plain lease (the usual case)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise InvalidArgumentError(f"replicas must be a non-negative integer, not {replicas!r}")
    if not isinstance(fsync, bool):
        raise InvalidArgumentError(f"fsync must be True or False, not {fsync!r}")
    if durable_timeout_ms is not None:
        if isinstance(durable_timeout_ms, bool) or not isinstance(durable_timeout_ms, int) \
                or durable_timeout_ms < 1:
            raise InvalidArgumentError("durable_timeout_ms must be None or a positive integer of "
                             f"milliseconds, not {durable_timeout_ms!r}")
        if durable_timeout_ms >= ttl_ms:
            raise InvalidArgumentError(f"durable_timeout_ms ({durable_timeout_ms}) must be shorter than "
                             f"ttl_ms ({ttl_ms}): a lease handed over after its ttl is no lease")
    if replicas == 0 and not fsync:
        return None
    if bound:
        raise InvalidArgumentError("bound=True cannot be durable (replicas= / fsync=True): a BOUND grant "
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

