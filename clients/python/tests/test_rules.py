"""Rules 9, 11 and 12 and inspection (docs/CLIENTS.md, "Scenarios"), sync client, against a real
server. Each test names its scenario in its name and docstring."""
from __future__ import annotations

import math
import threading
import time

import pytest
import redis

from redis_flock import (
    LOSS_REASONS,
    Flock,
    Holder,
    InvalidArgumentError,
    LockBusyError,
    LockLostError,
    Waiter,
)

from conftest import SOON_S, Monitor, free_port, wait_until

#: "within 50 ms" asserted generously for a loaded 2-core machine (bench.py --loss measures it)
HEARD_MS = 500


def watched(server, n=1):
    """Waits until the server has n FLOCK.WATCHes waiting (the lease is watched from then)."""
    wait_until(lambda: int(server.info("flock").get("flock_watchers", 0)) == n,
               f"{n} watcher(s)")


def heard_ms(lease, t0):
    assert lease.wait_lost(SOON_S * 1000), "the loss was not heard"
    return (time.monotonic() - t0) * 1000


def test_s9_1_revoke_heard(server):
    """9.1: REVOKE from another connection: lost (revoked) at once; flag, callback, ensure(),
    and leaving the block raises."""
    admin = server.client()
    flock = Flock(server.client())
    calls = []
    with pytest.raises(LockLostError) as caught:
        with flock.lock("r9:1", 30_000) as lease:
            lease.on_lost(lambda lz: calls.append(lz.lost_reason))
            watched(server)
            t0 = time.monotonic()
            assert admin.execute_command("FLOCK.REVOKE", "r9:1") == 1
            ms = heard_ms(lease, t0)
            assert ms < HEARD_MS, ms
            assert lease.lost and lease.lost_reason == "revoked"
            t1 = time.monotonic()
            with pytest.raises(LockLostError) as e:
                lease.ensure()
            assert (time.monotonic() - t1) < 0.05 and e.value.reason == "revoked"
            wait_until(lambda: calls == ["revoked"], "the on_lost callback")
    assert caught.value.reason == "revoked" and caught.value.token == lease.token


def test_s9_2_client_kill_of_a_bound_lease_heard(server):
    """9.2, 8.1: CLIENT KILL of a BOUND lease's connection: lost (closed) at once."""
    admin = server.client(decode_responses=True)
    flock = Flock(server.client(client_name="r9-2"))
    lease = flock.acquire("r9:2", 30_000, bound=True)
    watched(server)
    mine = [c for c in admin.client_list() if c.get("name") == "r9-2"
            and c["cmd"] in ("flock.acquire", "flock.renew")]
    assert len(mine) == 1, mine
    t0 = time.monotonic()
    assert admin.execute_command("CLIENT", "KILL", "ID", mine[0]["id"]) == 1
    ms = heard_ms(lease, t0)
    assert ms < HEARD_MS, ms
    assert lease.lost_reason == "closed"
    with pytest.raises(LockLostError):
        lease.ensure()
    assert admin.exists("r9:2") == 0


def test_s9_3_del_and_flushall_heard(server):
    """9.3: DEL of the key, and FLUSHALL: lost (lost) at once."""
    admin = server.client()
    flock = Flock(server.client())
    a = flock.acquire("r9:3a", 30_000)
    watched(server)
    t0 = time.monotonic()
    admin.delete("r9:3a")
    assert heard_ms(a, t0) < HEARD_MS and a.lost_reason == "lost"
    b = flock.acquire("r9:3b", 30_000, shared=True)
    c = flock.acquire("r9:3c", 30_000, limit=2)
    wait_until(lambda: server.watchers() == 1 and flock._track.lanes[None].armed.keys()
               >= {(b"r9:3b", b.token), (b"r9:3c", c.token)}, "both watched")
    t0 = time.monotonic()
    admin.flushall()
    assert heard_ms(b, t0) < HEARD_MS and heard_ms(c, t0) < HEARD_MS
    # one WATCH reply names one grant's end: the other lease's WATCH, sent again, finds its
    # grant already gone
    assert sorted([b.lost_reason, c.lost_reason]) in (["lost", "lost"], ["gone", "lost"])


