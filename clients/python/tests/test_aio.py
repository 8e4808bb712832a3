"""The asyncio client (redis_flock.aio) against a real redis-server with the flock module."""
from __future__ import annotations

import asyncio
import gc
import time

import pytest
import redis.asyncio

from redis_flock import FencedError, LeaseTooShortError, LockBusyError, LockLostError
from redis_flock.aio import Flock

from conftest import SOON_S, Monitor, wait_until


def run(coro):
    return asyncio.run(coro)


def aclient(server, **kw):
    kw.setdefault("socket_timeout", SOON_S)
    return redis.asyncio.Redis(host="127.0.0.1", port=server.port, **kw)


async def until(cond, what, timeout=SOON_S):
    """An observer's poll (never the client under test)."""
    end = time.monotonic() + timeout
    while True:
        v = await cond()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def blocked(r):
    """Blocked clients other than the clients' own FLOCK.WATCH (rule 9)."""
    info = await r.execute_command("INFO", "clients", "flock")  # one moment for both
    return int(info["blocked_clients"]) - int(info.get("flock_watchers", 0))


async def renewals(r):
    return int((await r.info("flock"))["flock_renewals"])


def test_aio_scoped_lock_and_release(server):
    """Scenario 3.1, 6.1 of docs/CLIENTS.md."""
    async def main():
        r = aclient(server, decode_responses=True)
        flock = Flock(r)
        async with flock.lock("a:lock", 10_000) as lease:
            assert lease.token > 0 and len(lease.owner) == 32
            assert await lease.fenced("SET", "a:data", "v") == "OK"
            server_left = await lease.check()
            assert 0 < lease.remaining_ms() <= server_left  # local measured after the server
            lease.ensure(1000)
            with pytest.raises(LeaseTooShortError):
                lease.ensure(60_000)
            assert await flock.acquire("a:lock", 1000) is None
            with pytest.raises(LockBusyError):
                async with flock.lock("a:lock", 1000, wait_ms=100):
                    pass
        assert await r.exists("a:lock") == 0
        assert not lease.lost and lease.remaining_ms() == 0
        assert await r.get("a:data") == "v"
        await r.aclose()
    run(main())


def test_aio_watchdog_keeps_a_600ms_lease_alive_for_3s(server):
    """Scenario 2.1 of docs/CLIENTS.md."""
    async def main():
        r = aclient(server)
        flock = Flock(r)
        # 600 ms (renewed every 200 ms): a renewal may come 400 ms late on a loaded machine
        # before the lease runs out; 3 s are still five ttls.
        async with flock.lock("a:wd", 600) as lease:
            end = time.monotonic() + 3.0
            while time.monotonic() < end:
                assert await r.execute_command("FLOCK.CHECK", "a:wd", lease.token) > 0
                assert not lease.lost, lease.lost_reason
                await asyncio.sleep(0.05)
        assert await renewals(r) >= 5
        await r.aclose()
    run(main())


def test_aio_watchdog_stops_on_release(server):
    """Scenario 2.1, 4.1 of docs/CLIENTS.md."""
    async def main():
        r = aclient(server)
        flock = Flock(r)
        # 600 ms, not 150: lost on a loaded machine before its release (or the marker's
        # before its five renewals)
        lease = await flock.acquire("a:wd-stop", 600)
        await until(lambda: _now(mon.count("FLOCK.RENEW a:wd-stop") >= 2), "two renewals")
        assert await lease.release() is True
        await until(lambda: _now(mon.count("FLOCK.RELEASE a:wd-stop") == 1), "the release")
        marker = await flock.acquire("a:marker", 600)
        await until(lambda: _now(mon.count("FLOCK.RENEW a:marker") >= 5),
                    "five renewals of another lease")
        await marker.release()
        await r.aclose()
        return lease

    mon = Monitor(server)
    try:
        lease = run(main())
    finally:
        mon.close()
    after = mon.commands[mon.index("FLOCK.RELEASE a:wd-stop"):]
    assert not [c for c in after if c.startswith("FLOCK.RENEW a:wd-stop")], after
    assert not lease.lost


