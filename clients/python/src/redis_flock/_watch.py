"""What a ``Flock`` knows of the leases it handed out, shared by the sync and asyncio drivers:

- rule 11 of docs/CLIENTS.md: which live leases it holds per key, so that the same owner never
  gets a second lease object for one grant (``reentrant=True`` counts holds instead) and a
  wait never waits on a lease of its own thread or task;
- rule 9: the ``FLOCK.WATCH`` that hears a grant end on the server. One *lane* per server node
  (per slot in a cluster: WATCH takes keys of one slot) runs ``lane_plan`` on a connection of
  its own: one WATCH names the (key, token) of every watched lease of the lane, and its reply
  marks the lease it names lost at once. A lease is watched once it is ``WATCH_AFTER_S`` old:
  most leases live shorter than that and never cost a WATCH (a short-lived lease's loss is
  still heard: the WATCH that first names its token answers ``gone`` at once). When the set
  of watched leases grows, the driver's refresh wakes the lane (idle) or ends its WATCH with
  ``CLIENT UNBLOCK`` (the lane's connection id) so that it is sent again with the new set; a
  release needs nothing: the WATCH fires ``released`` for it and is sent again without it.

Leases are held weakly everywhere here: a forgotten lease is still garbage collected (and
released, rule 11). No I/O of its own: the lane's I/O is a plan (see ``_core``).
"""
from __future__ import annotations

import math
import os
import threading
import weakref
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from redis.crc import key_slot
from redis.exceptions import AskError, MovedError, ResponseError

from ._errors import (
    CLOSED,
    EXPIRED,
    GONE,
    LOST,
    REVOKED,
    InvalidArgumentError,
    LockBusyError,
)
from ._plans import Checkout, Disconnect, GiveBack, Plan, Send, Sleep
from ._rules import NETWORK_ERRORS, REROUTE_ERRORS, Addr, log, monotonic, reroute_pause_s

#: a lease is watched once it is this old (the loss of a younger one is heard when it is)
WATCH_AFTER_S = 0.010
#: a WATCH's own timeout: the lane sends it again after this long even when nothing changed,
#: so a connection that died without a word is found
WATCH_TIMEOUT_MS = 15_000
#: how long a lane with nothing to watch keeps its connection before it ends
LANE_IDLE_S = 5.0
#: the most pairs one WATCH takes (the server's limit); more leases in one lane are found at
#: their renewal (a known gap)
MAX_PAIRS = 64
#: after a CLIENT UNBLOCK that found the lane not blocked, the refresh looks again this soon
REFRESH_RETRY_S = 0.002

#: a WATCH event -> the loss reason of the lease it names (a ``released`` the lease did not
#: send: another process released the grant with the lease's owner)
EVENT_REASONS = {b"revoked": REVOKED, b"expired": EXPIRED, b"closed": CLOSED, b"lost": LOST,
                 b"gone": GONE, b"released": REVOKED}


def as_bytes(x: Any) -> bytes:
    return x.encode() if isinstance(x, str) else bytes(x)


class AwaitWork(NamedTuple):
    """The lane has nothing to watch: wait until the driver sets ``lane.event`` or seconds
    pass. Result: None."""
    lane: Any
    seconds: float


