"""Scenario M.1 of docs/CLIENTS.md (lock_many over FLOCK.MACQUIRE), sync and asyncio, against a
real redis-server with the flock module."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis.asyncio
from redis.cluster import RedisCluster
from redis.exceptions import ResponseError

from redis_flock import Flock, InvalidArgumentError, LockBusyError, LockLostError
from redis_flock import aio

from conftest import SOON_S, wait_until

KEYS = ["{t}:a", "{t}:b", "{t}:c"]


def test_m1_all_free_tokens(server):
    """M.1 all free: one ordinary lease per key, in the order given, with the server's tokens."""
    r = server.client(decode_responses=True)
    flock = Flock(r)
    with flock.lock_many(KEYS, 10_000) as leases:
        assert [lease.key for lease in leases] == KEYS
        owners = {lease.owner for lease in leases}
        assert len(owners) == 1 and len(owners.pop()) == 32
        for lease in leases:
            assert r.execute_command("FLOCK.CHECK", lease.key, lease.token) > 0
            assert 0 < lease.remaining_ms() <= 10_000
            assert lease.fenced("SET", lease.key + ":data", lease.token) == "OK"
        assert len({lease.token for lease in leases}) == 3


def test_m1_one_held_nothing_taken(server):
    """M.1 one key held by another owner: lock_many raises LockBusyError, acquire_many answers
    None, and none of the keys is taken."""
    r = server.client(decode_responses=True)
    flock = Flock(r)
    other = Flock(server.client()).acquire(KEYS[1], 10_000)
    assert other is not None
    with pytest.raises(LockBusyError):
        with flock.lock_many(KEYS, 10_000):
            pytest.fail("granted while a key is held")
    assert flock.acquire_many(KEYS, 10_000) is None
    assert flock.acquire_many(KEYS, 10_000, wait_ms=100) is None
    # rule 11: a wait on a key this thread holds through this Flock is one try, then busy
    mine = flock.acquire(KEYS[0], 10_000)
    with pytest.raises(LockBusyError, match="this thread"):
        flock.acquire_many(KEYS, 10_000, wait_ms=SOON_S * 1000)
    assert mine.release()
    for key in (KEYS[0], KEYS[2]):
        assert r.execute_command("FLOCK.INFO", key) is None
    assert [h.owner for h in flock.holders(KEYS[1])] == [other.owner]
    assert other.release()


def test_m1_waits_for_all_at_once(server):
    """M.1 waiting: the keys are granted together once another holder releases one, while the
    call waits in every key's queue at once."""
    r = server.client(decode_responses=True)
    flock = Flock(r)
    holder = Flock(server.client()).acquire(KEYS[2], 10_000)
    assert holder is not None
    result = {}

    def waiter():
        result["leases"] = flock.acquire_many(KEYS, 10_000, wait_ms=SOON_S * 1000)

    t = threading.Thread(target=waiter)
    t.start()
    for key in KEYS:
        wait_until(lambda key=key: flock.waiters(key), f"the wait in the queue of {key}")
    assert "leases" not in result
    assert holder.release()
    t.join(SOON_S)
    leases = result["leases"]
    assert leases is not None and [lease.key for lease in leases] == KEYS
    for lease in leases:
        assert lease.token > holder.token or lease.key != KEYS[2]
        assert r.execute_command("FLOCK.CHECK", lease.key, lease.token) > 0
        assert lease.release()


def test_m1_scope_exit_releases_all(server):
    """M.1 leaving the scope releases every lease; a loss during it raises LockLostError on
    leaving, after all were released; a block's own error goes on unchanged."""
    r = server.client(decode_responses=True)
    flock = Flock(r)
    with flock.lock_many(KEYS, 10_000) as leases:
        pass
    for lease in leases:
        assert not lease.lost
        assert r.execute_command("FLOCK.INFO", lease.key) is None
    with pytest.raises(LockLostError) as e:
        with flock.lock_many(KEYS, 10_000) as leases:
            # rule 9: each lease is watched (one WATCH for the three) once it is 10 ms old
            wait_until(lambda: int(server.info("flock").get("flock_watchers", 0)) == 1,
                       "the watch")
            time.sleep(0.1)
            assert flock.revoke(KEYS[1]) == 1
            wait_until(lambda: leases[1].lost, "the revoke heard")
    assert e.value.reason == "revoked"
    for key in KEYS:
        assert r.execute_command("FLOCK.INFO", key) is None
    with pytest.raises(KeyError):
        with flock.lock_many(KEYS, 10_000):
            raise KeyError("the block's own")
    for key in KEYS:
        assert r.execute_command("FLOCK.INFO", key) is None


