"""Leader election over one key (docs/CLIENTS.md, "The API every client offers"), shared by the
sync and asyncio drivers: what a leader is (the key's exclusive BOUND grant), and the plan that
observes leader changes with FLOCK.WATCH, never by polling. No I/O of its own."""
from __future__ import annotations

from typing import Any, NamedTuple, Optional, Tuple

from redis.exceptions import AskError, MovedError

from ._inspect import on_info
from ._plans import Checkout, Disconnect, GiveBack, Plan, Send, Sleep
from ._rules import NETWORK_ERRORS, REROUTE_ERRORS, reroute_pause_s
from ._watch import WATCH_TIMEOUT_MS


class Leader(NamedTuple):
    """The current leader: its owner and the token of its grant (the fencing token of its
    term: a newer leader always has a larger one)."""
    owner: str
    token: int


class Emit(NamedTuple):
    """Not I/O: the observe plan hands this value to its consumer and waits to be resumed."""
    value: Any


def leader_of(info_reply: Any) -> Optional[Leader]:
    """FLOCK.INFO's reply: the leader, or None while nobody holds the key."""
    info = on_info(info_reply)
    if not info or not info.get("holders") or info.get("token") is None:
        return None
    return Leader(info["owner"], int(info["token"]))


def observe_plan(key: Any) -> Plan:
    """Yields Emit(leader or None) for the state at the start and for each change after it.
    A change is learned from a FLOCK.WATCH on the plan's own connection: token 0 while the key
    is free (fires when someone leads), the leader's token while it leads (fires when its term
    ends); after each, one FLOCK.INFO reads who leads now. A WATCH that times out (every
    WATCH_TIMEOUT_MS) only re-reads the state. The plan never ends; its consumer stops resuming
    it and gives back the connection it checked out (see the drivers' observers)."""
    slot = None
    addr = None
    last: Any = Emit  # (no state emitted yet)
    failures = 0
    while True:
        try:
            if slot is None:
                slot = yield Checkout(key, addr)
            state = leader_of((yield Send(slot, ("FLOCK.INFO", key), None, False)))
            if state != last:
                last = state
                yield Emit(state)
            token = 0 if state is None else state.token
            yield Send(slot, ("FLOCK.WATCH", WATCH_TIMEOUT_MS, key, token),
                       WATCH_TIMEOUT_MS / 1000.0 + 5.0, False)
            failures = 0
        except (MovedError, AskError) as e:
            addr = (e.host, int(e.port))
            slot = yield from _drop(slot)
        except REROUTE_ERRORS + NETWORK_ERRORS:
            addr = None
            slot = yield from _drop(slot)
            failures += 1
            yield Sleep(reroute_pause_s(failures))


def _drop(slot: Any) -> Plan:
    if slot is not None:
        yield Disconnect(slot)
        yield GiveBack(slot)
    return None


def campaign_args(wait_ms: Any) -> Tuple[Any, ...]:
    """campaign()'s wait: None means no limit here (a candidate waits to lead)."""
    return (float("inf") if wait_ms is None else wait_ms,)