def test_s9_4_one_watch_connection_for_many_leases(server):
    """9.4: many leases, one watching connection; a lease taken while the WATCH waits is
    watched too; a released one is no longer watched."""
    admin = server.client(decode_responses=True)
    flock = Flock(server.client(client_name="r9-4"))
    leases = [flock.acquire(f"r9:4:{i}", 30_000) for i in range(20)]
    watched(server)
    time.sleep(0.05)
    watches = [c for c in admin.client_list() if c.get("name") == "r9-4"
               and c["cmd"] == "flock.watch"]
    assert len(watches) == 1 and server.watchers() == 1
    late = flock.acquire("r9:4:late", 30_000)
    wait_until(lambda: (b"r9:4:late", late.token) in flock._track.lanes[None].armed,
               "the late lease watched")
    assert server.watchers() == 1
    t0 = time.monotonic()
    admin.execute_command("FLOCK.REVOKE", "r9:4:late")
    assert heard_ms(late, t0) < HEARD_MS and late.lost_reason == "revoked"
    assert leases[0].release() is True
    wait_until(lambda: (b"r9:4:0", leases[0].token) not in flock._track.lanes[None].armed,
               "the released lease no longer watched")
    assert not any(lz.lost for lz in leases)
    assert server.watchers() == 1
    for lz in leases[1:]:
        assert lz.release() is True


def test_s9_5_own_release_is_no_loss_and_renewals_go_on(server):
    """9.5: renewals go on while the WATCH waits (a 300 ms lease outlives 5 ttls), and the
    lease's own release is not a loss."""
    flock = Flock(server.client())
    long = flock.acquire("r9:5:long", 30_000)
    short = flock.acquire("r9:5:short", 300)
    watched(server)
    time.sleep(1.5)
    assert not short.lost and not long.lost and short.check() > 0
    assert short.release() is True and long.release() is True
    time.sleep(0.1)
    assert not short.lost and not long.lost and short.lost_reason is None


def test_s9_6_release_by_another_process_is_revoked(server):
    """9.6: a supervisor's flock.release(key, owner) elsewhere is heard as revoked."""
    flock = Flock(server.client())
    lease = flock.acquire("r9:6", 30_000, owner="worker-6")
    watched(server)
    t0 = time.monotonic()
    assert Flock(server.client()).release("r9:6", "worker-6") is True
    assert heard_ms(lease, t0) < HEARD_MS and lease.lost_reason == "revoked"


def test_s11_1_same_owner_twice_is_busy(server):
    """11.1: the same owner acquiring a key this Flock holds: LockBusyError at once; the held
    lease and its grant are intact."""
    flock = Flock(server.client())
    lease = flock.acquire("r11:1", 30_000, owner="me")
    t0 = time.monotonic()
    with pytest.raises(LockBusyError):
        flock.acquire("r11:1", 30_000, owner="me", wait_ms=5000)
    assert time.monotonic() - t0 < 1.0
    assert not lease.lost and lease.check() > 0
    assert lease.release() is True


def test_s11_2_reentrant_counts_holds(server):
    """11.2: reentrant=True returns the same lease; only the last release ends the grant."""
    r = server.client()
    flock = Flock(server.client())
    with flock.lock("r11:2", 30_000, reentrant=True) as outer:
        with flock.lock("r11:2", 30_000, reentrant=True, wait_ms=5000) as inner:
            assert inner is outer and outer.holds == 2
        assert outer.holds == 1 and not outer.lost
        assert r.execute_command("FLOCK.CHECK", "r11:2", outer.token) > 0
    assert r.exists("r11:2") == 0 and not outer.lost


