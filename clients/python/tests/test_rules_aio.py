"""Rules 9, 11 and 12 and inspection (docs/CLIENTS.md, "Scenarios"), asyncio client, against a
real server. Each test names its scenario in its name and docstring."""
from __future__ import annotations

import asyncio
import gc
import time

import pytest
import redis.asyncio

from redis_flock import InvalidArgumentError, LockBusyError, LockLostError
from redis_flock.aio import Flock

from conftest import SOON_S, Monitor, free_port

HEARD_MS = 500


def run(coro):
    return asyncio.run(coro)


def aclient(server, **kw):
    kw.setdefault("socket_timeout", SOON_S)
    return redis.asyncio.Redis(host="127.0.0.1", port=server.port, **kw)


async def watched(r, n=1):
    end = time.monotonic() + SOON_S
    while int((await r.info("flock")).get("flock_watchers", 0)) != n:
        assert time.monotonic() < end, f"{n} watcher(s)"
        await asyncio.sleep(0.005)


async def heard_ms(lease, t0):
    assert await lease.wait_lost(SOON_S * 1000), "the loss was not heard"
    return (time.monotonic() - t0) * 1000


def test_aio_s9_1_revoke_heard(server):
    """9.1 (asyncio): REVOKE heard at once (revoked); callback, ensure(), leaving raises."""
    async def main():
        admin = aclient(server)
        flock = Flock(aclient(server))
        calls = []
        with pytest.raises(LockLostError) as caught:
            async with flock.lock("a9:1", 30_000) as lease:
                lease.on_lost(lambda lz: calls.append(lz.lost_reason))
                await watched(admin)
                t0 = time.monotonic()
                assert await admin.execute_command("FLOCK.REVOKE", "a9:1") == 1
                ms = await heard_ms(lease, t0)
                assert ms < HEARD_MS, ms
                assert lease.lost_reason == "revoked"
                with pytest.raises(LockLostError):
                    lease.ensure()
                await asyncio.sleep(0.01)
                assert calls == ["revoked"]
        assert caught.value.reason == "revoked"
        await admin.aclose()
    run(main())


def test_aio_s9_2_client_kill_of_a_bound_lease_heard(server):
    """9.2 (asyncio): CLIENT KILL of a BOUND lease's connection heard at once (closed)."""
    async def main():
        admin = aclient(server, decode_responses=True)
        flock = Flock(aclient(server, client_name="a9-2"))
        lease = await flock.acquire("a9:2", 30_000, bound=True)
        await watched(admin)
        mine = [c for c in await admin.client_list() if c.get("name") == "a9-2"
                and c["cmd"] in ("flock.acquire", "flock.renew")]
        assert len(mine) == 1, mine
        t0 = time.monotonic()
        assert await admin.execute_command("CLIENT", "KILL", "ID", mine[0]["id"]) == 1
        ms = await heard_ms(lease, t0)
        assert ms < HEARD_MS, ms
        assert lease.lost_reason == "closed"
        await admin.aclose()
    run(main())


def test_aio_s9_3_del_heard(server):
    """9.3 (asyncio): DEL of the key heard at once (lost)."""
    async def main():
        admin = aclient(server)
        flock = Flock(aclient(server))
        lease = await flock.acquire("a9:3", 30_000)
        await watched(admin)
        t0 = time.monotonic()
        await admin.delete("a9:3")
        assert await heard_ms(lease, t0) < HEARD_MS and lease.lost_reason == "lost"
        await admin.aclose()
    run(main())


def test_aio_s11_1_and_2_one_lease_per_grant_and_reentrant_holds(server):
    """11.1, 11.2 (asyncio): the same owner again is busy at once; reentrant=True returns the
    same lease, and only the last release ends the grant."""
    async def main():
        admin = aclient(server)
        flock = Flock(aclient(server))
        lease = await flock.acquire("a11:1", 30_000, owner="me")
        with pytest.raises(LockBusyError):
            await flock.acquire("a11:1", 30_000, owner="me", wait_ms=5000)
        assert not lease.lost and await lease.check() > 0
        assert await lease.release() is True
        async with flock.lock("a11:2", 30_000, reentrant=True) as outer:
            async with flock.lock("a11:2", 30_000, reentrant=True) as inner:
                assert inner is outer and outer.holds == 2
            assert await admin.execute_command("FLOCK.CHECK", "a11:2", outer.token) > 0
        assert await admin.exists("a11:2") == 0 and not outer.lost
        await admin.aclose()
    run(main())


