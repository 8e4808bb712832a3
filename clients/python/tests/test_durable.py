"""Durable grants (replicas= / fsync=, rule 10) in the sync client, against real servers: a
master with live replicas, one without, Redis 7.0 (no WAITAOF) and Valkey with its AOF."""
from __future__ import annotations

import threading
import time

import pytest

from redis_flock import Flock, FlockError, LockNotDurableError

from conftest import SOON_S, Monitor, Server, flock_blocked, valkey_binary, wait_until


def info_of(client, key):
    info = client.execute_command("FLOCK.INFO", key)
    return dict(zip(info[::2], info[1::2])) if isinstance(info, list) else info


def test_durable_grant_is_on_the_replica_when_acquire_returns(replicated):
    """Scenario 10.1 of docs/CLIENTS.md."""
    master, replica = replicated.master, replicated.replicas[0]
    r = master.client(decode_responses=True)
    mon = Monitor(master)
    try:
        lease = Flock(r).acquire("d:one", 10_000, replicas=1)
        # no polling: the replica acknowledged the grant before acquire() returned
        with replica.client(decode_responses=True) as rc:
            assert rc.execute_command("FLOCK.CHECK", "d:one", lease.token) > 0
            info = info_of(rc, "d:one")
            assert info["owner"] == lease.owner and info["token"] == lease.token
        assert lease.replicas == 1 and lease.fsync is False and not lease.lost
        assert lease.release() is True
    finally:
        mon.close()
    acq = mon.index("FLOCK.ACQUIRE d:one")
    # pipelined after the ACQUIRE, on the same connection; a third of the ttl by default
    assert mon.commands[acq + 1] == "WAIT 1 3333"
    assert r.exists("d:one") == 0


def test_durable_grant_without_replicas_is_released_after_the_timeout(server):
    """Scenario 10.2 of docs/CLIENTS.md."""
    r = server.client(decode_responses=True)
    flock = Flock(r)
    mon = Monitor(server)
    try:
        t = time.monotonic()
        with pytest.raises(LockNotDurableError) as ei:
            flock.acquire("d:none", 10_000, replicas=1, durable_timeout_ms=300)
        took = time.monotonic() - t
    finally:
        mon.close()
    e = ei.value
    assert isinstance(e, FlockError)
    assert (e.acknowledged, e.requested, e.key, e.fsync, e.fsynced) == (0, 1, "d:none", False,
                                                                         None)
    assert "0 of 1 replicas acknowledged within 300 ms" in str(e) and "released" in str(e)
    assert 0.3 <= took < 0.3 + 2.0
    assert r.exists("d:none") == 0  # the grant was released: the key is free again
    # the RELEASE named the grant's token (a newer grant of the same owner is never ended)
    release = mon.commands[mon.index("FLOCK.RELEASE d:none")].split()
    assert len(release) == 4 and int(release[3]) > 0
    assert mon.commands[mon.index("FLOCK.ACQUIRE d:none") + 1] == "WAIT 1 300"
    other = flock.acquire("d:none", 1000)
    assert other is not None and other.release()


def test_durable_two_replicas_asked_one_there_raises(replicated):
    """Scenario 10.2 of docs/CLIENTS.md."""
    r = replicated.master.client()
    with pytest.raises(LockNotDurableError) as ei:
        Flock(r).acquire("d:two", 5000, replicas=2, durable_timeout_ms=200)
    assert (ei.value.acknowledged, ei.value.requested) == (1, 2)
    assert "1 of 2 replicas acknowledged" in str(ei.value)
    assert r.exists("d:two") == 0
    with replicated.replicas[0].client() as rc:  # the release reached the replica too
        wait_until(lambda: rc.exists("d:two") == 0, "the release on the replica")


def test_durable_fsync_without_waitaof_is_refused_before_acquire(no_waitaof_server):
    """Scenario 10.3 of docs/CLIENTS.md."""
    srv = no_waitaof_server
    r = srv.client()
    flock = Flock(r)
    mon = Monitor(srv)
    try:
        for _ in range(2):
            with pytest.raises(FlockError, match="needs WAITAOF") as ei:
                flock.acquire("d:aof", 5000, fsync=True)
            assert not isinstance(ei.value, LockNotDurableError)
    finally:
        mon.close()
    assert r.exists("d:aof") == 0
    assert mon.count("FLOCK.") == 0  # no ACQUIRE was ever sent
    assert mon.count("COMMAND INFO WAITAOF") == 1  # asked once per client


