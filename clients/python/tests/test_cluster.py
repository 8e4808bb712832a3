"""The sync and asyncio clients on a 3-master Redis Cluster: routing, and a slot moved while a
client waits (TRYAGAIN, then the wait goes on at the slot's new owner)."""
from __future__ import annotations

import asyncio
import threading

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

import redis_flock.aio as aio
from redis_flock import Flock, LockNotDurableError

from conftest import SOON_S, Monitor, wait_until


def lock_info(node, key):
    with node.client(decode_responses=True) as c:
        info = c.execute_command("FLOCK.INFO", key)
    if isinstance(info, list):
        info = dict(zip(info[::2], info[1::2]))
    return info


def other_master(cluster, node):
    return next(n for n in cluster.nodes if n is not node)


def test_cluster_scoped_lock_watchdog_and_fenced_write(cluster):
    """Scenario 2.1, 6.1 of docs/CLIENTS.md."""
    rc = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port, decode_responses=True,
                      socket_timeout=SOON_S)
    flock = Flock(rc)
    for i in range(6):  # keys on every master
        key, data = f"{{c{i}}}:lock", f"{{c{i}}}:data"
        with flock.lock(key, 600 if i == 0 else 10_000) as lease:
            assert lease.fenced("SET", data, f"v{i}") == "OK"
            if i == 0:
                assert not lease.wait_lost(2400)  # four ttls, renewed on the key's node
            assert lease.check() > 0
        assert rc.get(data) == f"v{i}"
        assert rc.exists(key) == 0
    rc.close()


def test_cluster_wait_survives_a_slot_move(cluster):
    """Scenario 5.3 of docs/CLIENTS.md."""
    rc = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port, socket_timeout=SOON_S)
    flock = Flock(rc)
    key = "{mig}:lock"
    slot = rc.keyslot(key)
    src = cluster.node_of_slot(slot)
    dst = other_master(cluster, src)
    holder = flock.acquire(key, 30_000)
    got = {}

    def waiter():
        try:
            got["lease"] = flock.acquire(key, 10_000, wait_ms=60_000)
        except BaseException as e:  # reported below
            got["error"] = e

    t = threading.Thread(target=waiter)
    t.start()
    wait_until(lambda: src.blocked_clients() == 1, "the waiter blocks at the slot's master")
    cluster.migrate_slot(slot, src, dst)
    # TRYAGAIN at the source; the client follows the slot and waits again at its new master
    wait_until(lambda: dst.blocked_clients() == 1 or not t.is_alive(),
               "the waiter waits at the new master")
    assert t.is_alive(), got
    assert lock_info(dst, key)["waiters"] == 1
    assert src.blocked_clients() == 0
    assert holder.release() is True  # routed to the new master too
    t.join(SOON_S)
    assert "error" not in got, got
    lease = got["lease"]
    assert lease is not None and lease.token > holder.token
    info = lock_info(dst, key)
    assert info["owner"] == lease.owner and info["token"] == lease.token
    assert lease.fenced("SET", "{mig}:data", "after the move") in (b"OK", "OK")
    assert lease.release() is True
    rc.close()


def test_cluster_async_wait_survives_a_slot_move(cluster):
    """Scenario 5.3 of docs/CLIENTS.md."""
    async def main():
        rc = AsyncRedisCluster(host="127.0.0.1", port=cluster.nodes[0].port,
                               socket_timeout=SOON_S)
        flock = aio.Flock(rc)
        key = "{amig}:lock"
        slot = rc.keyslot(key)
        src = cluster.node_of_slot(slot)
        dst = other_master(cluster, src)
        holder = await flock.acquire(key, 30_000)
        wait = asyncio.ensure_future(flock.acquire(key, 10_000, wait_ms=60_000))
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, lambda: wait_until(
            lambda: src.blocked_clients() == 1, "the waiter blocks at the slot's master"))
        await loop.run_in_executor(None, cluster.migrate_slot, slot, src, dst)
        await loop.run_in_executor(None, lambda: wait_until(
            lambda: dst.blocked_clients() == 1 or wait.done(), "the waiter waits at the new master"))
        assert not wait.done(), wait
        assert await holder.release() is True
        lease = await asyncio.wait_for(wait, SOON_S)
        assert lease is not None and lease.token > holder.token
        info = lock_info(dst, key)
        assert info["owner"] == lease.owner and info["token"] == lease.token
        assert await lease.release() is True
        await rc.aclose()

    asyncio.run(main())


