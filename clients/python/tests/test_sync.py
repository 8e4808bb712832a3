"""The sync client against a real redis-server with the flock module."""
from __future__ import annotations

import gc
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

from redis_flock import (
    FencedError,
    Flock,
    FlockError,
    LeaseTooShortError,
    LockBusyError,
    LockLostError,
)

from conftest import SOON_S, Monitor, wait_until

HERE = Path(__file__).resolve().parent


def process_state(pid) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def renewals(server) -> int:
    return int(server.info("flock")["flock_renewals"])


def test_scoped_lock_writes_with_its_token_and_releases(server):
    """Scenario 3.1, 6.1 of docs/CLIENTS.md."""
    r = server.client(decode_responses=True)
    flock = Flock(r)
    with flock.lock("orders:1:lock", 10_000) as lease:
        assert isinstance(lease.token, int) and lease.token > 0
        assert len(lease.owner) == 32  # 128 random bits, hex
        info = r.execute_command("FLOCK.INFO", "orders:1:lock")
        info = dict(zip(info[::2], info[1::2])) if isinstance(info, list) else info
        assert info["owner"] == lease.owner and info["token"] == lease.token
        assert lease.fenced("SET", "orders:1:data", "paid") == "OK"
        assert 9_000 < lease.remaining_ms() <= 10_000
        assert lease.check() > 0
        assert not lease.lost
    assert r.get("orders:1:data") == "paid"
    assert r.exists("orders:1:lock") == 0
    assert not lease.lost and lease.remaining_ms() == 0
    with pytest.raises(LockLostError):
        lease.ensure()


def test_owners_are_random_unless_given(server):
    """Scenario 7.1 of docs/CLIENTS.md."""
    flock = Flock(server.client())
    a = flock.acquire("k:a", 5000, renew=False)
    b = flock.acquire("k:b", 5000, renew=False)
    assert a.owner != b.owner
    c = flock.acquire("k:c", 5000, owner="supervised-1", renew=False)
    assert c.owner == "supervised-1"
    # A supervisor acts from anywhere with the owner's name (rule 7).
    other = Flock(server.client())
    assert other.release("k:c", "supervised-1", c.token) is True
    assert other.revoke("k:a", a.owner) == 1
    assert other.revoke("k:b") == 1
    assert a.release() is False and a.lost


def test_busy_lock_none_or_lock_busy_error(server):
    """5.2: not granted in time: None from acquire, LockBusyError from lock (the holder is
    another Flock: a wait on this thread's own lease would not wait, rule 11)."""
    flock = Flock(server.client())
    holder = Flock(server.client()).acquire("busy", 10_000)
    assert flock.acquire("busy", 1000) is None
    with pytest.raises(LockBusyError):
        with flock.lock("busy", 1000):
            pass
    t0 = time.monotonic()
    with pytest.raises(LockBusyError):
        with flock.lock("busy", 1000, wait_ms=200):
            pass
    assert time.monotonic() - t0 >= 0.2
    assert issubclass(LockBusyError, FlockError)
    assert holder.release() is True


def test_watchdog_keeps_a_600ms_lease_alive_for_3s(server):
    """Scenario 2.1 of docs/CLIENTS.md."""
    r = server.client()
    flock = Flock(r)
    # 600 ms (renewed every 200 ms): a renewal may come 400 ms late on a loaded machine before
    # the lease runs out; 3 s are still five ttls.
    with flock.lock("wd", 600) as lease:
        end = time.monotonic() + 3.0
        checks = 0
        while time.monotonic() < end:
            left = r.execute_command("FLOCK.CHECK", "wd", lease.token)
            assert left > 0, f"the server says the lease ended after {checks} checks"
            assert not lease.lost, lease.lost_reason
            checks += 1
            time.sleep(0.05)
        assert lease.remaining_ms() > 0
    assert r.exists("wd") == 0
    assert renewals(server) >= 5  # a RENEW per third of the ttl (200 ms), for 3 s