def test_aio_release_waits_for_a_renewal_under_way(server):
    """Scenario 4.1 of docs/CLIENTS.md."""
    # As the sync test: CLIENT PAUSE WRITE holds the watchdog's RENEW; release() does not send
    # its RELEASE before the RENEW is answered, and the raced renewal reports no loss.
    admin = server.client(decode_responses=True)

    def running(cmd, held=False):
        return [c for c in admin.client_list() if c.get("name") == "aio-rw"
                and c.get("cmd") == cmd and (not held or "b" in c.get("flags", ""))]

    async def main():
        r = aclient(server, client_name="aio-rw")
        flock = Flock(r)
        loop = asyncio.get_running_loop()
        # 6 s: renewed at 2 s, the held RENEW may wait 4 s (the local deadline)
        lease = await flock.acquire("a:rw", 6000)
        admin.execute_command("CLIENT", "PAUSE", 10_000, "WRITE")
        try:
            await loop.run_in_executor(None, lambda: wait_until(
                lambda: running("flock.renew", held=True), "a renewal held by the pause"))
            task = asyncio.ensure_future(lease.release())
            end = time.monotonic() + 0.5
            while time.monotonic() < end:
                await asyncio.sleep(0.01)
                assert not running("flock.release"), \
                    "RELEASE sent while a RENEW of the lease was still unanswered"
                assert not task.done()
        finally:
            admin.execute_command("CLIENT", "UNPAUSE")
        assert await asyncio.wait_for(task, SOON_S) is True
        await until(lambda: _now(mon.count("FLOCK.RELEASE a:rw") == 1), "the release")
        assert not lease.lost, lease.lost_reason
        assert await lease.wait_lost(0) is False
        await r.aclose()
        return lease

    mon = Monitor(server)
    try:
        lease = run(main())
    finally:
        mon.close()
    after = mon.commands[mon.index("FLOCK.RELEASE a:rw"):]
    assert not [c for c in after if c.startswith("FLOCK.RENEW a:rw")], after
    assert mon.count("FLOCK.RENEW a:rw") >= 1
    assert admin.exists("a:rw") == 0
    assert not lease.lost


def test_aio_release_waits_no_longer_than_the_socket_timeout_for_a_stuck_renewal(server):
    """Scenario 4.1 of docs/CLIENTS.md."""
    # As the sync test: a hook holds the watchdog's renewal before its RENEW is sent; release()
    # waits at most the client's socket_timeout (0.5 s), then releases; the late RENEW is
    # answered nil and reports no loss.
    async def main():
        r = aclient(server, socket_timeout=0.5)
        flock = Flock(r)
        lease = await flock.acquire("a:rs", 6000)  # renewed at 2 s
        inside, gate, replies = asyncio.Event(), asyncio.Event(), []
        real = lease._io_call

        async def held(*args, **kw):
            if args[0] == "FLOCK.RENEW" and not inside.is_set():
                inside.set()
                await gate.wait()
                replies.append(await real(*args, **kw))
                return replies[-1]
            return await real(*args, **kw)

        lease._io_call = held
        await asyncio.wait_for(inside.wait(), SOON_S)
        start = time.monotonic()
        try:
            assert await lease.release() is True
            took = time.monotonic() - start
        finally:
            gate.set()
        assert 0.45 <= took < 3.0, took
        await until(lambda: _now(bool(replies)), "the late RENEW's reply")
        await until(lambda: _now(not lease._io.locked()), "the renewal's end")
        assert replies == [None]
        assert not lease.lost, lease.lost_reason
        assert await lease.wait_lost(0) is False
        await r.aclose()

    mon = Monitor(server)
    try:
        run(main())
    finally:
        mon.close()
    assert mon.count("FLOCK.RENEW a:rs") == 1
    assert mon.index("FLOCK.RELEASE a:rs") < mon.index("FLOCK.RENEW a:rs")


async def _now(value):
    return value


def test_aio_revoke_is_noticed_and_raised_on_leaving(server):
    """Scenario 3.1, 9.1 of docs/CLIENTS.md."""
    async def main():
        # 3 s: a third of it plus 1 s of slack for a late renewal on a loaded machine is still
        # well before the local deadline (and the reason shows the RENEW's nil noticed it)
        ttl = 3000
        r = aclient(server)
        flock = Flock(r)
        with pytest.raises(LockLostError):
            async with flock.lock("a:rv", ttl) as lease:
                assert await r.execute_command("FLOCK.REVOKE", "a:rv") == 1
                t0 = time.monotonic()
                assert await lease.wait_lost(ttl / 3 + 1000)
                assert (time.monotonic() - t0) * 1000 <= ttl / 3 + 1000
                assert (time.monotonic() - t0) * 1000 < 500  # heard: rule 9
                assert lease.lost_reason in ("revoked", "gone"), lease.lost_reason
                assert lease.lost and lease.remaining_ms() == 0
                with pytest.raises(LockLostError):
                    lease.ensure()
        # the block's own error goes on unchanged
        with pytest.raises(ZeroDivisionError):
            async with flock.lock("a:rv", 600) as lease2:
                await r.execute_command("FLOCK.REVOKE", "a:rv")
                assert await lease2.wait_lost(SOON_S * 1000)
                1 / 0
        assert lease2.lost
        await r.aclose()
    run(main())


def test_aio_stale_fenced_write_and_remaining_vs_check(server):
    """Scenario 1.1, 6.1 of docs/CLIENTS.md."""
    async def main():
        r = aclient(server)
        flock = Flock(r)
        a = await flock.acquire("{af}:lock", 2000, renew=False)
        for _ in range(100):
            server_left = await r.execute_command("FLOCK.CHECK", "{af}:lock", a.token)
            assert 0 < a.remaining_ms() <= server_left
        await flock.revoke("{af}:lock")
        b = await flock.acquire("{af}:lock", 10_000)
        with pytest.raises(FencedError):
            await a.fenced("SET", "{af}:data", "stale")
        assert a.lost and await a.release() is False
        assert await b.release() is True
        await r.aclose()
    run(main())