def test_durable_fsync_on_valkey_with_the_aof(valkey_aof):
    """Scenario 10.1 of docs/CLIENTS.md."""
    master, replica = valkey_aof.master, valkey_aof.replicas[0]
    r = master.client()
    flock = Flock(r)
    mon = Monitor(master)
    try:
        lease = flock.acquire("d:fsync", 6000, fsync=True, renew=False)
        assert lease.fsync and lease.replicas == 0
        t = time.monotonic()
        lease.renew()
        # the local deadline counts from this renewal (its WAITAOF answered 1 0)
        assert lease.remaining_ms() >= 6000 - (time.monotonic() - t) * 1000 - 20
        assert lease.release() is True
        # the local AOF and the replica's both
        with flock.lock("d:fsync2", 6000, fsync=True, replicas=1) as lease2:
            with replica.client() as rc:
                assert rc.execute_command("FLOCK.CHECK", "d:fsync2", lease2.token) > 0
    finally:
        mon.close()
    assert mon.commands[mon.index("FLOCK.ACQUIRE d:fsync") + 1] == "WAITAOF 1 0 2000"
    assert mon.commands[mon.index("FLOCK.RENEW d:fsync") + 1].startswith("WAITAOF 1 0 ")
    assert mon.commands[mon.index("FLOCK.ACQUIRE d:fsync2") + 1] == "WAITAOF 1 1 2000"
    assert r.exists("d:fsync") == 0 and r.exists("d:fsync2") == 0


def test_durable_fsync_on_valkey_without_the_aof_releases_and_raises():
    """Scenario 10.2 of docs/CLIENTS.md."""
    srv = Server(binary=valkey_binary())  # appendonly no: WAITAOF 1 ... is an error
    try:
        r = srv.client()
        with pytest.raises(LockNotDurableError, match="WAITAOF failed") as ei:
            Flock(r).acquire("d:noaof", 5000, fsync=True)
        assert ei.value.fsync is True and ei.value.acknowledged == 0
        assert r.exists("d:noaof") == 0
    finally:
        srv.close()


def test_durable_argument_checks_come_before_anything_is_sent(server):
    """Scenario 10.3, 12.5 of docs/CLIENTS.md."""
    r = server.client()
    flock = Flock(r)
    mon = Monitor(server)
    try:
        bad = [dict(bound=True, replicas=1), dict(bound=True, fsync=True),
               dict(replicas=-1), dict(replicas=True), dict(replicas=1.0), dict(replicas="1"),
               dict(fsync=1), dict(fsync=None), dict(replicas=1, durable_timeout_ms=0),
               dict(replicas=1, durable_timeout_ms=1.5), dict(replicas=1, durable_timeout_ms=True),
               dict(replicas=1, durable_timeout_ms=5000)]
        for kw in bad:
            with pytest.raises(ValueError):
                flock.acquire("d:args", 5000, **kw)
            with pytest.raises(ValueError):
                with flock.lock("d:args", 5000, wait_ms=100, **kw):
                    pass
        with pytest.raises(ValueError, match="BOUND grant ends at any promotion"):
            flock.acquire("d:args", 5000, bound=True, replicas=1)
    finally:
        mon.close()
    assert mon.count("FLOCK.") == 0 and mon.count("WAIT") == 0
    assert r.exists("d:args") == 0
    # replicas=0 and fsync=False is a plain lease: no WAIT at all
    lease = flock.acquire("d:args", 5000, replicas=0, fsync=False, bound=True)
    assert lease.replicas == 0 and lease.release()