def test_watchdog_stops_on_release(server):
    """Scenario 2.1, 4.1 of docs/CLIENTS.md."""
    mon = Monitor(server)
    try:
        flock = Flock(server.client())
        # 600 ms (renewed every 200 ms): a 150 ms lease was lost on a loaded machine before
        # its release, or the marker's before its five renewals.
        lease = flock.acquire("wd-stop", 600)
        wait_until(lambda: mon.count("FLOCK.RENEW wd-stop") >= 2, "two renewals")
        assert lease.release() is True
        wait_until(lambda: mon.count("FLOCK.RELEASE wd-stop") == 1, "the release")
        # Another lease with the same ttl renews five times: had the released lease's watchdog
        # gone on, its RENEWs would be among them.
        marker = flock.acquire("marker", 600)
        wait_until(lambda: mon.count("FLOCK.RENEW marker") >= 5, "five renewals of another lease")
        marker.release()
    finally:
        mon.close()
    after = mon.commands[mon.index("FLOCK.RELEASE wd-stop"):]
    assert not [c for c in after if c.startswith("FLOCK.RENEW wd-stop")], after
    assert not lease.lost


def client_running(admin, name, cmd):
    """The connections named name whose current (or last) command is cmd."""
    return [c for c in admin.client_list() if c.get("name") == name and c.get("cmd") == cmd]


def test_release_waits_for_a_renewal_under_way(server):
    """Scenario 4.1 of docs/CLIENTS.md."""
    # CLIENT PAUSE WRITE holds the watchdog's RENEW on the server; release() is called while it
    # waits there. The RELEASE is not sent until the RENEW is answered, so no RENEW of the lease
    # comes after it, and the renewal that raced the release reports no loss.
    admin = server.client(decode_responses=True)
    flock = Flock(server.client(client_name="rw-holder"))
    mon = Monitor(server)
    try:
        # 6 s: renewed at 2 s; the held RENEW may wait up to the local deadline (4 s after it
        # went out), far more than finding it and the 0.5 s watched below on a loaded machine
        lease = flock.acquire("rw", 6000)
        got = {}
        t = threading.Thread(target=lambda: got.update(ok=lease.release()))
        admin.execute_command("CLIENT", "PAUSE", 10_000, "WRITE")
        try:
            wait_until(lambda: holder_clients(admin, "rw-holder", "flock.renew"),
                       "a renewal held by the pause")
            t.start()
            # Before the fix, the RELEASE went out at once on another connection (and was held
            # by the pause too, next to the RENEW). Now release() waits for the RENEW's reply.
            end = time.monotonic() + 0.5
            while time.monotonic() < end:
                assert not client_running(admin, "rw-holder", "flock.release"), \
                    "RELEASE sent while a RENEW of the lease was still unanswered"
                assert t.is_alive() and "ok" not in got
                time.sleep(0.01)
        finally:
            admin.execute_command("CLIENT", "UNPAUSE")
        t.join(SOON_S)
        assert got.get("ok") is True
        wait_until(lambda: mon.count("FLOCK.RELEASE rw") == 1, "the release")
    finally:
        mon.close()
    after = mon.commands[mon.index("FLOCK.RELEASE rw"):]
    assert not [c for c in after if c.startswith("FLOCK.RENEW rw")], after
    assert mon.count("FLOCK.RENEW rw") >= 1  # the held one, before the RELEASE
    assert admin.exists("rw") == 0
    assert not lease.lost, lease.lost_reason
    assert lease.wait_lost(0) is False


def test_release_waits_no_longer_than_the_socket_timeout_for_a_stuck_renewal(server):
    """Scenario 4.1 of docs/CLIENTS.md."""
    # A renewal stuck before its RENEW reaches the server (a hook holds it, as a dead
    # connection would): release() waits for it at most the client's socket_timeout (0.5 s,
    # well before the lease's local deadline), then releases. The RENEW, sent late after all,
    # is answered nil, and that is not a loss: the lease was released.
    mon = Monitor(server)
    try:
        flock = Flock(server.client(socket_timeout=0.5))
        lease = flock.acquire("rs", 6000)  # renewed at 2 s; local deadline 4 s after that
        inside, gate, replies = threading.Event(), threading.Event(), []
        real = lease._io_call

        def held(*args, **kw):
            if args[0] == "FLOCK.RENEW" and not inside.is_set():
                inside.set()
                gate.wait(SOON_S)
                replies.append(real(*args, **kw))
                return replies[-1]
            return real(*args, **kw)

        lease._io_call = held
        assert inside.wait(SOON_S), "the watchdog's renewal"
        start = time.monotonic()
        try:
            assert lease.release() is True
            took = time.monotonic() - start
        finally:
            gate.set()
        assert 0.45 <= took < 3.0, took  # waited for the renewal, up to the socket_timeout
        wait_until(lambda: replies, "the late RENEW's reply")
        wait_until(lambda: not lease._io.locked(), "the renewal's end")
        assert replies == [None]  # the grant was gone: nil
        mon.settle()
        assert mon.count("FLOCK.RENEW rs") == 1
        assert not lease.lost, lease.lost_reason
        assert lease.wait_lost(0) is False
        assert lease.release() is True  # idempotent
    finally:
        mon.close()
    assert mon.index("FLOCK.RELEASE rs") < mon.index("FLOCK.RENEW rs")


