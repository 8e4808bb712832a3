#!/usr/bin/env python3
"""Hand-off latency and the cost of ACQUIRE/RELEASE with many waiters.

Starts its own redis-server (REDIS_SERVER, FLOCK_MODULE) on a free loopback port and prints:
  1. hand-off latency: time from sending FLOCK.RELEASE until the blocked waiter has its token
     (client-side, loopback, a waiter thread with its own connection), p50/p99/max;
  2. INFO commandstats usec_per_call of FLOCK.ACQUIRE and FLOCK.RELEASE on a key with 1 waiter
     and with 10,000 waiters (each waiter a real blocked connection).

Usage: benches/waiters.py [--handoffs 2000] [--waiters 10000]
"""
import argparse
import os
import resource
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time

import redis

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_server(extra=()):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="flock-bench-")
    module = os.environ.get("FLOCK_MODULE", os.path.join(ROOT, "target/release/libredis_flock.so"))
    server = os.environ.get("REDIS_SERVER", "redis-server")
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--dir", tmp, "--save", "",
         "--appendonly", "no", "--maxclients", str(hard - 100), "--loadmodule", module, *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = redis.Redis(port=port)
    for _ in range(100):
        try:
            r.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    return proc, port, tmp


def blocked(r):
    return int(r.info("clients")["blocked_clients"])


def wait_blocked(r, n, timeout=60):
    deadline = time.time() + timeout
    while blocked(r) != n:
        if time.time() > deadline:
            raise SystemExit(f"expected {n} blocked clients, have {blocked(r)}")
        time.sleep(0.0005)


def handoff_latency(port, rounds):
    r = redis.Redis(port=port)
    waiter = redis.Redis(port=port)
    lat = []
    for i in range(rounds):
        owner = f"h{i}"
        r.execute_command("FLOCK.ACQUIRE", "lk", owner, 10000)
        got = {}

        def wait():
            got["token"] = waiter.execute_command("FLOCK.ACQUIRE", "lk", f"w{i}", 10000, "BLOCK", 0)
            got["t"] = time.perf_counter()

        th = threading.Thread(target=wait)
        th.start()
        wait_blocked(r, 1)
        t0 = time.perf_counter()
        assert r.execute_command("FLOCK.RELEASE", "lk", owner) == 1
        th.join()
        assert got["token"] is not None
        lat.append((got["t"] - t0) * 1e6)
        r.execute_command("FLOCK.RELEASE", "lk", f"w{i}")
    lat.sort()
    return lat


def raw_waiter(port, key, owners):
    """A connection that pipelines one blocking ACQUIRE per owner: after each grant, Redis
    runs the next one, which queues the connection again."""
    s = socket.create_connection(("127.0.0.1", port))
    out = b""
    for owner in owners:
        parts = [b"FLOCK.ACQUIRE", key.encode(), owner.encode(), b"600000", b"BLOCK", b"0"]
        out += b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)
    s.sendall(out)
    return s


def usec(r, cmd):
    stats = r.info("commandstats").get(f"cmdstat_{cmd}")
    return float(stats["usec_per_call"]) if stats else float("nan")


def info_of(r, key):
    info = r.execute_command("FLOCK.INFO", key)
    if isinstance(info, list):
        info = dict(zip(info[::2], info[1::2]))
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in info.items()}


def cost_with_waiters(port, n_waiters, calls):
    """usec_per_call of ACQUIRE/RELEASE on free keys, ACQUIRE on the waited key (nil), and
    RELEASE that hands the waited key to the next of `n_waiters` waiters."""
    r = redis.Redis(port=port)
    r.flushall()
    r.execute_command("FLOCK.ACQUIRE", "busy", "holder", 600000)
    per_waiter = calls // n_waiters + 2
    socks = []
    for i in range(n_waiters):
        socks.append(raw_waiter(port, "busy", [f"w{i}-{j % 2}" for j in range(per_waiter)]))
        if i % 1000 == 999:
            wait_blocked(r, i + 1)
    wait_blocked(r, n_waiters)
    assert int(info_of(r, "busy")["waiters"]) == n_waiters
    r.config_resetstat()
    pipe = r.pipeline(transaction=False)
    for i in range(calls):
        pipe.execute_command("FLOCK.ACQUIRE", f"k{i}", "me", 60000)
    pipe.execute()
    acq_free = usec(r, "flock.acquire")
    for i in range(calls):
        pipe.execute_command("FLOCK.RELEASE", f"k{i}", "me")
    pipe.execute()
    rel_free = usec(r, "flock.release")
    r.config_resetstat()
    for i in range(calls):
        pipe.execute_command("FLOCK.ACQUIRE", "busy", "newcomer", 60000)
    pipe.execute()
    acq_busy = usec(r, "flock.acquire")
    r.config_resetstat()
    for i in range(calls):
        owner = info_of(r, "busy")["owner"]
        assert r.execute_command("FLOCK.RELEASE", "busy", owner) == 1, "hand-off release failed"
        wait_blocked(r, n_waiters)
    assert int(info_of(r, "busy")["waiters"]) == n_waiters
    rel_handoff = usec(r, "flock.release")
    for s in socks:
        s.close()
    wait_blocked(r, 0)
    return acq_free, rel_free, acq_busy, rel_handoff


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--handoffs", type=int, default=2000)
    ap.add_argument("--waiters", type=int, default=10000)
    ap.add_argument("--calls", type=int, default=5000)
    a = ap.parse_args()
    proc, port, tmp = start_server()
    try:
        lat = handoff_latency(port, a.handoffs)
        p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]
        print(f"hand-off latency RELEASE -> waiter's reply, {len(lat)} hand-offs, loopback, "
              f"client-side: p50 {p(0.50):.0f} us, p99 {p(0.99):.0f} us, max {lat[-1]:.0f} us, "
              f"mean {statistics.mean(lat):.0f} us")
        print(f"{'waiters on the key':>20} {'ACQUIRE free key':>18} {'RELEASE free key':>18} "
              f"{'ACQUIRE busy key':>18} {'RELEASE hand-off':>18}   (usec_per_call)")
        for n in (1, a.waiters):
            row = cost_with_waiters(port, n, a.calls)
            print(f"{n:>20} " + " ".join(f"{v:>18.2f}" for v in row))
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