def test_s11_3_reentrant_with_another_kind_is_invalid(server):
    """11.3: a reentrant acquire asking for another kind than the held lease."""
    flock = Flock(server.client())
    lease = flock.acquire("r11:3", 30_000, owner="k", reentrant=True)
    with pytest.raises(InvalidArgumentError):
        flock.acquire("r11:3", 30_000, owner="k", reentrant=True, shared=True)
    with pytest.raises(InvalidArgumentError):
        flock.acquire("r11:3", 30_000, owner="k", reentrant=True, bound=True)
    assert lease.holds == 1 and lease.release() is True


def test_s11_4_reentrant_owner_is_one_per_thread(server):
    """11.4: reentrant=True without an owner: another thread waits as another holder would;
    the same thread re-enters."""
    flock = Flock(server.client())
    lease = flock.acquire("r11:4", 30_000, reentrant=True)
    got = {}

    def other():
        got["try"] = flock.acquire("r11:4", 30_000, reentrant=True)
        got["wait"] = flock.acquire("r11:4", 30_000, reentrant=True, wait_ms=SOON_S * 1000)
    t = threading.Thread(target=other)
    t.start()
    wait_until(lambda: server.blocked_clients() == 1, "the other thread waits")
    assert got["try"] is None
    assert flock.acquire("r11:4", 30_000, reentrant=True) is lease and lease.holds == 2
    assert lease.release() is True and lease.holds == 1 and server.blocked_clients() == 1
    assert lease.release() is True
    t.join(SOON_S)
    assert got["wait"] is not None and got["wait"] is not lease
    assert got["wait"].owner != lease.owner
    assert got["wait"].release() is True


def test_s11_5_nested_wait_on_its_own_lease_fails_at_once(server):
    """11.5: a nested default acquire with a wait on a key the thread holds: LockBusyError at
    once instead of waiting until its timeout."""
    flock = Flock(server.client())
    with flock.lock("r11:5", 30_000):
        t0 = time.monotonic()
        with pytest.raises(LockBusyError):
            with flock.lock("r11:5", 30_000, wait_ms=10_000):
                pass
        assert time.monotonic() - t0 < 2.0
        # a nested shared lease under a shared one is granted by the one try
    with flock.lock("r11:5s", 30_000, shared=True) as a:
        with flock.lock("r11:5s", 30_000, shared=True, wait_ms=10_000) as b:
            assert a is not b and len(b.holders()) == 2


@pytest.mark.parametrize("kw", [dict(key=""), dict(key=5), dict(key=None)],
                         ids=["empty", "int", "none"])
def test_s12_1_bad_key(kw):
    """12.1: an empty key or one of another type: InvalidArgumentError, nothing sent (the
    client's server does not exist)."""
    flock = Flock(redis.Redis(port=free_port(), socket_connect_timeout=0.2))
    with pytest.raises(InvalidArgumentError):
        flock.acquire(kw["key"], 1000)
    for call in (flock.info, flock.holders, flock.waiters, flock.locked):
        with pytest.raises(InvalidArgumentError):
            call(kw["key"])


@pytest.mark.parametrize("ttl", [0, -1, 1.5, True, "100", None])
def test_s12_2_bad_ttl(ttl):
    """12.2: a ttl of 0, negative, fractional, a bool, a string: InvalidArgumentError."""
    flock = Flock(redis.Redis(port=free_port(), socket_connect_timeout=0.2))
    with pytest.raises(InvalidArgumentError):
        flock.acquire("k", ttl)
    assert issubclass(InvalidArgumentError, ValueError)


@pytest.mark.parametrize("owner", ["", "x" * 257, "é" * 129, b"bytes", 5])
def test_s12_3_bad_owner(owner):
    """12.3: an owner empty, over 256 bytes, bytes or a number: InvalidArgumentError."""
    flock = Flock(redis.Redis(port=free_port(), socket_connect_timeout=0.2))
    with pytest.raises(InvalidArgumentError):
        flock.acquire("k", 1000, owner=owner)
    with pytest.raises(InvalidArgumentError):
        flock.release("k", owner)