def test_an_unreleased_lease_dropped_by_the_program_stops_and_releases(server):
    """Scenario 11.6 of docs/CLIENTS.md."""
    r = server.client()
    lease = Flock(server.client()).acquire("dropped", 30_000)
    assert r.exists("dropped") == 1
    del lease
    gc.collect()
    wait_until(lambda: r.exists("dropped") == 0, "the background release of a dropped lease")


def test_revoke_is_noticed_within_a_third_of_the_ttl(server):
    """3.1, 9.1: REVOKE heard (by the WATCH, rule 9, long before the renewal's nil would)."""
    ttl = 3000
    admin = server.client()
    flock = Flock(server.client())
    with pytest.raises(LockLostError):
        with flock.lock("rv", ttl) as lease:
            assert not lease.wait_lost(10)
            assert admin.execute_command("FLOCK.REVOKE", "rv") == 1
            t0 = time.monotonic()
            # a third of the ttl is the renewal period; plus a round trip and scheduling slack
            assert lease.wait_lost(ttl / 3 + 1000), "the loss was not noticed in time"
            noticed_ms = (time.monotonic() - t0) * 1000
            assert lease.lost and noticed_ms <= ttl / 3 + 1000
            assert noticed_ms < 500, noticed_ms
            assert lease.lost_reason in ("revoked", "gone"), lease.lost_reason
            with pytest.raises(LockLostError):
                lease.ensure()
            assert lease.remaining_ms() == 0
    assert lease.lost


def test_the_blocks_own_error_passes_through_a_lost_lease(server):
    """Scenario 3.1 of docs/CLIENTS.md."""
    admin = server.client()
    flock = Flock(server.client())
    with pytest.raises(KeyError) as caught:
        with flock.lock("rv2", 600) as lease:
            admin.execute_command("FLOCK.REVOKE", "rv2")
            assert lease.wait_lost(SOON_S * 1000)
            raise KeyError("the block's own")
    assert caught.value.args == ("the block's own",)
    assert lease.lost


def test_stale_fenced_write_raises_fenced_error_and_marks_lost(server):
    """Scenario 6.1, 12.6 of docs/CLIENTS.md."""
    r = server.client(decode_responses=True)
    flock = Flock(r)
    a = flock.acquire("{f}:lock", 10_000)
    assert a.fenced("SET", "{f}:data", "a") == "OK"
    flock.revoke("{f}:lock")
    b = flock.acquire("{f}:lock", 10_000)
    assert b.token > a.token
    with pytest.raises(FencedError) as caught:
        a.fenced("SET", "{f}:data", "stale")
    assert str(a.token) in str(caught.value)
    assert a.lost and not b.lost
    assert r.get("{f}:data") == "a"
    assert a.release() is False
    assert b.release() is True


def test_ensure_and_lease_too_short(server):
    """Scenario 3.2 of docs/CLIENTS.md."""
    flock = Flock(server.client())
    lease = flock.acquire("short", 1000, renew=False)
    lease.ensure(10)
    with pytest.raises(LeaseTooShortError) as caught:
        lease.ensure(5000)
    assert isinstance(caught.value, LockLostError)
    assert not lease.lost  # ensure changes nothing
    lease.release()


def test_remaining_is_never_above_the_servers_check(server):
    """Scenario 1.1 of docs/CLIENTS.md."""
    admin = server.client()
    flock = Flock(server.client())
    # 100 round trips per lease period: long leases, so that a loaded machine cannot run
    # them out (a 0 from CHECK would fail the test for the wrong reason).
    lease = flock.acquire("rem", 10_000, renew=False)
    for i in range(200):
        if i == 100:
            lease.renew(12_000)
        server_left = admin.execute_command("FLOCK.CHECK", "rem", lease.token)
        local_left = lease.remaining_ms()  # measured after the server's answer
        assert 0 < local_left <= server_left, (i, local_left, server_left)
    lease.release()