def test_m1_watchdog_renews_each(server):
    """M.1 each lease is an ordinary one: the watchdog renews all of them past their ttl."""
    r = server.client(decode_responses=True)
    flock = Flock(r)
    with flock.lock_many(KEYS[:2], 300) as leases:
        time.sleep(1.0)
        for lease in leases:
            assert not lease.lost
            assert r.execute_command("FLOCK.CHECK", lease.key, lease.token) > 0


def test_m1_argument_errors(server):
    """M.1 rule 12: an empty list, a key twice, more than 64 keys, a bad key, ttl or option are
    InvalidArgumentError before anything is sent."""
    r = server.client(decode_responses=True)
    flock = Flock(r)
    before = int(r.info("commandstats").get("cmdstat_flock.macquire", {}).get("calls", 0))
    bad = [([], 1000), (["{t}:a", "{t}:a"], 1000), (["{t}:a", b"{t}:a"], 1000),
           ([f"{{t}}:{i}" for i in range(65)], 1000), ("{t}:a", 1000), (["{t}:a", ""], 1000),
           (["{t}:a"], 0)]
    for keys, ttl in bad:
        with pytest.raises(InvalidArgumentError):
            flock.acquire_many(keys, ttl)
        with pytest.raises(InvalidArgumentError):
            flock.lock_many(keys, ttl)
    with pytest.raises(InvalidArgumentError):
        flock.acquire_many(["{t}:a"], 1000, wait=5)
    with pytest.raises(InvalidArgumentError):
        flock.acquire_many(["{t}:a"], 1000, wait_ms=-1)
    after = int(r.info("commandstats").get("cmdstat_flock.macquire", {}).get("calls", 0))
    assert after == before
    leases = flock.acquire_many([f"{{t}}:{i}" for i in range(64)], 1000)
    assert leases is not None and len(leases) == 64
    calls = int(r.info("commandstats")["cmdstat_flock.macquire"]["calls"])
    assert calls == before + 1  # (the count above is this command's, and none was sent)
    for lease in leases:
        assert lease.release()


def test_m1_asyncio(server):
    """M.1 asyncio: all free -> leases; one held -> LockBusyError / None, nothing taken; a wait
    granted when the holder releases; leaving the scope releases all; argument errors."""
    async def main():
        r = redis.asyncio.Redis(host="127.0.0.1", port=server.port, decode_responses=True,
                                socket_timeout=SOON_S)
        flock = aio.Flock(r)
        async with flock.lock_many(KEYS, 10_000) as leases:
            assert [lease.key for lease in leases] == KEYS
            for lease in leases:
                assert await lease.check() > 0
        for key in KEYS:
            assert await r.execute_command("FLOCK.INFO", key) is None
        holder = await aio.Flock(r).acquire(KEYS[0], 10_000)
        with pytest.raises(LockBusyError):
            async with flock.lock_many(KEYS, 10_000):
                pytest.fail("granted while a key is held")
        assert await flock.acquire_many(KEYS, 10_000) is None
        for key in KEYS[1:]:
            assert await r.execute_command("FLOCK.INFO", key) is None
        waiting = asyncio.ensure_future(flock.acquire_many(KEYS, 10_000, wait_ms=SOON_S * 1000))
        end = time.monotonic() + SOON_S
        while not all([await flock.waiters(k) for k in KEYS]):
            assert time.monotonic() < end, "the wait in every queue"
            await asyncio.sleep(0.005)
        assert not waiting.done()
        assert await holder.release()
        leases = await asyncio.wait_for(waiting, SOON_S)
        assert leases is not None and [lease.key for lease in leases] == KEYS
        for lease in leases:
            assert await lease.release()
        with pytest.raises(InvalidArgumentError):
            await flock.acquire_many([], 1000)
        with pytest.raises(InvalidArgumentError):
            flock.lock_many(["{t}:a", "{t}:a"], 1000)
        with pytest.raises(InvalidArgumentError):
            await flock.acquire_many([f"{{t}}:{i}" for i in range(65)], 1000)
        await r.aclose()
    asyncio.run(main())


def test_m1_cluster_one_slot(cluster):
    """M.1 in a 3-master cluster: keys of one slot (a hash tag) are granted on the slot's node,
    whichever master serves it; keys of several slots are the server's CROSSSLOT, nothing
    taken."""
    rc = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port, decode_responses=True,
                      socket_timeout=SOON_S)
    flock = Flock(rc)
    for i in range(6):  # tags on every master
        keys = [f"{{m{i}}}:a", f"{{m{i}}}:b"]
        with flock.lock_many(keys, 10_000) as leases:
            for lease in leases:
                assert lease.check() > 0
                assert lease.fenced("SET", lease.key + ":data", "v") == "OK"
        assert rc.exists(*keys) == 0
    with pytest.raises(ResponseError, match="same slot"):  # CROSSSLOT
        flock.acquire_many(["{m0}:a", "{m1}:a"], 10_000)
    assert rc.exists("{m0}:a") == 0 and rc.exists("{m1}:a") == 0
    rc.close()