def test_s12_4_unknown_option():
    """12.4: a misspelt option is an error, not ignored."""
    flock = Flock(redis.Redis(port=free_port(), socket_connect_timeout=0.2))
    with pytest.raises(InvalidArgumentError, match="wait"):
        flock.acquire("k", 1000, wait=5000)
    with pytest.raises(InvalidArgumentError, match="ttl"):
        flock.lock("k", 1000, ttl=5)


@pytest.mark.parametrize("kw", [dict(wait_ms=-1), dict(wait_ms=math.nan), dict(limit=0),
                                dict(limit=1.5), dict(shared=True, limit=2),
                                dict(bound=True, replicas=1), dict(renew="yes"),
                                dict(reentrant=1), dict(shared=1)])
def test_s12_5_bad_options(kw):
    """12.5: a negative or NaN wait, a bad limit, shared with limit, bound with replicas, a
    flag that is not a bool: InvalidArgumentError."""
    flock = Flock(redis.Redis(port=free_port(), socket_connect_timeout=0.2))
    with pytest.raises(InvalidArgumentError):
        flock.acquire("k", 1000, **kw)


def test_s12_6_loss_reasons(server):
    """12.6: each loss names its reason from the fixed list (deadline-passed, renew-refused,
    fenced-refused here; revoked, closed, lost in 9.1-9.3)."""
    admin = server.client()
    flock = Flock(server.client())
    a = flock.acquire("r12:6a", 200, renew=False)
    time.sleep(0.25)
    assert a.lost and a.lost_reason == "deadline-passed"
    b = flock.acquire("r12:6b", 30_000)
    admin.execute_command("FLOCK.REVOKE", "r12:6b")
    with pytest.raises(LockLostError) as e:
        b.renew()  # (younger than the watch's 10 ms, or heard first: then gone / revoked)
    assert e.value.reason in ("renew-refused", "gone", "revoked") and b.lost
    c = flock.acquire("r12:6c", 30_000)
    admin.execute_command("FLOCK.REVOKE", "r12:6c")
    with pytest.raises(Exception):
        c.fenced("SET", "x", "1")
    assert c.lost_reason in ("fenced-refused", "gone", "revoked")
    for lz in (a, b, c):
        assert lz.lost_reason in LOSS_REASONS


def test_s12_7_a_released_lease_answers_locally(server):
    """12.7: fenced(), ensure() and renew() after a clean release: LockLostError (released) at
    once, nothing sent, lost stays False."""
    flock = Flock(server.client())
    lease = flock.acquire("r12:7", 30_000)
    assert lease.release() is True
    mon = Monitor(server)
    try:
        for call in (lambda: lease.fenced("SET", "x", "1"), lease.ensure, lease.renew):
            with pytest.raises(LockLostError) as e:
                call()
            assert e.value.reason == "released"
        assert lease.check() == 0
    finally:
        mon.close()
    assert mon.count("FLOCK.") == 0, mon.commands
    assert not lease.lost and lease.lost_reason is None


def test_si_1_info(server):
    """I.1: info(): None for an unknown key; the fields of a held key with a waiter."""
    flock, other = Flock(server.client()), Flock(server.client())
    assert flock.info("ri:1") is None
    lease = flock.acquire("ri:1", 30_000)
    t = threading.Thread(target=lambda: other.acquire("ri:1", 1000, wait_ms=3000))
    t.start()
    wait_until(lambda: server.blocked_clients() == 1, "a waiter")
    info = flock.info("ri:1")
    assert info["owner"] == lease.owner and info["token"] == lease.token
    assert info["mode"] == "exclusive" and info["waiters"] == 1 and info["holders"] == 1
    assert 0 < info["ttl"] <= 30_000
    lease.release()
    t.join(SOON_S)


