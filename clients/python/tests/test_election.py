"""Leader election (docs/CLIENTS.md, scenarios E.1-E.5), sync and asyncio, against a real
server. Each test names its scenario in its name and docstring."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis.asyncio

import redis_flock.aio
from redis_flock import Flock, Leader, LockBusyError

from conftest import SOON_S, Monitor, wait_until


def test_se_1_to_5_election(server):
    """E.1-E.5: campaign on a free key leads at once and leader() names it; a second
    candidate waits and leads when the first resigns; observe() yields the state, then each
    change (None while free) from WATCH, not polling; a leader whose connection dies is
    replaced; campaign(wait_ms) not leading in time raises LockBusyError."""
    admin = server.client(decode_responses=True)
    flock = Flock(server.client(client_name="el"))
    one = flock.election("el", 30_000, owner="one")
    two = Flock(server.client()).election("el", 30_000, owner="two")
    seen = []
    obs = one.observe()
    t = threading.Thread(target=lambda: [seen.append(x) for x in obs], daemon=True)
    t.start()
    wait_until(lambda: seen == [None], "E.3: the state at the start")
    mon = Monitor(server)
    try:
        lease = one.campaign()  # E.1
        assert one.leader() == Leader("one", lease.token) == two.leader()
        wait_until(lambda: seen == [None, Leader("one", lease.token)], "E.3: the first leader")
        with pytest.raises(LockBusyError):  # E.5
            two.campaign(wait_ms=100)
        got = {}
        t2 = threading.Thread(target=lambda: got.setdefault("lease", two.campaign()), daemon=True)
        t2.start()
        wait_until(lambda: server.blocked_clients() == 1, "E.2: the second candidate waits")
        time.sleep(0.3)
        assert one.resign() is True
        t2.join(SOON_S)
        second = got["lease"]
        assert second.token > lease.token and two.leader() == Leader("two", second.token)
        wait_until(lambda: seen[-1] == Leader("two", second.token), "E.3: the second leader")
        # E.4: the leader's connection dies: its BOUND grant ends, the next candidate leads
        three = flock.election("el", 30_000, owner="three")
        got3 = {}
        t3 = threading.Thread(target=lambda: got3.setdefault("lease", three.campaign()),
                              daemon=True)
        t3.start()
        wait_until(lambda: server.blocked_clients() == 1, "E.4: the third candidate waits")
        conns = [c for c in admin.client_list() if c["cmd"] in ("flock.acquire", "flock.renew")
                 and c.get("name") != "el"]
        assert len(conns) == 1, conns
        admin.execute_command("CLIENT", "KILL", "ID", conns[0]["id"])
        t3.join(SOON_S)
        assert got3["lease"].owner == "three"
        assert second.wait_lost(SOON_S * 1000) and second.lost_reason in ("closed", "gone")
        wait_until(lambda: seen[-1] == Leader("three", got3["lease"].token), "E.4 observed")
        assert three.resign() is True
        wait_until(lambda: seen[-1] is None, "E.3: free again")
    finally:
        mon.close()
        obs.close()
    t.join(SOON_S)
    assert not t.is_alive()
    # E.3: driven by WATCH: one INFO per change and no more (no polling)
    assert mon.count("FLOCK.INFO") <= len(seen) + 2, mon.commands
    assert [x for x in seen if x] == [Leader("one", lease.token), Leader("two", second.token),
                                      Leader("three", got3["lease"].token)]


def test_aio_se_1_to_3_election(server):
    """E.1-E.3, E.5 (asyncio): campaign, leader, observe, resign."""
    async def main():
        r = redis.asyncio.Redis(host="127.0.0.1", port=server.port)
        flock = redis_flock.aio.Flock(r)
        one = flock.election("ael", 30_000, owner="one")
        two = redis_flock.aio.Flock(redis.asyncio.Redis(host="127.0.0.1", port=server.port)) \
            .election("ael", 30_000, owner="two")
        seen = []

        async def watch():
            async with one.observe() as obs:
                async for x in obs:
                    seen.append(x)
                    if len(seen) == 4:
                        return
        task = asyncio.ensure_future(watch())
        await asyncio.sleep(0.1)
        lease = await one.campaign()
        assert await two.leader() == Leader("one", lease.token)
        with pytest.raises(LockBusyError):
            await two.campaign(wait_ms=100)
        waiting = asyncio.ensure_future(two.campaign())
        await asyncio.sleep(0.2)
        assert await one.resign() is True
        second = await asyncio.wait_for(waiting, SOON_S)
        assert await one.leader() == Leader("two", second.token)
        await two.resign()
        await asyncio.wait_for(task, SOON_S)
        assert seen == [None, Leader("one", lease.token), Leader("two", second.token), None]
        await r.aclose()
    asyncio.run(main())