def test_client_kill_of_the_watchdog_connection_is_recovered(server):
    """Scenario 2.3 of docs/CLIENTS.md."""
    admin = server.client(decode_responses=True)
    r = server.client(client_name="flock-holder")
    flock = Flock(r)
    kills = 0
    # 900 ms (renewed every 300 ms): each renewal after a kill also reconnects; 600 ms of
    # slack for that on a loaded machine.
    with flock.lock("ck", 900) as lease:
        for round_ in range(6):
            # kill every connection of the holder's client, the watchdog's among them
            for c in admin.client_list():
                if c.get("name") == "flock-holder":
                    kills += admin.execute_command("CLIENT", "KILL", "ID", c["id"])
            # the watchdog renews again (on a new connection) and goes on: two renewals
            # counted from after the kill (counted from before it, renewals that landed before
            # the kill could meet the count)
            want = renewals(server) + 2
            wait_until(lambda: renewals(server) >= want or lease.lost, "renewals after a kill")
            assert not lease.lost, lease.lost_reason
        assert admin.execute_command("FLOCK.CHECK", "ck", lease.token) > 0
    assert kills >= 6
    assert not lease.lost


def holder_clients(admin, name, cmd=None):
    return [c for c in admin.client_list() if c.get("name") == name
            and (cmd is None or (c.get("cmd") == cmd and "b" in c.get("flags", "")))]


def test_a_connection_killed_in_the_middle_of_a_renewal_is_recovered(server):
    """Scenario 2.3 of docs/CLIENTS.md."""
    # CLIENT PAUSE WRITE holds the watchdog's RENEW on the server; its connection is killed
    # while the RENEW waits there, unanswered. The watchdog retries on a new connection.
    admin = server.client(decode_responses=True)
    flock = Flock(server.client(client_name="flock-holder"))
    # 1.8 s: the held RENEW went out a third of the ttl after the last one; the rest (1.2 s)
    # covers finding it in CLIENT LIST, the kill, the unpause and the retry on a loaded machine.
    with flock.lock("ck2", 1800) as lease:
        for _ in range(3):
            admin.execute_command("CLIENT", "PAUSE", 10_000, "WRITE")
            try:
                held = wait_until(lambda: holder_clients(admin, "flock-holder", "flock.renew"),
                                  "a renewal held by the pause")
                for c in held:
                    assert admin.execute_command("CLIENT", "KILL", "ID", c["id"]) == 1
                # counted while no RENEW can run: a renewal that landed before the pause
                # must not pass for the retry
                base = renewals(server)
            finally:
                admin.execute_command("CLIENT", "UNPAUSE")
            wait_until(lambda: renewals(server) > base or lease.lost, "the renewal retried")
            assert not lease.lost, lease.lost_reason
        assert admin.execute_command("FLOCK.CHECK", "ck2", lease.token) > 0
    assert not lease.lost


def test_a_wait_survives_a_killed_connection_and_waits_forever(server):
    """Scenario 5.1 of docs/CLIENTS.md."""
    admin = server.client(decode_responses=True)
    flock = Flock(server.client(client_name="waiter"))
    holder = Flock(server.client()).acquire("wk", 20_000)
    got = {}
    t = threading.Thread(target=lambda: got.update(
        lease=flock.acquire("wk", 5000, wait_ms=math.inf)))
    t.start()
    victim = wait_until(lambda: holder_clients(admin, "waiter", "flock.acquire"), "the wait")
    assert admin.execute_command("CLIENT", "KILL", "ID", victim[0]["id"]) == 1
    # the client waits again on a new connection
    wait_until(lambda: [c for c in holder_clients(admin, "waiter", "flock.acquire")
                        if c["id"] != victim[0]["id"]], "the wait on a new connection")
    assert t.is_alive()
    holder.release()
    t.join(SOON_S)
    lease = got["lease"]
    assert lease is not None and lease.token > holder.token and not lease.lost
    assert lease.release() is True