class Lane:
    """One watching connection: the leases of one group (None outside a cluster; a slot in
    one), what the WATCH under way names, and the connection's id for CLIENT UNBLOCK."""

    def __init__(self, group: Any, lock: Any) -> None:
        self.group = group
        self._lock = lock  # the Tracker's: one lock for both
        #: every live lease of the group, watched or not yet: id -> weakref
        self.leases: Dict[int, Any] = {}
        #: what the WATCH under way names: (key bytes, token) -> weakref of the lease
        self.armed: Dict[Tuple[bytes, int], Any] = {}
        self.running = False
        self.client_id: Optional[int] = None
        #: a key of the group, to route the lane's connection (and CLIENT UNBLOCK) by
        self.key: Any = None
        self.addr: Addr = None
        #: set by the driver when it starts the lane: what AwaitWork waits on
        self.event: Any = None
        #: the WATCH under way ends by its own timeout (False: the lane is idle or between)
        self.blocked = False

    # -- the Flock's side (the Tracker holds the lock) ------------------------------------------
    def _add_locked(self, lease: Any, ref: Any) -> bool:
        """A new lease of the group. True when the lane is not running: the driver starts it."""
        self.leases[id(lease)] = ref
        if self.key is None:
            self.key = lease.key
        if self.running:
            return False
        self.running = True
        return True

    def remove(self, lease: Any) -> None:
        with self._lock:
            self.leases.pop(id(lease), None)

    def wanted(self, now: float) -> Tuple[List[Tuple[bytes, int, Any]], Optional[float]]:
        """(the leases to watch now: live, at least WATCH_AFTER_S old, at most MAX_PAIRS, the
        oldest first; when the next younger lease becomes old enough, or None)."""
        out: List[Tuple[float, bytes, int, Any]] = []
        soonest: Optional[float] = None
        with self._lock:
            for k, ref in list(self.leases.items()):
                lease = ref()
                if lease is None or lease._lost or lease._released:
                    del self.leases[k]
                    continue
                due = lease._born + WATCH_AFTER_S
                if due <= now:
                    out.append((lease._born, lease._key_bytes, lease.token, ref))
                elif soonest is None or due < soonest:
                    soonest = due
        out.sort(key=lambda e: e[0])
        return [(k, t, r) for _, k, t, r in out[:MAX_PAIRS]], soonest

    def refresh(self, now: float) -> Tuple[str, Optional[float]]:
        """The driver's refresh: (what to do: "" nothing, "wake" the idle lane, "unblock" its
        WATCH; when to refresh again, or None)."""
        want, soonest = self.wanted(now)
        with self._lock:
            missing = any((k, t) not in self.armed for k, t, _ in want)
            if not missing:
                return "", soonest
            if self.blocked and self.client_id is not None:
                return "unblock", soonest
            return "wake", soonest

    # -- the lane's side ---------------------------------------------------------------------
    def arm(self) -> List[Any]:
        """The pairs of the next WATCH (empty: nothing to watch)."""
        want, _ = self.wanted(monotonic())
        with self._lock:
            self.armed = {(k, t): r for k, t, r in want}
            self.blocked = bool(want)
        pairs: List[Any] = []
        for k, t, _ in want:
            pairs += [k, t]
        return pairs

    def retire(self) -> bool:
        """The lane has had nothing to watch for LANE_IDLE_S: it ends unless a lease came."""
        with self._lock:
            if self.leases:
                return False
            self.running = False
            self.client_id = None
            self.addr = None
            return True

    def on_reply(self, reply: Any) -> None:
        """A WATCH's reply: nil (its timeout, or CLIENT UNBLOCK) changes nothing; an event
        marks the lease it names lost, unless that lease was released meanwhile (its own
        release's ``released``)."""
        with self._lock:
            self.blocked = False
            if not reply:
                return
            key, event, _owner, token = reply[0], reply[1], reply[2], reply[3]
            ref = self.armed.pop((as_bytes(key), int(token)), None)
        lease = ref() if ref is not None else None
        if lease is None or lease._released:
            return
        if not lease.lost:  # (marks a passed local deadline first: the truer reason)
            lease._set_lost(EVENT_REASONS.get(as_bytes(event), LOST))
        self.remove(lease)

    def on_error(self, err: Exception) -> List[Any]:
        """The WATCH was refused (WRONGTYPE: a key was written over with another type): the
        leases it named, to be checked one by one."""
        with self._lock:
            self.blocked = False
            refs, self.armed = list(self.armed.values()), {}
        return [r for r in (ref() for ref in refs) if r is not None and not r._released]


