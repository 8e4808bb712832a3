"""Shared, counted and bound leases with the asyncio client (redis_flock.aio)."""
from __future__ import annotations

import asyncio
import time

import pytest
import redis

from redis_flock import FlockError, LockBusyError, LockLostError
from redis_flock.aio import Flock

from conftest import SOON_S
from test_aio import aclient, blocked, renewals, run, until


async def holders(r, key):
    return [h[:2] for h in await r.execute_command("FLOCK.HOLDERS", key)]


async def info(r, key):
    reply = await r.execute_command("FLOCK.INFO", key)
    return dict(zip(reply[::2], reply[1::2])) if isinstance(reply, list) else reply


async def flock_info(r, field):
    return int((await r.info("flock"))[field])


def timed_wait(flock, key, ttl, **kw):
    """A task waiting for key with BLOCK; resolves to (lease, monotonic time it came)."""
    async def go():
        lease = await flock.acquire(key, ttl, wait_ms=SOON_S * 1000, **kw)
        return lease, time.monotonic()
    return asyncio.ensure_future(go())




def test_aio_shared_leases_and_a_waiting_writer(server):
    """Scenario 8.2 of docs/CLIENTS.md."""
    async def main():
        r = aclient(server, decode_responses=True)
        flock = Flock(aclient(server))
        # 900 ms (renewed every 300 ms): 450 ms left 300 ms for a late renewal
        readers = [await flock.acquire("a:rw", 900, shared=True) for _ in range(3)]
        assert all(lease is not None for lease in readers)
        tokens = [lease.token for lease in readers]
        assert tokens == sorted(tokens) and len(set(tokens)) == 3
        assert await holders(r, "a:rw") == [[lease.owner, lease.token] for lease in readers]
        assert (await info(r, "a:rw"))["mode"] == "shared"
        assert await flock.acquire("a:rw", 5000) is None
        with pytest.raises(LockBusyError):
            async with flock.lock("a:rw", 5000):
                pass
        with pytest.raises(redis.ResponseError, match="read-only commands only"):
            await readers[1].fenced("SET", "a:rw:data", "x")
        assert not readers[1].lost and await readers[1].fenced("GET", "a:rw:data") is None
        writer = timed_wait(flock, "a:rw", 5000)
        await until(lambda: _eq(blocked(r), 1), "the writer waits on the server")
        assert await flock.acquire("a:rw", 5000, shared=True) is None  # no queue jumping
        base = await renewals(r)
        await until(lambda: _ge(renewals(r), base + 6), "two renewals per reader")
        assert not any(lease.lost for lease in readers)
        for lease in readers[:2]:
            assert await lease.release() is True
        assert not writer.done() and await blocked(r) == 1
        assert await readers[2].release() is True
        w, _ = await asyncio.wait_for(writer, SOON_S)
        assert w is not None and w.token > max(tokens)
        assert (await info(r, "a:rw"))["mode"] == "exclusive"
        assert await w.fenced("SET", "a:rw:data", "w") == b"OK"
        assert await w.release() is True
        await r.aclose()
    run(main())


async def _eq(coro, v):
    return (await coro) == v


async def _ge(coro, v):
    return (await coro) >= v


def test_aio_counted_leases(server):
    """Scenario 8.2 of docs/CLIENTS.md."""
    async def main():
        r = aclient(server, decode_responses=True)
        flock = Flock(aclient(server))
        async with flock.lock("a:sem", 5000, limit=2) as first:
            second = await flock.acquire("a:sem", 5000, limit=2)
            assert second is not None and second.token > first.token
            i = await info(r, "a:sem")
            assert (i["mode"], i["holders"], i["limit"]) == ("permits", 2, 2)
            assert await flock.acquire("a:sem", 5000, limit=2) is None
            third = timed_wait(flock, "a:sem", 5000, limit=2)
            await until(lambda: _eq(blocked(r), 1), "the third waits")
            assert not third.done()
            assert await second.release() is True
            t, _ = await asyncio.wait_for(third, SOON_S)
            assert t is not None and t.token > second.token
            assert await holders(r, "a:sem") == [[first.owner, first.token], [t.owner, t.token]]
            assert await t.fenced("SET", "a:sem:data", "3") == b"OK"
            assert await t.release() is True
        assert not first.lost and await r.exists("a:sem") == 0
        await r.aclose()
    run(main())


def test_aio_limit_mismatch_and_mode_conflicts(server):
    """Scenario 8.2, 11.1 of docs/CLIENTS.md."""
    async def main():
        r = aclient(server, decode_responses=True)
        flock = Flock(aclient(server))
        a = await flock.acquire("a:lim", 5000, limit=1, owner="a")
        assert a is not None
        for kw in (dict(limit=2), dict(shared=True), dict(limit=2, bound=True)):
            with pytest.raises(redis.ResponseError,
                               match="limit mismatch: a:lim admits 1 shared holders") as caught:
                await flock.acquire("a:lim", 5000, **kw)
            assert not isinstance(caught.value, FlockError)
            t0 = time.monotonic()
            with pytest.raises(redis.ResponseError, match="limit mismatch"):
                async with flock.lock("a:lim", 5000, wait_ms=SOON_S * 1000, **kw):
                    pass
            assert time.monotonic() - t0 < SOON_S / 2
        # (from another Flock: this one refuses a second lease of owner "a" itself, rule 11)
        other = Flock(aclient(server))
        with pytest.raises(redis.ResponseError, match="owner already holds a permit grant"):
            await other.acquire("a:lim", 5000, owner="a", wait_ms=1000)
        assert await holders(r, "a:lim") == [["a", a.token]]
        assert not a.lost and await a.check() > 0
        assert (await info(r, "a:lim"))["waiters"] == 0
        assert await a.release() is True
        await r.aclose()
    run(main())