def test_si_2_holders(server):
    """I.2: holders() and lease.holders(): every grant of a shared key, oldest first."""
    flock = Flock(server.client(decode_responses=True))
    a = flock.acquire("ri:2", 30_000, shared=True)
    b = flock.acquire("ri:2", 20_000, shared=True)
    hs = flock.holders("ri:2")
    assert [(h.owner, h.token) for h in hs] == [(a.owner, a.token), (b.owner, b.token)]
    assert isinstance(hs[0], Holder) and 0 < hs[1].ttl_ms <= 20_000
    assert [(h.owner, h.token) for h in a.holders()] == [(h.owner, h.token) for h in hs]
    assert flock.holders("ri:none") == []


def test_si_3_waiters(server):
    """I.3: waiters(): the waiting requests in line order with their mode."""
    flock = Flock(server.client())
    holder = flock.acquire("ri:3", 30_000)
    assert flock.waiters("ri:3") == []
    ts = []
    for i, kw in enumerate([dict(owner="w1"), dict(owner="w2", shared=True)]):
        other = Flock(server.client())
        ts.append(threading.Thread(target=lambda o=other, k=kw: o.acquire("ri:3", 1000,
                                                                          wait_ms=5000, **k)))
        ts[-1].start()
        wait_until(lambda: server.blocked_clients() == i + 1, "a waiter")
    ws = flock.waiters("ri:3")
    assert [(w.owner, w.mode) for w in ws] == [("w1", "exclusive"), ("w2", "shared")]
    assert isinstance(ws[0], Waiter) and ws[0].waited_ms >= ws[1].waited_ms >= 0
    assert len(flock.waiters("ri:3", count=1)) == 1
    holder.release()
    for t in ts:
        t.join(SOON_S)


def test_si_4_locked(server):
    """I.4: locked(): false, true while held, false after release."""
    flock = Flock(server.client())
    assert flock.locked("ri:4") is False
    lease = flock.acquire("ri:4", 30_000)
    assert flock.locked("ri:4") is True
    lease.release()
    assert flock.locked("ri:4") is False


def test_si_5_check(server):
    """I.5: check(key, token): the ms left of a live grant, 0 after release."""
    flock = Flock(server.client())
    lease = flock.acquire("ri:5", 30_000)
    assert 0 < flock.check("ri:5", lease.token) <= 30_000
    lease.release()
    assert flock.check("ri:5", lease.token) == 0


def test_si_6_stats(server):
    """I.6: stats() and stats(cls): the class of a key counts its grants and releases."""
    flock = Flock(server.client())
    for _ in range(3):
        flock.acquire("orders:42:lock", 30_000).release()
    st = flock.stats()
    cls = st["classes"]["orders:#:lock"]
    assert cls["grants"] == 3 and cls["released"] == 3
    assert set(flock.stats("orders:#:lock")["classes"]) == {"orders:#:lock"}
    assert "overflow" in st


def test_s9_7_a_forked_child_watches_its_own_leases(server):
    """9.1 in a forked child: the parent's watch thread did not come along; the child's own
    lease is watched by a lane of its own, and the parent's leases are not the child's
    (rule 11 does not see them)."""
    import os
    flock = Flock(server.client())
    parent = flock.acquire("r9:7p", 30_000, owner="p")
    watched(server)
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status only
        code = 1
        try:
            flock.client.connection_pool.reset()
            mine = flock.acquire("r9:7c", 30_000, owner="p")  # the parent's owner: no busy
            time.sleep(0.1)
            redis.Redis(port=server.port).execute_command("FLOCK.REVOKE", "r9:7c")
            if mine.wait_lost(HEARD_MS) and mine.lost_reason == "revoked":
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not parent.lost and parent.check() > 0 and parent.release() is True
