"""The peers' worst client-side lock bugs as regression tests, each named after its report
(docs/CLIENTS.md names them), against a real server with the module. What the client sent is
read from the server's MONITOR, so the tests prove what was and was not sent. The sync client
and the asyncio one share these rules' code (_core); the asyncio suites cover its own paths."""
from __future__ import annotations

import threading
import time

import pytest

from redis_flock import Flock, LockLostError

from conftest import SOON_S, Monitor, wait_until


def after(commands, prefix):
    """The commands after the first that starts with prefix."""
    i = next(i for i, c in enumerate(commands) if c.startswith(prefix))
    return commands[i + 1:]


def test_redisson_7272_no_renewal_after_release_or_loss(server):
    admin = server.client()
    mon = Monitor(server)
    try:
        flock = Flock(server.client())
        # 600 ms: renewed every 200 ms
        lease = flock.acquire("pb:rel", 600)
        wait_until(lambda: mon.count("FLOCK.RENEW pb:rel ") >= 2, "two renewals")
        assert lease.release() is True
        revoked = flock.acquire("pb:rev", 600)
        wait_until(lambda: mon.count("FLOCK.RENEW pb:rev ") >= 1, "a renewal")
        assert admin.execute_command("FLOCK.REVOKE", "pb:rev") == 1
        assert revoked.wait_lost(SOON_S * 1000) is True
        # a marker lease renews five times meanwhile: renewals of the other two would show
        marker = flock.acquire("pb:marker", 600)
        wait_until(lambda: mon.count("FLOCK.RENEW pb:marker ") >= 5, "five renewals")
        marker.release()
    finally:
        mon.close()
    cmds = list(mon.commands)
    late = [c for c in after(cmds, "FLOCK.RELEASE pb:rel ") if c.startswith("FLOCK.RENEW pb:rel ")]
    assert not late, late
    # after the REVOKE at most the one RENEW that answered nil
    late = [c for c in after(cmds, "FLOCK.REVOKE pb:rev") if c.startswith("FLOCK.RENEW pb:rev ")]
    assert len(late) <= 1, late
    assert revoked.lost and not lease.lost


def test_etcd_22082_a_retried_release_never_ends_a_newer_grant_of_the_same_owner(server):
    admin = server.client()
    flock = Flock(server.client())
    old = flock.acquire("pb:22082", 10_000, owner="same", renew=False)
    # the first RELEASE ran on the server (its reply lost), then the owner was granted again
    assert admin.execute_command("FLOCK.RELEASE", "pb:22082", "same") == 1
    newer = admin.execute_command("FLOCK.ACQUIRE", "pb:22082", "same", 10_000)
    assert newer > old.token
    mon = Monitor(server)
    try:
        old.release()  # the retry
    finally:
        mon.close()
    assert admin.execute_command("FLOCK.CHECK", "pb:22082", newer) > 0, "the newer grant ended"
    # the client may already know the grant is gone (rule 9's watch told it) and send
    # nothing; whatever RELEASE it sent names its own token
    releases = [c for c in mon.commands if c.startswith("FLOCK.RELEASE pb:22082 ")]
    for c in releases:
        assert c.split() == ["FLOCK.RELEASE", "pb:22082", "same", str(old.token)], c


def test_etcd_11456_a_waiter_granted_after_its_ttl_holds_a_whole_lease(server):
    admin = server.client()
    flock = Flock(server.client())
    admin.execute_command("FLOCK.ACQUIRE", "pb:11456", "holder", 30_000)
    got = {}
    mon = Monitor(server)
    try:
        t = threading.Thread(target=lambda: got.update(
            lease=flock.acquire("pb:11456", 1000, wait_ms=SOON_S * 1000, renew=False)))
        t.start()
        wait_until(lambda: server.blocked_clients() == 1, "the waiter blocks on the server")
        time.sleep(2.0)  # twice the ttl in the queue
        admin.execute_command("FLOCK.RELEASE", "pb:11456", "holder")
        t.join(SOON_S)
        lease = got["lease"]
        assert lease is not None and not lease.lost
        left = admin.execute_command("FLOCK.CHECK", "pb:11456", lease.token)
        assert left > 0, "the grant after the wait is live on the server"
        assert lease.remaining_ms() <= left
        assert lease.release() is True
    finally:
        mon.close()
    renews = [c for c in mon.commands if c.startswith("FLOCK.RENEW pb:11456 ")]
    assert len(renews) == 1, mon.commands
    assert renews[0].split()[3:] == ["1000", str(lease.token)], renews[0]


def test_redis_semaphore_175_a_renewal_after_expiry_takes_nothing(server):
    admin = server.client()
    flock = Flock(server.client())
    mon = Monitor(server)
    try:
        # ran out everywhere: renew() is refused
        lease = flock.acquire("pb:175", 200, renew=False)
        time.sleep(0.5)
        with pytest.raises(LockLostError):
            lease.renew()
        assert lease.lost and admin.exists("pb:175") == 0
        # ended on the server while the local deadline is far: the RENEW answers nil
        lease2 = flock.acquire("pb:175b", 20_000, renew=False)
        admin.execute_command("FLOCK.REVOKE", "pb:175b")
        with pytest.raises(LockLostError):
            lease2.renew()
        assert lease2.lost and admin.exists("pb:175b") == 0
        # the key is free for the next owner at once
        other = flock.acquire("pb:175", 1000)
        assert other is not None and other.release() is True
    finally:
        mon.close()
    cmds = list(mon.commands)
    assert len([c for c in cmds if c.startswith("FLOCK.ACQUIRE pb:175 ")]) == 2, cmds
    assert len([c for c in cmds if c.startswith("FLOCK.ACQUIRE pb:175b ")]) == 1, cmds
    renews = [c for c in cmds if c.startswith("FLOCK.RENEW pb:175")]
    assert all(len(c.split()) == 5 and c.startswith("FLOCK.RENEW pb:175b ") for c in renews), \
        renews


def test_redisson_2515_5698_the_watchdog_survives_connection_errors(server):
    admin = server.client(decode_responses=True)
    flock = Flock(server.client(client_name="pb-holder"))
    mon = Monitor(server)
    try:
        # 900 ms (renewed every 300 ms): each renewal after a kill also reconnects
        lease = flock.acquire("pb:5698", 900)
        for round_ in range(3):
            killed = 0
            for c in admin.client_list():
                if c.get("name") == "pb-holder":
                    killed += admin.execute_command("CLIENT", "KILL", "ID", c["id"])
            assert killed >= 1, round_
            base = mon.count("FLOCK.RENEW pb:5698 ")
            wait_until(lambda: mon.count("FLOCK.RENEW pb:5698 ") >= base + 2 or lease.lost,
                       "renewals after a kill")
            assert not lease.lost, lease.lost_reason
        time.sleep(2.7)  # three ttls
        assert not lease.lost, lease.lost_reason
        assert admin.execute_command("FLOCK.CHECK", "pb:5698", lease.token) > 0
        assert lease.release() is True
    finally:
        mon.close()


def test_redisson_4698_a_renewal_that_fails_for_good_is_loud(server):
    # The server stops answering (SIGSTOP) for longer than the lease: the watchdog's RENEW
    # cannot land, and the lease is marked lost by its local deadline, not silently kept.
    flock = Flock(server.client(socket_timeout=5))
    lease = flock.acquire("pb:4698", 900)
    server.stop_process()
    try:
        t0 = time.monotonic()
        assert lease.wait_lost(SOON_S * 1000) is True
        assert time.monotonic() - t0 < 5, "lost only when the socket timed out"
        assert lease.lost
    finally:
        server.cont_process()