def test_aio_block_waiting_fifo_and_rule_1(server):
    """Scenario 1.3, 5.1 of docs/CLIENTS.md."""
    async def main():
        r = aclient(server)
        flock = Flock(r)
        holder = await flock.acquire("a:fifo", 20_000)
        order = []

        # 1 s leases after a 2 s wait: counted from the BLOCK request the first would be long
        # over; counted from the RENEW after the grant it outlives a slow round trip (300 ms
        # after a 0.9 s wait did not, on a loaded machine)
        async def waiter(i):
            lease = await flock.acquire("a:fifo", 1000, wait_ms=SOON_S * 1000, renew=(i != 0))
            order.append(i)
            return lease

        tasks = []
        t0 = time.monotonic()
        for i in range(3):
            tasks.append(asyncio.ensure_future(waiter(i)))
            await until(lambda: _eq(blocked(r), i + 1), f"waiter {i} blocks on the server")
        while time.monotonic() - t0 < 2.0:  # the first waiter waits two of its ttls
            await asyncio.sleep(0.05)
        before = await renewals(r)
        await holder.release()
        first = await asyncio.wait_for(tasks[0], SOON_S)
        # rule 1: the grant after a wait longer than the ttl is renewed at once
        assert await renewals(r) >= before + 1
        assert 0 < first.remaining_ms() <= 1000 and not first.lost
        assert order == [0]
        await first.release()
        second = await asyncio.wait_for(tasks[1], SOON_S)
        await second.release()
        third = await asyncio.wait_for(tasks[2], SOON_S)
        await third.release()
        assert order == [0, 1, 2]
        assert holder.token < first.token < second.token < third.token
        await r.aclose()
    run(main())


async def _eq(coro, value):
    return (await coro) == value


def test_aio_client_kill_of_the_watchdog_connection_is_recovered(server):
    """Scenario 2.3 of docs/CLIENTS.md."""
    async def main():
        admin = aclient(server, decode_responses=True)
        r = aclient(server, client_name="aio-holder")
        flock = Flock(r)
        kills = 0
        # 900 ms (renewed every 300 ms): each renewal after a kill also reconnects
        async with flock.lock("a:ck", 900) as lease:
            for round_ in range(4):
                for c in await admin.client_list():
                    if c.get("name") == "aio-holder":
                        kills += await admin.execute_command("CLIENT", "KILL", "ID", c["id"])
                # two renewals counted from after the kill (not from before it)
                want = await renewals(admin) + 2
                await until(lambda: _ge_or(renewals(admin), want, lease),
                            "renewals after a kill")
                assert not lease.lost, lease.lost_reason
            assert await lease.check() > 0
        assert kills >= 4
        await admin.aclose()
        await r.aclose()
    run(main())


async def _ge_or(coro, want, lease):
    return (await coro) >= want or lease.lost


def test_aio_dropped_lease_is_released_in_the_background(server):
    """Scenario 11.6 of docs/CLIENTS.md."""
    async def main():
        r = aclient(server)
        lease = await Flock(r).acquire("a:dropped", 30_000)
        del lease
        gc.collect()
        await until(lambda: _eq(r.exists("a:dropped"), 0), "the background release")
        await r.aclose()
    run(main())


def test_aio_a_connection_killed_in_the_middle_of_a_renewal_is_recovered(server):
    """Scenario 2.3 of docs/CLIENTS.md."""
    admin = server.client(decode_responses=True)

    def held_renewal():
        return [c for c in admin.client_list() if c.get("name") == "aio-holder2"
                and c.get("cmd") == "flock.renew" and "b" in c.get("flags", "")]

    async def main():
        r = aclient(server, client_name="aio-holder2")
        flock = Flock(r)
        loop = asyncio.get_running_loop()
        # 1.8 s: after the held RENEW (sent a third of the ttl after the last one), 1.2 s for
        # finding it, the kill, the unpause and the retry on a loaded machine
        async with flock.lock("a:ck2", 1800) as lease:
            for _ in range(3):
                admin.execute_command("CLIENT", "PAUSE", 10_000, "WRITE")
                try:
                    held = await loop.run_in_executor(None, lambda: wait_until(
                        held_renewal, "a renewal held by the pause"))
                    for c in held:
                        assert admin.execute_command("CLIENT", "KILL", "ID", c["id"]) == 1
                    # counted while no RENEW can run: one that landed before the pause must
                    # not pass for the retry
                    base = int(admin.info("flock")["flock_renewals"])
                finally:
                    admin.execute_command("CLIENT", "UNPAUSE")
                await until(lambda: _ge_or(renewals(r), base + 1, lease), "the renewal retried")
                assert not lease.lost, lease.lost_reason
            assert await lease.check() > 0
        assert not lease.lost
        await r.aclose()
    run(main())