def lane_plan(lane: Lane) -> Plan:
    """The lane's loop, on a connection of its own (rule 8: nothing else queues behind a
    WATCH), until it has had nothing to watch for LANE_IDLE_S."""
    slot = None
    failures = 0
    idle_since = monotonic()
    try:
        while True:
            pairs = lane.arm()
            if not pairs:
                if monotonic() - idle_since >= LANE_IDLE_S and lane.retire():
                    return
                yield AwaitWork(lane, LANE_IDLE_S)
                continue
            idle_since = math.inf
            try:
                if slot is None:
                    slot = yield Checkout(lane.key, lane.addr)
                    lane.client_id = int((yield Send(slot, ("CLIENT", "ID"), None, False)))
                reply = yield Send(slot, ("FLOCK.WATCH", WATCH_TIMEOUT_MS, *pairs),
                                   WATCH_TIMEOUT_MS / 1000.0 + 5.0, False)
            except (MovedError, AskError) as e:
                lane.on_reply(None)
                lane.addr = (e.host, int(e.port))
                slot = yield from _drop(slot)
                continue
            except REROUTE_ERRORS:
                lane.on_reply(None)
                lane.addr = None
                slot = yield from _drop(slot)
                failures += 1
                yield Sleep(reroute_pause_s(failures))
                continue
            except NETWORK_ERRORS as e:
                # a new connection sends the same WATCH: a grant that ended meanwhile answers
                # `gone` at once, so nothing is missed
                lane.on_reply(None)
                slot = yield from _drop(slot)
                failures += 1
                log.debug("flock: watch connection failed (%s); again", e)
                yield Sleep(reroute_pause_s(failures))
                continue
            except ResponseError as e:
                if str(e).startswith("UNBLOCKED"):  # a demotion or a full sync: watch again
                    lane.on_reply(None)
                    yield Sleep(reroute_pause_s(failures))
                    continue
                for lease in lane.on_error(e):
                    yield from check_one(slot, lease)
                failures += 1
                yield Sleep(reroute_pause_s(failures))
                continue
            failures = 0
            lane.on_reply(reply)
            if not lane.leases:
                idle_since = monotonic()
    finally:
        if slot is not None:
            yield GiveBack(slot)


def _drop(slot: Any) -> Plan:
    if slot is not None:
        yield Disconnect(slot)
        yield GiveBack(slot)
    return None


def check_one(slot: Any, lease: Any) -> Plan:
    """After a refused WATCH: FLOCK.CHECK of one lease it named (0: gone; an error such as
    WRONGTYPE: the key was written over, `lost`)."""
    try:
        left = yield Send(slot, ("FLOCK.CHECK", lease.key, lease.token), None, False)
    except ResponseError:
        lease._set_lost(LOST)
        return
    if not left and not lease._released:
        lease._set_lost(GONE)