def test_aio_a_bound_lease_whose_connection_is_killed_is_lost_and_frees_the_lock(server):
    """Scenario 8.1, 9.2 of docs/CLIENTS.md."""
    async def main():
        admin = aclient(server, decode_responses=True)
        flock = Flock(aclient(server, client_name="aio-bound"))
        # 3 s: the next renewal (a third) plus 1 s of slack, well before an expiry
        ttl = 3000
        closed = await flock_info(admin, "flock_bound_closed")
        with pytest.raises(LockLostError):
            async with flock.lock("a:bd", ttl, bound=True) as lease:
                assert lease.bound
                # its own connection (the pool may also have lent one to rule 9's watch)
                mine = [c for c in await admin.client_list() if c.get("name") == "aio-bound"
                        and c.get("cmd") in ("flock.acquire", "flock.renew")]
                assert len(mine) == 1, mine
                conn_id = mine[0]["id"]

                async def renewed_on_it():
                    return [c for c in await admin.client_list()
                            if c["id"] == conn_id and c["cmd"] == "flock.renew"]
                await until(renewed_on_it, "a renewal on the bound connection")
                waiter = timed_wait(Flock(aclient(server)), "a:bd", 10_000)
                await until(lambda: _eq(blocked(admin), 1), "a waiter")
                t0 = time.monotonic()
                assert await admin.execute_command("CLIENT", "KILL", "ID", conn_id) == 1
                assert await lease.wait_lost(ttl / 3 + 1000), "the loss was not noticed in time"
                noticed_ms = (time.monotonic() - t0) * 1000
                assert lease.lost_reason in ("closed", "gone"), lease.lost_reason
                w, at = await asyncio.wait_for(waiter, SOON_S)
                assert w is not None and (at - t0) * 1000 < ttl / 2
        assert noticed_ms <= ttl / 3 + 1000
        assert w.token > lease.token
        assert await admin.execute_command("FLOCK.CHECK", "a:bd", lease.token) == 0
        assert await flock_info(admin, "flock_bound_closed") == closed + 1
        assert await w.release() is True
        again = await flock.acquire("a:bd", 1000, bound=True)
        assert again is not None and await again.release() is True
        await admin.aclose()
    run(main())


def test_aio_a_bound_wait_survives_a_killed_connection_and_its_grant_is_bound_to_the_new_one(
        server):
    """Scenario 8.1 of docs/CLIENTS.md."""
    async def main():
        admin = aclient(server, decode_responses=True)

        async def waits():
            return [c for c in await admin.client_list() if c.get("name") == "aio-bw"
                    and c.get("cmd") == "flock.acquire" and "b" in c.get("flags", "")]
        holder = await Flock(aclient(server)).acquire("a:bwk", 20_000)
        waiter = timed_wait(Flock(aclient(server, client_name="aio-bw")), "a:bwk", 3000,
                            bound=True)
        first = await until(waits, "the bound wait")
        assert await admin.execute_command("CLIENT", "KILL", "ID", first[0]["id"]) == 1

        async def rewaited():
            return [c for c in await waits() if c["id"] != first[0]["id"]]
        second = await until(rewaited, "the wait on a new connection")
        assert not waiter.done()
        assert await holder.release() is True
        lease, _ = await asyncio.wait_for(waiter, SOON_S)
        assert lease is not None and lease.bound and not lease.lost
        assert await flock_info(admin, "flock_bound_grants") == 1
        assert await admin.execute_command("CLIENT", "KILL", "ID", second[0]["id"]) == 1

        async def ended():
            return await admin.execute_command("FLOCK.CHECK", "a:bwk", lease.token) == 0
        await until(ended, "the bound grant ends with its connection")
        assert await lease.wait_lost(3000 / 3 + 1000)
        assert lease.lost_reason in ("closed", "gone"), lease.lost_reason
        assert await lease.release() is False
        await admin.aclose()
    run(main())


def test_aio_a_bound_lease_whose_connection_dies_during_its_release_is_lost_at_once(server):
    """Scenario 8.1 of docs/CLIENTS.md."""
    admin = server.client(decode_responses=True)

    async def main():
        ttl = 6000
        lease = await Flock(aclient(server, client_name="aio-brl")).acquire(
            "a:brl", ttl, bound=True, renew=False)
        # its own connection, not the one the pool may have lent to rule 9's watch
        [mine] = [c for c in admin.client_list() if c.get("name") == "aio-brl"
                  and c.get("cmd") == "flock.acquire"]
        admin.execute_command("CLIENT", "PAUSE", 5000, "WRITE")  # the RELEASE waits there
        try:
            releasing = asyncio.ensure_future(lease.release())

            async def held():
                return [c for c in admin.client_list() if c["id"] == mine["id"]
                        and c["cmd"] == "flock.release" and "b" in c["flags"]]
            await until(held, "the RELEASE held by the pause")
            t0 = time.monotonic()
            assert admin.execute_command("CLIENT", "KILL", "ID", mine["id"]) == 1
        finally:
            admin.execute_command("CLIENT", "UNPAUSE")
        assert await asyncio.wait_for(releasing, SOON_S) is False
        assert time.monotonic() - t0 < ttl / 3000
        assert lease.lost and lease.lost_reason == "closed"

        async def ended():
            return admin.execute_command("FLOCK.CHECK", "a:brl", lease.token) == 0
        await until(ended, "the bound grant ends with its connection")
    run(main())
