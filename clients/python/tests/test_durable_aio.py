"""Durable grants (replicas= / fsync=, rule 10) in the asyncio client, against real servers."""
from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio

from redis_flock import FlockError, LockNotDurableError
from redis_flock.aio import Flock
from redis_flock.aio import LockNotDurableError as AioLockNotDurableError

from conftest import SOON_S, Monitor, Server, flock_blocked, valkey_binary


def run(coro):
    return asyncio.run(coro)


def aclient(server, **kw):
    kw.setdefault("socket_timeout", SOON_S)
    return redis.asyncio.Redis(host="127.0.0.1", port=server.port, **kw)


def test_aio_durable_grant_is_on_the_replica_when_acquire_returns(replicated):
    """Scenario 10.1 of docs/CLIENTS.md."""
    master, replica = replicated.master, replicated.replicas[0]
    mon = Monitor(master)

    async def main():
        r = aclient(master)
        try:
            async with Flock(r).lock("a:one", 9000, replicas=1) as lease:
                # no polling: the replica acknowledged the grant before the block was entered
                with replica.client() as rc:
                    assert rc.execute_command("FLOCK.CHECK", "a:one", lease.token) > 0
                    info = rc.execute_command("FLOCK.INFO", "a:one")
                    info = dict(zip(info[::2], info[1::2])) if isinstance(info, list) else info
                    assert info[b"owner"].decode() == lease.owner
                    assert info[b"token"] == lease.token
                assert lease.replicas == 1 and not lease.lost
            assert await r.exists("a:one") == 0
        finally:
            await r.aclose()

    try:
        run(main())
    finally:
        mon.close()
    assert AioLockNotDurableError is LockNotDurableError
    assert mon.commands[mon.index("FLOCK.ACQUIRE a:one") + 1] == "WAIT 1 3000"


def test_aio_durable_grant_without_replicas_is_released_after_the_timeout(server):
    """Scenario 10.2 of docs/CLIENTS.md."""
    mon = Monitor(server)

    async def main():
        r = aclient(server)
        try:
            flock = Flock(r)
            t = time.monotonic()
            with pytest.raises(LockNotDurableError) as ei:
                await flock.acquire("a:none", 10_000, replicas=1, durable_timeout_ms=300)
            took = time.monotonic() - t
            assert (ei.value.acknowledged, ei.value.requested) == (0, 1)
            assert 0.3 <= took < 0.3 + 2.0
            assert await r.exists("a:none") == 0
            other = await flock.acquire("a:none", 1000)
            assert other is not None and await other.release()
        finally:
            await r.aclose()

    try:
        run(main())
    finally:
        mon.close()
    release = mon.commands[mon.index("FLOCK.RELEASE a:none")].split()
    assert len(release) == 4  # token-qualified


def test_aio_durable_two_replicas_asked_one_there_raises(replicated):
    """Scenario 10.2 of docs/CLIENTS.md."""
    async def main():
        r = aclient(replicated.master)
        try:
            with pytest.raises(LockNotDurableError) as ei:
                await Flock(r).acquire("a:two", 5000, replicas=2, durable_timeout_ms=200)
            assert (ei.value.acknowledged, ei.value.requested) == (1, 2)
            assert await r.exists("a:two") == 0
        finally:
            await r.aclose()

    run(main())


def test_aio_durable_fsync_without_waitaof_is_refused_before_acquire(no_waitaof_server):
    """Scenario 10.3 of docs/CLIENTS.md."""
    srv = no_waitaof_server
    mon = Monitor(srv)

    async def main():
        r = aclient(srv)
        try:
            flock = Flock(r)
            for _ in range(2):
                with pytest.raises(FlockError, match="needs WAITAOF") as ei:
                    await flock.acquire("a:aof", 5000, fsync=True)
                assert not isinstance(ei.value, LockNotDurableError)
            assert await r.exists("a:aof") == 0
        finally:
            await r.aclose()

    try:
        run(main())
    finally:
        mon.close()
    assert mon.count("FLOCK.") == 0
    assert mon.count("COMMAND INFO WAITAOF") == 1