class Tracker:
    """A Flock's live leases: per key (rule 11) and per lane (rule 9)."""

    def __init__(self, cluster: bool) -> None:
        self.cluster = cluster
        self._reset()
        _trackers.add(self)

    def _reset(self) -> None:
        """Empty (also in a forked child: its parent's leases are not its own grants, and
        their lanes' threads did not come along)."""
        self._lock = threading.Lock()
        #: key -> {id(lease): weakref} of the leases handed out and not released
        self._by_key: Dict[bytes, Dict[int, Any]] = {}
        self.lanes: Dict[Any, Lane] = {}
        #: the driver's next refresh (see next_refresh), None when none is scheduled
        self.refresh_due: Optional[float] = None
        self.refresh_lock = threading.Lock()

    def held(self, key_bytes: bytes) -> List[Any]:
        """The live (neither lost nor released) leases of key this Flock handed out."""
        refs = self._by_key.get(key_bytes)
        if not refs:
            return []
        out = []
        for ref in list(refs.values()):
            lease = ref()
            if lease is not None and not lease._released and not lease.lost:
                out.append(lease)
        return out

    def reenter(self, key_bytes: bytes, owner: Optional[str], ctx: Any, reentrant: bool,
                kind: Tuple[Any, ...]) -> Tuple[Optional[Any], bool]:
        """Rule 11, before anything is sent: (the held lease re-entered (its hold counted),
        or None; whether a wait would wait on a lease of the caller's own thread or task).
        Raises LockBusyError when owner already holds the key and reentrant is False, and
        InvalidArgumentError when a reentrant acquire asks for another kind."""
        leases = self.held(key_bytes)
        if not leases:
            return None, False
        own_wait = False
        for lease in leases:
            if owner is not None and lease.owner == owner:
                if not reentrant:
                    raise LockBusyError(
                        f"{lease.key!r} is already held by this Flock with owner {owner!r}: "
                        "one grant, one lease object (reentrant=True counts holds instead)")
                if lease._kind != kind:
                    raise InvalidArgumentError(
                        f"a reentrant acquire of {lease.key!r} asks for another kind "
                        f"({kind}) than the held lease ({lease._kind})")
                if lease._hold():
                    return lease, False
            if lease._ctx == ctx:
                own_wait = True
        return None, own_wait

    def add(self, lease: Any) -> Optional[Lane]:
        """A new lease: returns its lane when the driver has to start it. (A lease that is
        garbage collected unreleased leaves a dead weakref behind until its key is used
        again: a few bytes.)"""
        kb = lease._key_bytes
        group = key_slot(kb) if self.cluster else None
        ref = weakref.ref(lease)
        with self._lock:
            refs = self._by_key.get(kb)
            if refs is None:
                self._by_key[kb] = {id(lease): ref}
            else:
                for k in [k for k, r in refs.items() if r() is None]:
                    del refs[k]
                refs[id(lease)] = ref
            lane = self.lanes.get(group)
            if lane is None:
                lane = self.lanes[group] = Lane(group, self._lock)
            lease._lane = lane
            start = lane._add_locked(lease, ref)
        return lane if start else None

    def remove(self, lease: Any) -> None:
        kb, i = lease._key_bytes, id(lease)
        with self._lock:
            refs = self._by_key.get(kb)
            if refs is not None and refs.pop(i, None) is not None and not refs:
                del self._by_key[kb]
            lane = lease._lane
            if lane is not None:
                lane.leases.pop(i, None)


def busy_on_self(key: Any) -> LockBusyError:
    """Rule 11: a wait that would wait on a lease its own thread or task holds."""
    return LockBusyError(f"lock {key!r} not granted at once, and waiting would wait on a lease "
                         "this thread (task) holds itself: not waiting")


def kind_of(command: Tuple[Any, ...]) -> Tuple[Any, ...]:
    """What a reentrant acquire must ask for again: an ACQUIRE command's SHARED / LIMIT n /
    BOUND."""
    return tuple(command[4:])


def next_refresh(lanes: List[Lane], now: float
                 ) -> Tuple[List[Tuple[Lane, str]], Optional[float]]:
    """One refresh of every lane of a Flock: (what to do for which lane, when to refresh
    again or None). After an action the refresh looks again soon: a CLIENT UNBLOCK can miss a
    WATCH that has not reached the server yet."""
    todo: List[Tuple[Lane, str]] = []
    soonest: Optional[float] = None
    for lane in lanes:
        action, due = lane.refresh(now)
        if action:
            todo.append((lane, action))
            due = now + REFRESH_RETRY_S if due is None else min(due, now + REFRESH_RETRY_S)
        if due is not None and (soonest is None or due < soonest):
            soonest = due
    return todo, soonest


#: every Tracker, to empty them in a forked child
_trackers: "weakref.WeakSet[Tracker]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for tracker in list(_trackers):
        tracker._reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