def test_aio_s11_4_reentrant_owner_is_one_per_task(server):
    """11.4 (asyncio): reentrant=True without an owner: another task waits as another holder
    would; the same task re-enters."""
    async def main():
        flock = Flock(aclient(server))
        lease = await flock.acquire("a11:4", 30_000, reentrant=True)

        async def other():
            assert await flock.acquire("a11:4", 30_000, reentrant=True) is None
            return await flock.acquire("a11:4", 30_000, reentrant=True, wait_ms=SOON_S * 1000)
        task = asyncio.ensure_future(other())
        await asyncio.sleep(0.2)
        assert not task.done()
        assert await flock.acquire("a11:4", 30_000, reentrant=True) is lease
        assert await lease.release() is True and not task.done()
        assert await lease.release() is True
        got = await asyncio.wait_for(task, SOON_S)
        assert got is not lease and got.owner != lease.owner
        await got.release()
    run(main())


def test_aio_s11_5_nested_wait_on_its_own_lease_fails_at_once(server):
    """11.5 (asyncio): a nested acquire with a wait on a key the task holds fails at once."""
    async def main():
        flock = Flock(aclient(server))
        async with flock.lock("a11:5", 30_000):
            t0 = time.monotonic()
            with pytest.raises(LockBusyError):
                async with flock.lock("a11:5", 30_000, wait_ms=10_000):
                    pass
            assert time.monotonic() - t0 < 2.0
    run(main())


def test_aio_s11_6_a_dropped_lease_is_released(server):
    """11.6 (asyncio): a lease dropped without release stops renewing and is released."""
    async def main():
        admin = aclient(server)
        flock = Flock(aclient(server))
        lease = await flock.acquire("a11:6", 30_000)
        await watched(admin)
        del lease
        gc.collect()
        end = time.monotonic() + SOON_S
        while await admin.exists("a11:6"):
            assert time.monotonic() < end, "the dropped lease was not released"
            await asyncio.sleep(0.01)
        await admin.aclose()
    run(main())


def test_aio_s12_4_and_1_bad_arguments():
    """12.1, 12.2, 12.3, 12.4 (asyncio): refused before anything is sent."""
    async def main():
        flock = Flock(redis.asyncio.Redis(port=free_port(), socket_connect_timeout=0.2))
        for args, kw in [(("", 1000), {}), (("k", 0), {}), (("k", 1000), dict(owner=5)),
                         (("k", 1000), dict(wait=5))]:
            with pytest.raises(InvalidArgumentError):
                await flock.acquire(*args, **kw)
        with pytest.raises(InvalidArgumentError):
            await flock.info("")
    run(main())


def test_aio_s12_7_a_released_lease_answers_locally(server):
    """12.7 (asyncio): fenced(), ensure(), renew() after release: LockLostError (released),
    nothing sent, not lost."""
    async def main():
        flock = Flock(aclient(server))
        lease = await flock.acquire("a12:7", 30_000)
        assert await lease.release() is True
        mon = Monitor(server)
        try:
            with pytest.raises(LockLostError) as e:
                await lease.fenced("SET", "x", "1")
            assert e.value.reason == "released"
            with pytest.raises(LockLostError):
                lease.ensure()
            with pytest.raises(LockLostError):
                await lease.renew()
        finally:
            mon.close()
        assert mon.count("FLOCK.") == 0 and not lease.lost
    run(main())


def test_aio_si_inspection(server):
    """I.1-I.6 (asyncio): info, holders, waiters, locked, check, stats."""
    async def main():
        flock = Flock(aclient(server, decode_responses=True))
        other = Flock(aclient(server))
        assert await flock.info("ai:1") is None and await flock.locked("ai:1") is False
        lease = await flock.acquire("ai:1", 30_000)
        waiter = asyncio.ensure_future(other.acquire("ai:1", 1000, wait_ms=5000, owner="w"))
        end = time.monotonic() + SOON_S
        while not await flock.waiters("ai:1"):
            assert time.monotonic() < end
            await asyncio.sleep(0.005)
        info = await flock.info("ai:1")
        assert info["owner"] == lease.owner and info["waiters"] == 1
        assert [(h.owner, h.token) for h in await flock.holders("ai:1")] == \
            [(lease.owner, lease.token)]
        assert [(w.owner, w.mode) for w in await flock.waiters("ai:1")] == [("w", "exclusive")]
        assert await flock.locked("ai:1") is True
        assert 0 < await flock.check("ai:1", lease.token) <= 30_000
        await lease.release()
        got = await waiter
        assert got is not None and await flock.check("ai:1", lease.token) == 0
        await got.release()
        st = await flock.stats("ai:#")
        assert st["classes"]["ai:#"]["grants"] == 2
    run(main())