def test_a_block_wait_longer_than_the_ttl_is_renewed_at_once(server):
    """Scenario 1.3 of docs/CLIENTS.md."""
    flock = Flock(server.client())
    # no watchdog for the holder: none of its RENEWs can land among the counted ones
    holder = flock.acquire("bw", 20_000, renew=False)
    got = {}

    def waiter():
        got["t0"] = time.monotonic()
        # 1 s, less than the 2 s wait below: counted from the BLOCK request it would be long
        # over; counted from the RENEW after the grant, it outlives the two round trips below
        # even when they are slow on a loaded machine (300 ms did not).
        got["lease"] = flock.acquire("bw", 1000, wait_ms=SOON_S * 1000, renew=False)
        got["t1"] = time.monotonic()

    t = threading.Thread(target=waiter)
    t.start()
    wait_until(lambda: server.blocked_clients() == 1, "the waiter blocks on the server")
    wait_until(lambda: time.monotonic() - got["t0"] > 2.0, "two ttls of waiting", step=0.05)
    before = renewals(server)
    holder.release()
    t.join(SOON_S)
    lease = got["lease"]
    assert lease is not None and got["t1"] - got["t0"] > 2.0
    # The grant came 2 ttls after the request was sent: counted from that send it would be
    # over already. Rule 1: it was renewed at once and counts from that RENEW.
    assert renewals(server) == before + 1
    server_left = flock.client.execute_command("FLOCK.CHECK", "bw", lease.token)
    left = lease.remaining_ms()  # measured after the server's answer
    assert 0 < left <= server_left <= 1000 and not lease.lost
    assert lease.release() is True


def test_block_waiting_is_on_the_server_and_first_come_first_served(server):
    """Scenario 5.1 of docs/CLIENTS.md."""
    flock = Flock(server.client())
    holder = flock.acquire("fifo", 20_000)
    order = []
    tokens = []
    errors = []

    def waiter(i):
        try:
            with flock.lock("fifo", 5000, wait_ms=SOON_S * 1000) as lease:
                order.append(i)
                tokens.append(lease.token)
        except Exception as e:  # reported below
            errors.append(e)

    threads = []
    for i in range(4):
        t = threading.Thread(target=waiter, args=(i,))
        t.start()
        threads.append(t)
        wait_until(lambda: server.blocked_clients() == i + 1, f"waiter {i} blocks on the server")
    info = flock.client.execute_command("FLOCK.INFO", "fifo")
    info = dict(zip(info[::2], info[1::2])) if isinstance(info, list) else info
    assert info[b"waiters"] == 4
    assert order == []
    holder.release()
    for t in threads:
        t.join(SOON_S)
    assert not errors, errors
    assert order == [0, 1, 2, 3]
    assert tokens == sorted(tokens) and len(set(tokens)) == 4 and tokens[0] > holder.token


def test_a_wait_does_not_hold_up_other_leases(server):
    """Scenario 8.1 of docs/CLIENTS.md."""
    # One pool for everything: the wait has a connection of its own (rule 8).
    flock = Flock(server.client())
    holder = flock.acquire("w1", 20_000)
    got = {}
    t = threading.Thread(target=lambda: got.update(
        lease=flock.acquire("w1", 1000, wait_ms=SOON_S * 1000)))
    t.start()
    wait_until(lambda: server.blocked_clients() == 1, "the waiter blocks")
    with flock.lock("w2", 600) as other:
        assert other.fenced("SET", "x", "1") in (b"OK", "OK")
        # its watchdog renews (every 200 ms) while the wait goes on: alive for three ttls
        assert not other.wait_lost(1800)
    assert t.is_alive() and server.blocked_clients() == 1
    holder.release()
    t.join(SOON_S)
    assert got["lease"] is not None and got["lease"].release() is True


