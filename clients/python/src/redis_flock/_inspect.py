"""Inspection without a lease (docs/CLIENTS.md, "The API every client offers"): the commands
of ``info``, ``holders``, ``waiters``, ``locked``, ``check`` and ``stats``, and their replies as
Python values (the same under RESP2's flat arrays and RESP3's maps, with or without
``decode_responses``). No I/O."""
from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from ._errors import InvalidArgumentError
from ._rules import check_key, check_token


class Holder(NamedTuple):
    """One live grant of a key (FLOCK.HOLDERS): its owner, token and the ms left."""
    owner: str
    token: int
    ttl_ms: int


class Waiter(NamedTuple):
    """One waiting request (FLOCK.WAITERS), first in line first: its owner, its mode
    (``exclusive``, ``shared`` or ``permit``) and how long it has waited, in ms."""
    owner: str
    mode: str
    waited_ms: int


def text(x: Any) -> Any:
    return x.decode("utf-8", "replace") if isinstance(x, (bytes, bytearray)) else x


def as_map(reply: Any) -> Dict[str, Any]:
    """A map reply (RESP3) or a flat array of pairs (RESP2) as a dict with str keys, nested
    maps converted too."""
    if isinstance(reply, dict):
        items = list(reply.items())
    else:
        items = [(reply[i], reply[i + 1]) for i in range(0, len(reply) - 1, 2)]
    out: Dict[str, Any] = {}
    for k, v in items:
        if isinstance(v, dict) or (isinstance(v, list) and len(v) % 2 == 0 and v
                                   and isinstance(v[0], (bytes, str))):
            v = as_map(v)
        out[text(k)] = v
    return out


#: FLOCK.INFO's fields that are text (the rest are integers, or None)
INFO_TEXT = ("owner", "mode")


def info_command(key: Any) -> Tuple[Any, ...]:
    return ("FLOCK.INFO", check_key(key))


def on_info(reply: Any) -> Optional[Dict[str, Any]]:
    """FLOCK.INFO as a dict with its field names (``owner``, ``token``, ``ttl``, ``waiters``,
    ``mode``, ``holders``, ``limit``, ``delayed``), or None when the key is unknown."""
    if reply is None:
        return None
    out = as_map(reply)
    for k in INFO_TEXT:
        if k in out:
            out[k] = text(out[k])
    return out


def holders_command(key: Any) -> Tuple[Any, ...]:
    return ("FLOCK.HOLDERS", check_key(key))


def on_holders(reply: Any) -> List[Holder]:
    return [Holder(text(o), int(t), int(ms)) for o, t, ms in reply or ()]


def waiters_command(key: Any, count: Optional[int] = None) -> Tuple[Any, ...]:
    if count is None:
        return ("FLOCK.WAITERS", check_key(key))
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InvalidArgumentError(f"count must be None or a positive integer, not {count!r}")
    return ("FLOCK.WAITERS", check_key(key), "COUNT", count)


def on_waiters(reply: Any) -> List[Waiter]:
    return [Waiter(text(o), text(m), int(ms)) for o, m, ms in reply or ()]


def on_locked(reply: Any) -> bool:
    """FLOCK.INFO's reply: whether a live grant holds the key (a key with waiters or in
    lock-delay but no holder is not locked)."""
    info = on_info(reply)
    return bool(info and info.get("holders"))


def check_command(key: Any, token: Any) -> Tuple[Any, ...]:
    return ("FLOCK.CHECK", check_key(key), check_token(token))


def stats_command(classes: Tuple[Any, ...]) -> Tuple[Any, ...]:
    for c in classes:
        if not isinstance(c, (str, bytes)) or not c:
            raise InvalidArgumentError(f"a class is a non-empty str or bytes, not {c!r}")
    return ("FLOCK.STATS", "GET", *classes)


def on_stats(reply: Any) -> Dict[str, Any]:
    """FLOCK.STATS GET as a dict: ``classes`` (class name -> its figures, a dict) and
    ``overflow``."""
    out = as_map(reply)
    classes = out.get("classes")
    if isinstance(classes, list) and not classes:
        out["classes"] = {}
    return out