def test_cluster_durable_grant_waits_on_the_keys_node(cluster):
    """10.1: replicas=1 on masters without replicas: the WAIT follows the ACQUIRE on the key's own
    node (a WAIT anywhere else would count another node's replicas), the grant is released."""
    rc = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port, socket_timeout=SOON_S)
    flock = Flock(rc)
    seen = set()

    def check(key, acquire):
        node = cluster.node_of_slot(rc.keyslot(key))
        seen.add(node.port)
        mon = Monitor(node)
        try:
            with pytest.raises(LockNotDurableError) as ei:
                acquire()
        finally:
            mon.close()
        assert (ei.value.acknowledged, ei.value.requested) == (0, 1)
        assert mon.commands[mon.index(f"FLOCK.ACQUIRE {key}") + 1] == "WAIT 1 50"
        assert mon.count(f"FLOCK.RELEASE {key}") == 1
        with node.client() as c:
            assert c.exists(key) == 0

    try:
        for i in range(4):
            key = f"{{d{i}}}:lock"
            check(key, lambda: flock.acquire(key, 3000, replicas=1, durable_timeout_ms=50))
    finally:
        rc.close()

    async def main():
        arc = AsyncRedisCluster(host="127.0.0.1", port=cluster.nodes[0].port,
                                socket_timeout=SOON_S)
        aflock = aio.Flock(arc)
        loop = asyncio.get_running_loop()
        try:
            for i in range(4):
                key = f"{{ad{i}}}:lock"

                def acquire():
                    fut = asyncio.run_coroutine_threadsafe(
                        aflock.acquire(key, 3000, replicas=1, durable_timeout_ms=50), loop)
                    return fut.result(SOON_S)

                # the observer's checks block: they run in a thread, the client on the loop
                await loop.run_in_executor(None, check, key, acquire)
        finally:
            await arc.aclose()

    asyncio.run(main())
    assert len(seen) > 1


def test_cluster_loss_heard_per_slot(cluster):
    """9.1, 9.4 in a cluster: one WATCH connection per slot with leases, at the slot's master;
    a REVOKE of a lease on any master is heard at once, sync and asyncio."""
    import time
    from redis.crc import key_slot
    rc = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port, socket_timeout=SOON_S)
    flock = Flock(rc)
    keys = [f"{{w{i}}}:lock" for i in range(6)]
    leases = [flock.acquire(k, 30_000) for k in keys]
    slots = {key_slot(k.encode()) for k in keys}
    wait_until(lambda: sum(int(n.info("flock").get("flock_watchers", 0)) for n in cluster.nodes)
               == len(slots), "one watcher per slot")
    for k, lease in zip(keys, leases):
        node = cluster.node_of_slot(key_slot(k.encode()))
        t0 = time.monotonic()
        with node.client() as c:
            assert c.execute_command("FLOCK.REVOKE", k) == 1
        assert lease.wait_lost(SOON_S * 1000)
        assert (time.monotonic() - t0) * 1000 < 500 and lease.lost_reason == "revoked"
    rc.close()

    async def main():
        arc = AsyncRedisCluster(host="127.0.0.1", port=cluster.nodes[0].port,
                                socket_timeout=SOON_S)
        af = aio.Flock(arc)
        lease = await af.acquire("{aw}:lock", 30_000)
        node = cluster.node_of_slot(key_slot(b"{aw}:lock"))
        while int(node.info("flock").get("flock_watchers", 0)) < 1:
            await asyncio.sleep(0.005)
        t0 = time.monotonic()
        with node.client() as c:
            c.execute_command("FLOCK.REVOKE", "{aw}:lock")
        assert await lease.wait_lost(SOON_S * 1000)
        assert (time.monotonic() - t0) * 1000 < 500 and lease.lost_reason == "revoked"
        await arc.aclose()
    asyncio.run(main())