def test_a_holder_process_paused_past_its_lease(server):
    """1.2:
    A holder process is frozen (SIGSTOP) past its lease, the server too. On SIGCONT, with the
    server still frozen, ensure() fails at once from the holder's own clock (no round trip
    could have answered); once the server runs again, its fenced write is refused."""
    ttl = 500
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")]))
    holder = subprocess.Popen(
        [sys.executable, str(HERE / "holder.py"), str(server.port), "{gc}:lock", "{gc}:data",
         str(ttl)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = holder.stdout.readline().split()
        assert line[0] == "token", line
        token = int(line[1])
        granted_at = time.monotonic()
        holder.send_signal(signal.SIGSTOP)
        server.stop_process()
        # both frozen until well past the lease (by the clock: nothing else can tell)
        wait_until(lambda: time.monotonic() - granted_at > 2 * ttl / 1000, "the lease runs out",
                   step=0.05)
        holder.stdin.write("ensure\n")
        holder.stdin.flush()
        holder.send_signal(signal.SIGCONT)
        reply = holder.stdout.readline().split()
        assert reply[0] == "ensure-failed", reply
        assert reply[1] == "LockLostError"
        # A round trip could not have answered: the server is stopped, and the holder's socket
        # timeout is 30 s. ensure() answered from the holder's own clock.
        assert float(reply[2]) < 1000, f"ensure() took {reply[2]} ms: it must not ask the server"
        assert server.proc.poll() is None and process_state(server.proc.pid) == "T"
        assert reply[3] == "lost=True"
        assert holder.poll() is None
        server.cont_process()
        b = Flock(server.client(decode_responses=True))
        with b.lock("{gc}:lock", 10_000, wait_ms=SOON_S * 1000) as lb:
            assert lb.token > token
            assert lb.fenced("SET", "{gc}:data", "written by B") == "OK"
            holder.stdin.write("write\n")
            holder.stdin.flush()
            reply = holder.stdout.readline().split(maxsplit=1)
            assert reply[0] == "write-refused", reply
            assert reply[1].startswith("FencedError FENCED")
            assert b.client.get("{gc}:data") == "written by B"
        holder.stdin.write("quit\n")
        holder.stdin.flush()
        assert holder.wait(SOON_S) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_reconnecting_client_keeps_working(server):
    """Scenario 2.3 of docs/CLIENTS.md."""
    # The pool's connections are replaced transparently (retries of ACQUIRE / RELEASE).
    admin = server.client()
    r = server.client(client_name="rc")
    flock = Flock(r)
    lease = flock.acquire("rc", 5000, renew=False)
    for c in admin.client_list():
        if c.get("name") == "rc":
            admin.execute_command("CLIENT", "KILL", "ID", c["id"])
    assert lease.release() is True
    assert flock.acquire("rc", 5000, renew=False).release() is True


def test_invalid_arguments(server):
    """Scenario 12.2, 12.5 of docs/CLIENTS.md."""
    flock = Flock(server.client())
    for bad in (0, -1, 1.5, True, "10"):
        with pytest.raises(ValueError):
            flock.acquire("k", bad)
    with pytest.raises(ValueError):
        flock.acquire("k", 1000, wait_ms=-1)
    with pytest.raises(ValueError):
        flock.acquire("k", 1000, shared=True, limit=2)
    with pytest.raises(redis.ResponseError):
        flock.acquire("k", 10**12)  # above flock.max-ttl-ms: the server's own error


def test_the_readme_example_runs(server):
    """Scenario 3.1 of docs/CLIENTS.md."""
    text = (HERE.parent / "README.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    env = dict(os.environ, REDIS_URL=f"redis://127.0.0.1:{server.port}",
               PYTHONPATH=os.pathsep.join([str(HERE.parent / "src"),
                                           os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=SOON_S)
    assert out.returncode == 0, out.stderr
    assert "order 42 is new; we hold token" in out.stdout
    assert out.stdout.strip().endswith("order 42 is paid")


def test_many_short_leases_leave_no_pile_of_timetable_entries(server):
    """Scenario 2.1 of docs/CLIENTS.md."""
    from redis_flock._sync import _watchdog

    flock = Flock(server.client())
    # 1.5 s: the live lease is renewed (every 500 ms) by a thread that competes for the GIL
    # with 6000 round trips of churn; 300 ms leases were lost there on a loaded machine.
    with flock.lock("live", 1500) as live:
        for _ in range(3000):
            with flock.lock("churn", 30_000):
                pass
        # the released leases' entries were dropped; the live lease's was kept: it renews on
        # (the churn's leases are released, so every RENEW counted now is the live one's)
        wait_until(lambda: len(_watchdog._heap) < 1500, "the timetable compacted")
        base = renewals(server)
        wait_until(lambda: renewals(server) >= base + 3 or live.lost,
                   "three renewals of the live lease after the compaction")
        assert not live.lost, live.lost_reason
        assert live.check() > 0