def test_aio_durable_fsync_on_valkey_with_the_aof(valkey_aof):
    """Scenario 10.1 of docs/CLIENTS.md."""
    master, replica = valkey_aof.master, valkey_aof.replicas[0]

    async def main():
        r = aclient(master)
        try:
            flock = Flock(r)
            lease = await flock.acquire("a:fsync", 6000, fsync=True, replicas=1, renew=False)
            with replica.client() as rc:
                assert rc.execute_command("FLOCK.CHECK", "a:fsync", lease.token) > 0
            t = time.monotonic()
            await lease.renew()
            # the local deadline counts from this renewal (acknowledged: by the local AOF and
            # the replica's, each fsynced; with appendfsync everysec that may take a second)
            assert lease.remaining_ms() >= 6000 - (time.monotonic() - t) * 1000 - 20
            assert await lease.release() is True
        finally:
            await r.aclose()

    run(main())


def test_aio_durable_fsync_on_valkey_without_the_aof_releases_and_raises():
    """Scenario 10.2 of docs/CLIENTS.md."""
    srv = Server(binary=valkey_binary())

    async def main():
        r = aclient(srv)
        try:
            with pytest.raises(LockNotDurableError, match="WAITAOF failed"):
                await Flock(r).acquire("a:noaof", 5000, fsync=True)
            assert await r.exists("a:noaof") == 0
        finally:
            await r.aclose()

    try:
        run(main())
    finally:
        srv.close()


def test_aio_durable_argument_checks_come_before_anything_is_sent(server):
    """Scenario 10.3, 12.5 of docs/CLIENTS.md."""
    mon = Monitor(server)

    async def main():
        r = aclient(server)
        try:
            flock = Flock(r)
            for kw in [dict(bound=True, replicas=1), dict(bound=True, fsync=True),
                       dict(replicas=-1), dict(replicas=True), dict(fsync="yes"),
                       dict(replicas=1, durable_timeout_ms=0),
                       dict(replicas=1, durable_timeout_ms=5000)]:
                with pytest.raises(ValueError):
                    await flock.acquire("a:args", 5000, **kw)
                with pytest.raises(ValueError):
                    async with flock.lock("a:args", 5000, **kw):
                        pass
        finally:
            await r.aclose()

    try:
        run(main())
    finally:
        mon.close()
    assert mon.count("FLOCK.") == 0 and mon.count("WAIT") == 0


def test_aio_durable_renewal_moves_the_local_deadline_only_when_acknowledged(replicated):
    """Scenario 10.1 of docs/CLIENTS.md."""
    master, replica = replicated.master, replicated.replicas[0]

    async def main():
        r = aclient(master)
        try:
            lease = await Flock(r).acquire("a:renew", 3000, replicas=1, durable_timeout_ms=300,
                                           renew=False)
            await asyncio.sleep(0.5)
            assert lease.remaining_ms() < 2600
            await lease.renew()
            assert lease.remaining_ms() > 2800
            replica.stop_process()
            try:
                await asyncio.sleep(0.5)
                before = lease.remaining_ms()
                with pytest.raises(LockNotDurableError) as ei:
                    await lease.renew()
                assert (ei.value.acknowledged, ei.value.requested) == (0, 1)
                after = lease.remaining_ms()
                assert 0 < after <= before - 250 and not lease.lost
                assert await r.execute_command("FLOCK.CHECK", "a:renew", lease.token) > after + 200
            finally:
                replica.cont_process()
            await lease.renew()
            assert lease.remaining_ms() > 2800
            assert await lease.release() is True
        finally:
            await r.aclose()

    run(main())


