"""Scenarios M.2 (bound), M.3 (durable) and M.4 (rule 11) of docs/CLIENTS.md: lock_many's
options beyond M.1, sync and asyncio, against real redis-servers with the flock module (a
master with a replica for the durable grants)."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis.asyncio

from redis_flock import Flock, InvalidArgumentError, LockBusyError, LockNotDurableError
from redis_flock import aio

from conftest import SOON_S, Monitor, wait_until

KEYS = ["{t}:a", "{t}:b", "{t}:c"]


def macquire_conns(admin, name):
    return [c for c in admin.client_list()
            if c.get("name") == name and c.get("cmd") in ("flock.macquire", "flock.renew")]


def watched(server, leases):
    """Waits until the WATCH under way names every lease (rule 9) and waits on the server."""
    wait_until(lambda: all((lease._key_bytes, lease.token) in lease._lane.armed
                           for lease in leases) and server.watchers() == 1,
               "the leases watched")


def test_m2_many_bound_lost_closed_when_their_connection_is_killed(server):
    """M.2 bound: every grant BOUND to one connection of their own (not the pool's other
    connections); releasing one keeps the others; killing that connection loses the rest with
    reason closed, and the server ends their grants."""
    admin = server.client(decode_responses=True)
    flock = Flock(server.client(client_name="many-bound"))
    leases = flock.acquire_many(KEYS, 10_000, bound=True)
    assert leases is not None and all(lease.bound for lease in leases)
    assert len({id(lease._slot.conn) for lease in leases}) == 1
    [mine] = macquire_conns(admin, "many-bound")
    holders = admin.execute_command("FLOCK.HOLDERS", KEYS[0])
    assert len(holders) == 1
    assert leases[0].release() is True
    assert admin.execute_command("FLOCK.INFO", KEYS[0]) is None
    for lease in leases[1:]:  # the connection stayed theirs
        assert lease.check() > 0 and not lease.lost
    assert [c for c in admin.client_list() if c["id"] == mine["id"]], "still open"
    watched(server, leases[1:])
    t0 = time.monotonic()
    assert admin.execute_command("CLIENT", "KILL", "ID", mine["id"]) == 1
    for lease in leases[1:]:
        assert lease.wait_lost(SOON_S * 1000), "the loss was not heard"
        assert lease.lost_reason == "closed", lease.lost_reason
    assert time.monotonic() - t0 < 10 / 3  # heard (rule 9), not found at a renewal
    for key in KEYS:
        assert admin.execute_command("FLOCK.INFO", key) is None
    for lease in leases[1:]:
        assert lease.release() is False


def test_m2_many_bound_waits_on_its_own_connection_asyncio(server):
    """M.2 bound (asyncio): a bound wait granted when the holder releases; the leases share one
    connection, killed -> lost (closed) and the keys free."""
    async def main():
        admin = redis.asyncio.Redis(host="127.0.0.1", port=server.port, decode_responses=True)
        r = redis.asyncio.Redis(host="127.0.0.1", port=server.port, decode_responses=True,
                                client_name="many-bound-aio")
        flock = aio.Flock(r)
        holder = await aio.Flock(admin).acquire(KEYS[1], 10_000)
        waiting = asyncio.ensure_future(flock.acquire_many(KEYS, 10_000, bound=True,
                                                           wait_ms=SOON_S * 1000))
        end = time.monotonic() + SOON_S
        while not all([await flock.waiters(k) for k in KEYS]):
            assert time.monotonic() < end, "the wait in every queue"
            await asyncio.sleep(0.005)
        assert await holder.release()
        leases = await asyncio.wait_for(waiting, SOON_S)
        assert leases is not None and all(lease.bound for lease in leases)
        mine = [c for c in await admin.client_list() if c.get("name") == "many-bound-aio"
                and c.get("cmd") in ("flock.macquire", "flock.renew")]
        assert len(mine) == 1, mine
        await asyncio.get_running_loop().run_in_executor(None, watched, server, leases)
        assert await admin.execute_command("CLIENT", "KILL", "ID", mine[0]["id"]) == 1
        for lease in leases:
            assert await lease.wait_lost(SOON_S * 1000)
            assert lease.lost_reason == "closed", lease.lost_reason
        for key in KEYS:
            assert await admin.execute_command("FLOCK.INFO", key) is None
        await r.aclose()
        await admin.aclose()
    asyncio.run(main())


def test_m3_many_durable_one_replica(replicated):
    """M.3 durable: replicas=1 with one replica: the WAIT follows the MACQUIRE on its
    connection, and every grant is on the replica when acquire_many returns."""
    master, replica = replicated.master, replicated.replicas[0]
    r = master.client(decode_responses=True)
    mon = Monitor(master)
    try:
        leases = Flock(r).acquire_many(KEYS, 9000, replicas=1)
        assert leases is not None
        with replica.client(decode_responses=True) as rc:
            for lease in leases:
                assert lease.replicas == 1
                assert rc.execute_command("FLOCK.CHECK", lease.key, lease.token) > 0
        for lease in leases:
            assert lease.release() is True
    finally:
        mon.close()
    assert mon.commands[mon.index("FLOCK.MACQUIRE") + 1] == "WAIT 1 3000"


def test_m3_many_durable_too_few_replicas_releases_every_key(replicated):
    """M.3 durable: replicas=2 with one replica: LockNotDurableError (1 of 2), and every key
    is released (FLOCK.INFO: none on the master, then none on the replica)."""
    r = replicated.master.client(decode_responses=True)
    flock = Flock(r)
    with pytest.raises(LockNotDurableError) as ei:
        flock.acquire_many(KEYS, 6000, replicas=2, durable_timeout_ms=200)
    assert (ei.value.acknowledged, ei.value.requested) == (1, 2)
    assert "1 of 2 replicas acknowledged" in str(ei.value) and "released" in str(ei.value)
    for key in KEYS:
        assert r.execute_command("FLOCK.INFO", key) is None
    with replicated.replicas[0].client() as rc:
        wait_until(lambda: all(rc.execute_command("FLOCK.INFO", k) is None for k in KEYS),
                   "the releases on the replica")
    with pytest.raises(LockNotDurableError):
        with flock.lock_many(KEYS, 6000, replicas=2, durable_timeout_ms=200):
            pytest.fail("handed over")
    for key in KEYS:
        assert r.execute_command("FLOCK.INFO", key) is None
    # After a BLOCK wait the WAIT follows the RENEWs that confirm the grants: too few acks
    # release every key all the same.
    holder = Flock(replicated.master.client()).acquire(KEYS[2], 10_000)
    got: dict = {}

    def wait_durably():
        try:
            flock.acquire_many(KEYS, 6000, replicas=2, durable_timeout_ms=200,
                               wait_ms=SOON_S * 1000)
        except LockNotDurableError as e:
            got["error"] = e

    t = threading.Thread(target=wait_durably, daemon=True)
    t.start()
    wait_until(lambda: r.execute_command("FLOCK.WAITERS", KEYS[0]), "the wait")
    assert holder.release()
    t.join(SOON_S)
    assert (got["error"].acknowledged, got["error"].requested) == (1, 2)
    for key in KEYS:
        assert r.execute_command("FLOCK.INFO", key) is None

    async def main():
        ar = redis.asyncio.Redis(host="127.0.0.1", port=replicated.master.port)
        af = aio.Flock(ar)
        with pytest.raises(LockNotDurableError):
            await af.acquire_many(KEYS, 6000, replicas=2, durable_timeout_ms=200)
        leases = await af.acquire_many(KEYS, 6000, replicas=1)
        assert leases is not None and all(lease.replicas == 1 for lease in leases)
        for lease in leases:
            assert await lease.release()
        await ar.aclose()
    asyncio.run(main())
    for key in KEYS:
        assert r.execute_command("FLOCK.INFO", key) is None


def test_m3_m4_refused_before_anything_is_sent(server):
    """M.3 / M.4 rule 12: bound with replicas or fsync, a bad replicas, fsync or
    durable_timeout_ms, a non-bool bound, and reentrant (lock_many has none) are
    InvalidArgumentError, nothing sent."""
    r = server.client(decode_responses=True)
    flock = Flock(r)
    bad = [dict(bound=True, replicas=1), dict(bound=True, fsync=True), dict(replicas=-1),
           dict(replicas=True), dict(fsync=1), dict(replicas=1, durable_timeout_ms=5000),
           dict(bound="yes"), dict(reentrant=True)]
    mon = Monitor(server)
    try:
        for kw in bad:
            with pytest.raises(InvalidArgumentError):
                flock.acquire_many(KEYS, 5000, **kw)
            with pytest.raises(InvalidArgumentError):
                flock.lock_many(KEYS, 5000, **kw)
    finally:
        mon.close()
    assert mon.count("FLOCK.") == 0 and mon.count("WAIT") == 0


def test_m4_a_key_held_with_the_same_owner_is_busy_at_once(server):
    """M.4 rule 11: a key of the set that this Flock holds with the same owner: LockBusyError
    at once, nothing taken, the held lease intact (its token unchanged); another owner of
    the same Flock waits as anyone else would."""
    r = server.client(decode_responses=True)
    flock = Flock(r)
    held = flock.acquire(KEYS[1], 10_000, owner="me")
    t = time.monotonic()
    with pytest.raises(LockBusyError, match="already held by this Flock"):
        flock.acquire_many(KEYS, 10_000, owner="me", wait_ms=5000)
    assert time.monotonic() - t < 1.0
    with pytest.raises(LockBusyError):
        with flock.lock_many(KEYS, 10_000, owner="me"):
            pytest.fail("granted")
    for key in (KEYS[0], KEYS[2]):
        assert r.execute_command("FLOCK.INFO", key) is None
    assert r.execute_command("FLOCK.CHECK", KEYS[1], held.token) > 0 and not held.lost
    assert held.release()
    leases = flock.acquire_many(KEYS, 10_000, owner="me")
    assert leases is not None and all(lease.owner == "me" for lease in leases)
    for lease in leases:
        assert lease.release()