def test_durable_renewal_moves_the_local_deadline_only_when_acknowledged(replicated):
    """Scenario 10.1 of docs/CLIENTS.md."""
    master, replica = replicated.master, replicated.replicas[0]
    r = master.client()
    lease = Flock(r).acquire("d:renew", 3000, replicas=1, durable_timeout_ms=300, renew=False)
    time.sleep(0.5)
    assert lease.remaining_ms() < 2600
    lease.renew()  # acknowledged: counts from this renewal
    assert lease.remaining_ms() > 2800
    replica.stop_process()  # SIGSTOP: the replica acknowledges nothing from now on
    try:
        time.sleep(0.5)
        before = lease.remaining_ms()
        t = time.monotonic()
        with pytest.raises(LockNotDurableError) as ei:
            lease.renew()
        assert time.monotonic() - t >= 0.3
        assert (ei.value.acknowledged, ei.value.requested) == (0, 1)
        assert "local deadline stays" in str(ei.value)
        after = lease.remaining_ms()
        assert 0 < after <= before - 250  # not extended: still counting from the last ack
        assert not lease.lost
        # the master did renew: the server holds it longer than the client believes
        assert r.execute_command("FLOCK.CHECK", "d:renew", lease.token) > after + 200
    finally:
        replica.cont_process()
    lease.renew()  # acknowledged again
    assert lease.remaining_ms() > 2800
    assert lease.release() is True


def test_durable_watchdog_renewals_that_fall_short_let_the_lease_run_out(replicated):
    """Scenario 10.2 of docs/CLIENTS.md."""
    master, replica = replicated.master, replicated.replicas[0]
    r = master.client()
    lease = Flock(r).acquire("d:watch", 1200, replicas=1, durable_timeout_ms=200)
    time.sleep(2.0)  # past the ttl: acknowledged renewals keep it
    assert not lease.lost and lease.remaining_ms() > 500
    replica.stop_process()
    try:
        t = time.monotonic()
        assert lease.wait_lost(SOON_S * 1000) is True
        took = time.monotonic() - t
        # the master still holds the grant (renewed by the short renewals), the client does
        # not believe it any more: it gave up at the deadline of its last acknowledged renewal
        assert r.execute_command("FLOCK.CHECK", "d:watch", lease.token) > 0
        assert took <= 1.2 + 0.5
        assert lease.lost_reason == "deadline-passed"
    finally:
        replica.cont_process()
    lease.release()
    assert r.exists("d:watch") == 0


def test_durable_grant_after_a_block_wait(replicated):
    """Scenario 10.1 of docs/CLIENTS.md."""
    master, replica = replicated.master, replicated.replicas[0]
    r = master.client()
    flock = Flock(r)
    holder = flock.acquire("d:wait", 10_000)
    out = {}

    def waiter():
        out["lease"] = flock.acquire("d:wait", 10_000, wait_ms=SOON_S * 1000, replicas=1)

    mon = Monitor(master)
    try:
        t = threading.Thread(target=waiter)
        t.start()
        wait_until(lambda: flock_blocked(master) == 1, "the waiter to block")
        holder.release()
        t.join(SOON_S)
        lease = out["lease"]
        with replica.client() as rc:
            assert rc.execute_command("FLOCK.CHECK", "d:wait", lease.token) > 0
    finally:
        mon.close()
    cmds = mon.commands
    # the free-key try (ACQUIRE + WAIT, no BLOCK), the wait, then RENEW + WAIT after the grant
    first = mon.index("FLOCK.ACQUIRE d:wait")
    assert "BLOCK" not in cmds[first] and cmds[first + 1] == "WAIT 1 3333"
    block = next(i for i, c in enumerate(cmds) if c.startswith("FLOCK.ACQUIRE d:wait")
                 and "BLOCK" in c)
    renew = mon.index("FLOCK.RENEW d:wait")
    assert first < block < renew and cmds[renew + 1] == "WAIT 1 3333", cmds
    assert lease.release()


def test_durable_grant_after_a_block_wait_without_replicas_is_released(server):
    """Scenario 10.2 of docs/CLIENTS.md."""
    r = server.client()
    flock = Flock(r)
    holder = flock.acquire("d:wait0", 10_000)
    out = {}

    def waiter():
        try:
            flock.acquire("d:wait0", 10_000, wait_ms=SOON_S * 1000, replicas=1,
                          durable_timeout_ms=200)
        except LockNotDurableError as e:
            out["error"] = e

    t = threading.Thread(target=waiter)
    t.start()
    # its free-key try (ACQUIRE + WAIT 200 ms) found the key taken; now it waits with BLOCK
    wait_until(lambda: flock_blocked(server) == 1, "the waiter to block")
    holder.release()
    t.join(SOON_S)
    assert out["error"].acknowledged == 0 and out["error"].requested == 1
    assert r.exists("d:wait0") == 0