def test_aio_durable_watchdog_renewals_that_fall_short_let_the_lease_run_out(replicated):
    """Scenario 10.2 of docs/CLIENTS.md."""
    master, replica = replicated.master, replicated.replicas[0]

    async def main():
        r = aclient(master)
        try:
            lease = await Flock(r).acquire("a:watch", 1200, replicas=1, durable_timeout_ms=200)
            await asyncio.sleep(2.0)
            assert not lease.lost and lease.remaining_ms() > 500
            replica.stop_process()
            try:
                t = time.monotonic()
                assert await lease.wait_lost(SOON_S * 1000) is True
                took = time.monotonic() - t
                assert await r.execute_command("FLOCK.CHECK", "a:watch", lease.token) > 0
                assert took <= 1.2 + 0.5
            finally:
                replica.cont_process()
            await lease.release()
            assert await r.exists("a:watch") == 0
        finally:
            await r.aclose()

    run(main())


def test_aio_durable_grant_after_a_block_wait(replicated):
    """Scenario 10.1 of docs/CLIENTS.md."""
    master, replica = replicated.master, replicated.replicas[0]
    mon = Monitor(master)

    async def main():
        r = aclient(master)
        try:
            flock = Flock(r)
            holder = await flock.acquire("a:wait", 10_000)
            waiter = asyncio.ensure_future(
                flock.acquire("a:wait", 10_000, wait_ms=SOON_S * 1000, replicas=1))
            end = time.monotonic() + SOON_S
            while flock_blocked(master) != 1:
                assert time.monotonic() < end, "the waiter never blocked"
                await asyncio.sleep(0.005)
            await holder.release()
            lease = await asyncio.wait_for(waiter, SOON_S)
            with replica.client() as rc:
                assert rc.execute_command("FLOCK.CHECK", "a:wait", lease.token) > 0
            assert await lease.release()
        finally:
            await r.aclose()

    try:
        run(main())
    finally:
        mon.close()
    cmds = mon.commands
    first = mon.index("FLOCK.ACQUIRE a:wait")
    block = next(i for i, c in enumerate(cmds) if c.startswith("FLOCK.ACQUIRE a:wait")
                 and "BLOCK" in c)
    renew = mon.index("FLOCK.RENEW a:wait")
    assert first < block < renew
    # the holder's ACQUIRE (plain) comes first; the waiter's free-key try is the second one
    tries = [i for i, c in enumerate(cmds) if c.startswith("FLOCK.ACQUIRE a:wait")]
    assert cmds[tries[1] + 1] == "WAIT 1 3333" and cmds[renew + 1] == "WAIT 1 3333"


@pytest.mark.parametrize("limit", ["asyncio.timeout", "wait_for"])
def test_aio_pipelined_replies_are_read_within_one_time_limit(server, monkeypatch, limit):
    """The pipelined write of a durable round trip (ACQUIRE + WAIT): its replies are read under
    one time limit for all of them (asyncio.timeout, or one wait_for before Python 3.11.3). An
    error reply stands in its place and the replies after it are read; when they do not all
    come within the limit, the connection is dropped (a late reply is never read as the answer
    to a later command) and TimeoutError raised."""
    import redis_flock.aio as aio
    from redis.exceptions import ResponseError, TimeoutError

    if limit == "wait_for":
        monkeypatch.setattr(aio, "_timeout", None)
    elif aio._timeout is None:
        pytest.fail("this Python has no asyncio.timeout: run the wait_for case only")

    async def main():
        r = aclient(server)
        pool = r.connection_pool
        conn = await aio._get_connection(pool)  # redis-py 5 asks for a command name
        try:
            out = await aio._send_all(conn, (("SET", "p:k", "v"), ("INCR", "p:k"), ("GET", "p:k")),
                                      5.0, False)
            assert out[0] == b"OK" and out[2] == b"v", out
            assert isinstance(out[1], ResponseError), out
            t = time.monotonic()
            with pytest.raises(TimeoutError, match="no reply in time"):
                await aio._send_all(conn, (("GET", "p:k"), ("BLPOP", "p:list", 3)), 0.3, False)
            waited = time.monotonic() - t
            assert 0.25 <= waited < 2.0, waited
            assert not conn.is_connected
            await conn.connect()  # the pool's connection is good again, and reads in step
            assert await aio._send_all(conn, (("GET", "p:k"),), 5.0, False) == [b"v"]
        finally:
            await pool.release(conn)
            await r.aclose()

    run(main())
