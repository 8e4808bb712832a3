"""Shared, counted and bound leases (SPEC "Lock kinds", "Connection-bound grants") with the sync
client, against a real redis-server with the flock module."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

from redis_flock import FlockError, Flock, LockBusyError, LockLostError

from conftest import SOON_S, wait_until

HERE = Path(__file__).resolve().parent


def kv(reply):
    """FLOCK.INFO as a dict (RESP2 gives a flat array)."""
    return dict(zip(reply[::2], reply[1::2])) if isinstance(reply, list) else reply


def flock_info(server) -> dict:
    return server.info("flock")


def waiting(flock, key, ttl, got, **kw):
    """A thread that waits for key with BLOCK and records the lease and when it came."""
    def run():
        try:
            got["lease"] = flock.acquire(key, ttl, wait_ms=SOON_S * 1000, **kw)
        except Exception as e:  # reported by the test
            got["error"] = e
        got["at"] = time.monotonic()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_shared_leases_hold_together_and_a_writer_waits_for_all_of_them(server):
    """Scenario 8.2 of docs/CLIENTS.md."""
    r = server.client(decode_responses=True)
    flock = Flock(server.client())
    # 900 ms (renewed every 300 ms): 450 ms leases left 300 ms for a late renewal
    readers = [flock.acquire("rw", 900, shared=True) for _ in range(3)]
    assert all(lease is not None for lease in readers)
    tokens = [lease.token for lease in readers]
    assert tokens == sorted(tokens) and len(set(tokens)) == 3, tokens
    info = kv(r.execute_command("FLOCK.INFO", "rw"))
    assert (info["mode"], info["holders"], info["limit"]) == ("shared", 3, 0)
    assert [h[:2] for h in r.execute_command("FLOCK.HOLDERS", "rw")] == \
        [[lease.owner, lease.token] for lease in readers]

    # A writer gets nothing while readers hold: None from acquire, LockBusyError from lock.
    assert flock.acquire("rw", 5000) is None
    with pytest.raises(LockBusyError):
        with flock.lock("rw", 5000):
            pass
    # A reader's fenced() runs reads; a write is the server's error, and the lease stays live.
    assert readers[0].fenced("GET", "rw:data") is None
    with pytest.raises(redis.ResponseError, match="shared grant runs read-only commands only"):
        readers[0].fenced("SET", "rw:data", "x")
    assert not readers[0].lost and readers[0].check() > 0
    assert r.exists("rw:data") == 0

    got: dict = {}
    t = waiting(flock, "rw", 5000, got)
    wait_until(lambda: server.blocked_clients() == 1, "the writer waits on the server")
    # A reader that comes after the waiting writer does not jump the queue.
    assert flock.acquire("rw", 5000, shared=True) is None
    # The readers' watchdogs keep their 900 ms leases alive while the writer waits.
    base = int(flock_info(server)["flock_renewals"])
    wait_until(lambda: int(flock_info(server)["flock_renewals"]) >= base + 6,
               "two renewals per reader")
    assert not any(lease.lost for lease in readers)
    assert readers[0].release() is True and readers[1].release() is True
    assert len(r.execute_command("FLOCK.HOLDERS", "rw")) == 1
    assert t.is_alive() and server.blocked_clients() == 1, "the writer waits for the last reader"
    assert readers[2].release() is True
    t.join(SOON_S)
    writer = got.get("lease")
    assert writer is not None, got
    assert writer.token > max(tokens)
    info = kv(r.execute_command("FLOCK.INFO", "rw"))
    assert (info["mode"], info["holders"], info["owner"]) == ("exclusive", 1, writer.owner)
    assert writer.fenced("SET", "rw:data", "w") == b"OK"
    assert writer.release() is True
    assert not any(lease.lost for lease in readers)


def test_counted_leases_admit_n_and_the_next_gets_a_released_permit(server):
    """Scenario 8.2 of docs/CLIENTS.md."""
    r = server.client(decode_responses=True)
    flock = Flock(server.client())
    with flock.lock("sem", 5000, limit=3) as first:
        permits = [first] + [flock.acquire("sem", 5000, limit=3) for _ in range(2)]
        assert all(p is not None for p in permits)
        tokens = [p.token for p in permits]
        assert tokens == sorted(tokens) and len(set(tokens)) == 3, tokens
        info = kv(r.execute_command("FLOCK.INFO", "sem"))
        assert (info["mode"], info["holders"], info["limit"]) == ("permits", 3, 3)
        # A permit may write (unlike a shared grant).
        assert permits[1].fenced("INCR", "sem:count") == 1
        # The fourth: none at once, and it waits with BLOCK.
        assert flock.acquire("sem", 5000, limit=3) is None
        with pytest.raises(LockBusyError):
            with flock.lock("sem", 5000, limit=3):
                pass
        got: dict = {}
        t = waiting(flock, "sem", 5000, got, limit=3)
        wait_until(lambda: server.blocked_clients() == 1, "the fourth waits on the server")
        assert t.is_alive()
        assert permits[1].release() is True
        t.join(SOON_S)
        fourth = got.get("lease")
        assert fourth is not None, got
        assert fourth.token > max(tokens)
        holders = r.execute_command("FLOCK.HOLDERS", "sem")
        assert [h[:2] for h in holders] == [[p.owner, p.token]
                                           for p in (permits[0], permits[2], fourth)]
        assert fourth.fenced("INCR", "sem:count") == 2
        assert fourth.release() is True and permits[2].release() is True
    assert not first.lost
    assert r.exists("sem") == 0


def test_limit_mismatch_and_mode_conflicts_are_the_servers_errors(server):
    """Scenario 8.2, 11.1 of docs/CLIENTS.md."""
    r = server.client(decode_responses=True)
    flock = Flock(server.client())
    a = flock.acquire("lim", 5000, limit=2, owner="a")
    b = flock.acquire("lim", 5000, limit=2)
    assert a is not None and b is not None
    before = r.execute_command("FLOCK.HOLDERS", "lim")
    for kw in (dict(limit=3), dict(shared=True), dict(limit=3, bound=True)):
        # redis-py's ResponseError with the server's text (not a FlockError): once, and with a
        # wait (the key is full, so a BLOCK path would wait) at once rather than after it.
        with pytest.raises(redis.ResponseError, match="limit mismatch: lim admits 2 shared holders") \
                as caught:
            flock.acquire("lim", 5000, **kw)
        assert not isinstance(caught.value, FlockError)
        t0 = time.monotonic()
        with pytest.raises(redis.ResponseError, match="limit mismatch"):
            with flock.lock("lim", 5000, wait_ms=SOON_S * 1000, **kw):
                pass
        assert time.monotonic() - t0 < SOON_S / 2
    # An exclusive request on a limited key is no mismatch: it waits its turn (None at once).
    assert flock.acquire("lim", 5000) is None
    # The owner holding a permit asks again in another mode: the server's error.
    # (From another Flock: this one refuses a second lease of owner "a" itself, rule 11.)
    other = Flock(server.client())
    with pytest.raises(redis.ResponseError, match="owner already holds a permit grant of lim"):
        other.acquire("lim", 5000, owner="a")
    with pytest.raises(redis.ResponseError, match="owner already holds a permit grant of lim"):
        other.acquire("lim", 5000, owner="a", shared=True, wait_ms=1000)
    with pytest.raises(LockBusyError):
        flock.acquire("lim", 5000, owner="a")
    # Nothing changed: same holders, both leases live.
    assert r.execute_command("FLOCK.HOLDERS", "lim")[0][:2] == before[0][:2]
    assert len(r.execute_command("FLOCK.HOLDERS", "lim")) == 2
    assert not a.lost and not b.lost and a.check() > 0 and b.check() > 0
    assert kv(r.execute_command("FLOCK.INFO", "lim"))["waiters"] == 0
    a.release()
    b.release()

    s = flock.acquire("sh", 5000, shared=True, owner="s")
    with pytest.raises(redis.ResponseError, match="limit mismatch: sh admits any number of shared"):
        flock.acquire("sh", 5000, limit=2)
    with pytest.raises(redis.ResponseError, match="owner already holds a shared grant of sh"):
        other.acquire("sh", 5000, owner="s")
    s.release()
    # A shared request on an exclusively held key is busy, not an error.
    x = flock.acquire("ex", 5000)
    assert flock.acquire("ex", 5000, shared=True) is None
    with pytest.raises(LockBusyError):
        with flock.lock("ex", 5000, limit=4):
            pass
    x.release()
    # LIMIT out of the server's range is its error; below 1 the client refuses it itself.
    with pytest.raises(redis.ResponseError, match="invalid limit"):
        flock.acquire("big", 5000, limit=10**6)
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError):
            flock.acquire("big", 5000, limit=bad)
    assert r.exists("lim", "sh", "ex", "big") == 0


def test_a_bound_lease_whose_connection_is_killed_is_lost_and_frees_the_lock(server):
    """Scenario 8.1, 9.2 of docs/CLIENTS.md."""
    admin = server.client(decode_responses=True)
    flock = Flock(server.client(client_name="bound-lease"))
    # 3 s: the next renewal (a third) plus 1 s of slack on a loaded machine, still well before
    # the grant could have expired by itself
    ttl = 3000
    closed = int(flock_info(server)["flock_bound_closed"])
    got: dict = {}
    with pytest.raises(LockLostError):
        with flock.lock("bd", ttl, bound=True) as lease:
            assert lease.bound
            # the lease's own connection, checked out of the pool (the pool may also have
            # lent one to rule 9's watch, whose last command is FLOCK.WATCH)
            mine = [c for c in admin.client_list() if c.get("name") == "bound-lease"
                    and c.get("cmd") in ("flock.acquire", "flock.renew")]
            assert len(mine) == 1, mine
            conn_id = mine[0]["id"]
            # The watchdog renews on that connection (rule 8).
            wait_until(lambda: [c for c in admin.client_list()
                                if c["id"] == conn_id and c["cmd"] == "flock.renew"],
                       "a renewal on the bound connection")
            t = waiting(Flock(server.client()), "bd", 10_000, got)
            wait_until(lambda: server.blocked_clients() == 1, "a waiter")
            t0 = time.monotonic()
            assert admin.execute_command("CLIENT", "KILL", "ID", conn_id) == 1
            # Reported as lost at its next renewal at the latest (a third of the ttl).
            assert lease.wait_lost(ttl / 3 + 1000), "the loss was not noticed in time"
            noticed_ms = (time.monotonic() - t0) * 1000
            assert lease.lost_reason in ("closed", "gone"), lease.lost_reason
            assert lease.remaining_ms() == 0
            with pytest.raises(LockLostError):
                lease.ensure()
            # The server ended the grant when the connection closed: the waiter has the lock.
            t.join(SOON_S)
            assert got.get("lease") is not None, got
            assert (got["at"] - t0) * 1000 < ttl / 2
    assert noticed_ms <= ttl / 3 + 1000
    assert got["lease"].token > lease.token
    assert admin.execute_command("FLOCK.CHECK", "bd", lease.token) == 0
    assert int(flock_info(server)["flock_bound_closed"]) == closed + 1
    assert lease.release() is False  # idempotent, and still lost
    assert got["lease"].release() is True
    # The pool works on (the dead connection was given back disconnected).
    again = flock.acquire("bd", 1000, bound=True)
    assert again is not None and again.release() is True


def test_a_bound_lease_renews_and_releases_on_its_own_connection(server):
    """Scenario 8.1 of docs/CLIENTS.md."""
    admin = server.client(decode_responses=True)
    flock = Flock(server.client(client_name="bound-own"))
    # 600 ms (renewed every 200 ms): 300 ms left too little for a late renewal
    with flock.lock("bo", 600, bound=True) as lease:
        # three ttls, kept alive by renewals on the bound connection
        wait_until(lambda: int(flock_info(server)["flock_renewals"]) >= 9, "nine renewals")
        assert not lease.lost and lease.check() > 0
        other = flock.acquire("bo2", 5000)  # the pool's other connection, in parallel
        assert other is not None and other.release() is True
        assert int(flock_info(server)["flock_bound_grants"]) == 1
    assert not lease.lost
    assert admin.exists("bo") == 0 and int(flock_info(server)["flock_bound_grants"]) == 0
    assert int(flock_info(server)["flock_bound_closed"]) == 0


def test_a_bound_scoped_lock_is_freed_at_once_when_its_process_dies(server):
    """Scenario 8.1 of docs/CLIENTS.md."""
    ttl = 30_000
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")]))
    holder = subprocess.Popen([sys.executable, str(HERE / "bound_holder.py"), str(server.port),
                               "bp", str(ttl)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env)
    try:
        line = holder.stdout.readline().split()
        assert line[:1] == ["token"] and line[2:] == ["bound", "True"], line
        token = int(line[1])
        flock = Flock(server.client())
        assert flock.acquire("bp", 5000) is None
        got: dict = {}
        t = waiting(flock, "bp", 5000, got)
        wait_until(lambda: server.blocked_clients() == 1, "a waiter")
        t0 = time.monotonic()
        holder.kill()  # SIGKILL inside the with block: no release is ever sent
        holder.wait(SOON_S)
        t.join(SOON_S)
        lease = got.get("lease")
        assert lease is not None, got
        waited = got["at"] - t0
        # Granted within moments of the death, not at the end of the 30 s lease.
        assert waited < 5.0, f"the waiter got the lock {waited:.3f} s after the holder died"
        assert lease.token > token
        assert int(flock_info(server)["flock_bound_closed"]) == 1
        assert lease.release() is True
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_readers_waiting_behind_a_writer_are_granted_together(server):
    """Scenario 8.2, 5.1 of docs/CLIENTS.md."""
    r = server.client(decode_responses=True)
    flock = Flock(server.client())
    writer = flock.acquire("rg", 10_000)
    got = [{} for _ in range(3)]
    threads = []
    for i in range(3):
        threads.append(waiting(flock, "rg", 900, got[i], shared=True))
        wait_until(lambda: server.blocked_clients() == i + 1, f"reader {i} waits")
    assert writer.release() is True
    for t in threads:
        t.join(SOON_S)
    readers = [g.get("lease") for g in got]
    assert all(lease is not None for lease in readers), got
    tokens = [lease.token for lease in readers]
    # granted in the order they waited, each after the writer's token, all at once
    assert tokens == sorted(tokens) and tokens[0] > writer.token
    assert [h[:2] for h in r.execute_command("FLOCK.HOLDERS", "rg")] == \
        [[lease.owner, lease.token] for lease in readers]
    # each was renewed at once after its wait (rule 1), and the watchdogs go on
    base = int(flock_info(server)["flock_renewals"])
    wait_until(lambda: int(flock_info(server)["flock_renewals"]) >= base + 6,
               "two renewals per reader")
    assert not any(lease.lost for lease in readers)
    for lease in readers:
        assert lease.release() is True
    assert r.exists("rg") == 0


def blocked_acquirers(admin, name):
    return [c for c in admin.client_list() if c.get("name") == name
            and c.get("cmd") == "flock.acquire" and "b" in c.get("flags", "")]


def test_a_bound_wait_survives_a_killed_connection_and_its_grant_is_bound_to_the_new_one(server):
    """Scenario 8.1 of docs/CLIENTS.md."""
    admin = server.client(decode_responses=True)
    flock = Flock(server.client(client_name="bound-waiter"))
    holder = Flock(server.client()).acquire("bwk", 20_000)
    got: dict = {}
    t = waiting(flock, "bwk", 3000, got, bound=True)
    first = wait_until(lambda: blocked_acquirers(admin, "bound-waiter"), "the bound wait")
    assert admin.execute_command("CLIENT", "KILL", "ID", first[0]["id"]) == 1
    second = wait_until(lambda: [c for c in blocked_acquirers(admin, "bound-waiter")
                                 if c["id"] != first[0]["id"]], "the wait on a new connection")
    assert t.is_alive()
    assert holder.release() is True
    t.join(SOON_S)
    lease = got.get("lease")
    assert lease is not None and lease.bound and not lease.lost, got
    assert int(flock_info(server)["flock_bound_grants"]) == 1
    # The grant lives on the connection that waited for it: killing that one ends it.
    assert admin.execute_command("CLIENT", "KILL", "ID", second[0]["id"]) == 1
    wait_until(lambda: admin.execute_command("FLOCK.CHECK", "bwk", lease.token) == 0,
               "the bound grant ends with its connection")
    # at its next renewal (a third of the ttl), with slack for a loaded machine; the reason
    # shows it was the connection, not the local deadline
    assert lease.wait_lost(3000 / 3 + 1000)
    assert lease.lost_reason in ("closed", "gone"), lease.lost_reason
    assert lease.release() is False


def test_a_bound_lease_whose_connection_dies_during_its_release_is_lost_at_once(server):
    """Scenario 8.1 of docs/CLIENTS.md."""
    admin = server.client(decode_responses=True)
    flock = Flock(server.client(client_name="bound-rel"))
    ttl = 6000
    lease = flock.acquire("brl", ttl, bound=True, renew=False)
    # the lease's own connection (the pool may also have lent one to rule 9's watch, whose
    # last command is FLOCK.WATCH)
    [mine] = [c for c in admin.client_list() if c.get("name") == "bound-rel"
              and c.get("cmd") == "flock.acquire"]
    got: dict = {}

    def release():
        got["ok"] = lease.release()
        got["at"] = time.monotonic()

    admin.execute_command("CLIENT", "PAUSE", 5000, "WRITE")  # the RELEASE waits in the server
    try:
        t = threading.Thread(target=release, daemon=True)
        t.start()
        wait_until(lambda: [c for c in admin.client_list() if c["id"] == mine["id"]
                            and c["cmd"] == "flock.release" and "b" in c["flags"]],
                   "the RELEASE held by the pause")
        t0 = time.monotonic()
        assert admin.execute_command("CLIENT", "KILL", "ID", mine["id"]) == 1
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
    t.join(SOON_S)
    # The grant ended with its connection (as on expiry): not a clean release, and at once.
    assert got.get("ok") is False, got
    assert got["at"] - t0 < ttl / 3000
    assert lease.lost and lease.lost_reason == "closed"
    wait_until(lambda: admin.execute_command("FLOCK.CHECK", "brl", lease.token) == 0,
               "the bound grant ends with its connection")
