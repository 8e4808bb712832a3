#!/usr/bin/env python3
"""What the client adds to a lock: ``with flock.lock(...)`` + release against the raw commands
(FLOCK.ACQUIRE + FLOCK.RELEASE key owner token through redis-py) on the same connection pool.

    python clients/python/bench.py --port 6379 [--host 127.0.0.1] [--iterations 5000]
    python clients/python/bench.py --port 6379 --replicas 1 [--iterations 2000]

Needs a server with the flock module. The variants alternate lock by lock (raw, renew=False,
watchdog, then the other way round), so that a burst of load on the machine hits them alike; prints per-lock median and p99
of each and the client's added latency (variant minus raw). Target: under 150 us per lock.

--replicas n: the cost of a durable grant (rule 10) instead: the server must be a master with
at least n replicas online; the variants are raw, raw with WAIT n pipelined behind the
ACQUIRE (the floor: what the WAIT costs without any client), lock(renew=False) and
lock(renew=False, replicas=n) (ACQUIRE + WAIT n pipelined, then RELEASE), and the last lines
say what the durable grant costs over the plain lease, and the WAIT alone over the raw pair.

--loss n: rule 9 instead: how long after the server ends a grant its lease says it is lost,
over n REVOKEs (from another connection) and n CLIENT KILLs of a BOUND lease's connection, at
ttl --ttl (default 30 s: far from any renewal), for the sync and the asyncio client: median,
p99 and max from sending the REVOKE / KILL to wait_lost() returning (includes that command's
round trip). Each lease is held 100 ms first, so that it is watched.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

import redis

import redis.asyncio
import redis_flock.aio
from redis_flock import Flock

# The durable bench's floor: the raw pair with WAIT pipelined behind the ACQUIRE.
RAW_WAIT = "ACQUIRE+WAIT (raw)"


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=6379)
    p.add_argument("--iterations", type=int, default=5000, help="locks per variant (>= 2000)")
    p.add_argument("--ttl", type=int, default=30_000)
    p.add_argument("--replicas", type=int, default=0,
                   help="measure durable grants with replicas=n against the plain lease")
    p.add_argument("--loss", type=int, default=0,
                   help="measure rule 9 instead: loss-to-signal delay over n REVOKEs and n kills")
    args = p.parse_args()
    if args.loss:
        return bench_loss(args.host, args.port, args.loss, args.ttl)
    if args.iterations < 2000:
        p.error("--iterations must be at least 2000")
    r = redis.Redis(host=args.host, port=args.port)
    r.ping()
    if args.replicas:
        online = sum(1 for k, v in r.info("replication").items()
                     if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online")
        if online < args.replicas:
            p.error(f"--replicas {args.replicas}: {args.host}:{args.port} has {online} online")
    flock = Flock(r)
    key, ttl = "bench:flock-client", args.ttl
    owner = "bench-raw-owner-0123456789abcdef"
    pc = time.perf_counter

    def raw():
        t = pc()
        token = r.execute_command("FLOCK.ACQUIRE", key, owner, ttl)
        r.execute_command("FLOCK.RELEASE", key, owner, token)
        return pc() - t

    def lock_no_renew():
        t = pc()
        with flock.lock(key, ttl, renew=False):
            pass
        return pc() - t

    def lock_watchdog():
        t = pc()
        with flock.lock(key, ttl):
            pass
        return pc() - t

    def lock_durable():
        t = pc()
        with flock.lock(key, ttl, renew=False, replicas=args.replicas):
            pass
        return pc() - t

    def raw_wait():
        # The floor: what a durable grant sends, without the client (ACQUIRE + WAIT pipelined).
        t = pc()
        pipe = r.pipeline(transaction=False)
        pipe.execute_command("FLOCK.ACQUIRE", key, owner, ttl)
        pipe.execute_command("WAIT", args.replicas, 1000)
        token, acked = pipe.execute()
        if acked < args.replicas:
            raise RuntimeError(f"WAIT {args.replicas}: {acked} acknowledged")
        r.execute_command("FLOCK.RELEASE", key, owner, token)
        return pc() - t

    variants = {"raw ACQUIRE+RELEASE": raw, "lock(renew=False)": lock_no_renew,
                "lock() with watchdog": lock_watchdog}
    if args.replicas:
        variants = {"raw ACQUIRE+RELEASE": raw, RAW_WAIT: raw_wait,
                    "lock(renew=False)": lock_no_renew,
                    f"lock(replicas={args.replicas})": lock_durable}
    times = {name: [] for name in variants}
    for fn in variants.values():  # warm-up
        for _ in range(200):
            fn()
    order = list(variants.items())
    for i in range(args.iterations):
        for name, fn in (order if i % 2 == 0 else reversed(order)):
            times[name].append(fn())
    if r.exists(key):
        print("FAILED: the lock key is still there after the last release", file=sys.stderr)
        return 1

    atimes = asyncio.run(bench_aio(args.host, args.port, key, ttl, owner, args.iterations,
                                   args.replicas))
    print(f"flock Python client overhead on {args.host}:{args.port}, {args.iterations} locks "
          f"per variant (redis-py {redis.__version__}, Python {sys.version.split()[0]})")
    worst = max(table("sync: redis_flock.Flock over redis.Redis", times),
                table("asyncio: redis_flock.aio.Flock over redis.asyncio.Redis", atimes))
    if args.replicas:
        for title, ts in (("sync", times), ("asyncio", atimes)):
            plain, durable = ts["lock(renew=False)"], ts[f"lock(replicas={args.replicas})"]
            print(f"{title}: a durable grant (replicas={args.replicas}) costs "
                  f"{(statistics.median(durable) - statistics.median(plain)) * 1e6:+.1f} us "
                  f"median, {(pct(durable, 0.99) - pct(plain, 0.99)) * 1e6:+.1f} us p99 over "
                  "the plain lease (acquire + release)")
            raw_plain, raw_durable = ts["raw ACQUIRE+RELEASE"], ts[RAW_WAIT]
            print(f"{title}: the WAIT alone (raw commands, no client) adds "
                  f"{(statistics.median(raw_durable) - statistics.median(raw_plain)) * 1e6:+.1f} us "
                  f"median, {(pct(raw_durable, 0.99) - pct(raw_plain, 0.99)) * 1e6:+.1f} us p99: "
                  "the floor on this machine")
        return 0
    verdict = "within" if worst < 150 else "ABOVE"
    print(f"added latency per lock (median, worst variant): {worst:.1f} us: {verdict} the 150 us target")
    return 0


def table(title, times):
    """Prints one table; returns the worst added median (us)."""
    us = 1e6
    raw = next(xs for name, xs in times.items() if name.startswith("raw"))
    base_med, base_p99 = statistics.median(raw), pct(raw, 0.99)
    print(title)
    print(f"  {'variant':<24}{'median us':>11}{'p99 us':>10}{'added median':>15}{'added p99':>12}")
    worst = 0.0
    for name, xs in times.items():
        med, p99 = statistics.median(xs), pct(xs, 0.99)
        added = "" if name.startswith("raw") else f"{(med - base_med) * us:+.1f}"
        added99 = "" if name.startswith("raw") else f"{(p99 - base_p99) * us:+.1f}"
        if not name.startswith("raw"):
            worst = max(worst, (med - base_med) * us)
        print(f"  {name:<24}{med * us:>11.1f}{p99 * us:>10.1f}{added:>15}{added99:>12}")
    return worst


async def bench_aio(host, port, key, ttl, owner, iterations, replicas=0):
    r = redis.asyncio.Redis(host=host, port=port)
    flock = redis_flock.aio.Flock(r)
    pc = time.perf_counter

    async def raw():
        t = pc()
        token = await r.execute_command("FLOCK.ACQUIRE", key, owner, ttl)
        await r.execute_command("FLOCK.RELEASE", key, owner, token)
        return pc() - t

    async def lock_no_renew():
        t = pc()
        async with flock.lock(key, ttl, renew=False):
            pass
        return pc() - t

    async def lock_watchdog():
        t = pc()
        async with flock.lock(key, ttl):
            pass
        return pc() - t

    async def lock_durable():
        t = pc()
        async with flock.lock(key, ttl, renew=False, replicas=replicas):
            pass
        return pc() - t

    async def raw_wait():
        t = pc()
        pipe = r.pipeline(transaction=False)
        pipe.execute_command("FLOCK.ACQUIRE", key, owner, ttl)
        pipe.execute_command("WAIT", replicas, 1000)
        token, acked = await pipe.execute()
        if acked < replicas:
            raise RuntimeError(f"WAIT {replicas}: {acked} acknowledged")
        await r.execute_command("FLOCK.RELEASE", key, owner, token)
        return pc() - t

    variants = {"raw ACQUIRE+RELEASE": raw, "lock(renew=False)": lock_no_renew,
                "lock() with watchdog": lock_watchdog}
    if replicas:
        variants = {"raw ACQUIRE+RELEASE": raw, RAW_WAIT: raw_wait,
                    "lock(renew=False)": lock_no_renew,
                    f"lock(replicas={replicas})": lock_durable}
    times = {name: [] for name in variants}
    for fn in variants.values():
        for _ in range(200):
            await fn()
    order = list(variants.items())
    for i in range(iterations):
        for name, fn in (order if i % 2 == 0 else reversed(order)):
            times[name].append(await fn())
    await r.aclose()
    return times


HOLD_S = 0.1  # a lease is watched once 10 ms old (redis_flock._watch.WATCH_AFTER_S)


def bound_conn_id(admin, name):
    mine = [c for c in admin.client_list() if c.get("name") == name
            and c["cmd"] in ("flock.acquire", "flock.renew")]
    assert len(mine) == 1, mine
    return mine[0]["id"]


def bench_loss(host, port, n, ttl):
    admin = redis.Redis(host=host, port=port, decode_responses=True)
    flock = Flock(redis.Redis(host=host, port=port, client_name="bench-loss"))
    pc = time.perf_counter
    res = {"sync REVOKE": [], "sync CLIENT KILL (bound)": []}
    for i in range(n):
        key = f"bench:loss:{i}"
        lease = flock.acquire(key, ttl)
        time.sleep(HOLD_S)
        t = pc()
        admin.execute_command("FLOCK.REVOKE", key)
        assert lease.wait_lost(5000) and lease.lost_reason == "revoked", (i, lease.lost_reason)
        res["sync REVOKE"].append(pc() - t)
    for i in range(n):
        key = f"bench:loss:b{i}"
        lease = flock.acquire(key, ttl, bound=True)
        cid = bound_conn_id(admin, "bench-loss")
        time.sleep(HOLD_S)
        t = pc()
        admin.execute_command("CLIENT", "KILL", "ID", cid)
        assert lease.wait_lost(5000) and lease.lost_reason == "closed", lease.lost_reason
        res["sync CLIENT KILL (bound)"].append(pc() - t)
    res.update(asyncio.run(bench_loss_aio(host, port, n, ttl)))
    print(f"rule 9: loss-to-signal delay at ttl {ttl} ms, {n} of each, {host}:{port} "
          f"(redis-py {redis.__version__}, Python {sys.version.split()[0]})")
    print(f"{'':28} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    worst = 0.0
    for name, xs in res.items():
        p99 = pct(xs, 0.99) * 1e3
        worst = max(worst, p99)
        print(f"{name:28} {statistics.median(xs) * 1e3:8.2f} {p99:8.2f} {max(xs) * 1e3:8.2f}")
    print(f"worst p99: {worst:.2f} ms: {'within' if worst < 50 else 'ABOVE'} the 50 ms of rule 9")
    return 0


async def bench_loss_aio(host, port, n, ttl):
    admin = redis.asyncio.Redis(host=host, port=port, decode_responses=True)
    flock = redis_flock.aio.Flock(redis.asyncio.Redis(host=host, port=port,
                                                      client_name="bench-loss-aio"))
    pc = time.perf_counter
    res = {"asyncio REVOKE": [], "asyncio CLIENT KILL (bound)": []}
    for i in range(n):
        key = f"bench:loss:a{i}"
        lease = await flock.acquire(key, ttl)
        await asyncio.sleep(HOLD_S)
        t = pc()
        await admin.execute_command("FLOCK.REVOKE", key)
        assert await lease.wait_lost(5000) and lease.lost_reason == "revoked"
        res["asyncio REVOKE"].append(pc() - t)
    for i in range(n):
        key = f"bench:loss:ab{i}"
        lease = await flock.acquire(key, ttl, bound=True)
        mine = [c for c in await admin.client_list() if c.get("name") == "bench-loss-aio"
                and c["cmd"] in ("flock.acquire", "flock.renew")]
        assert len(mine) == 1, mine
        await asyncio.sleep(HOLD_S)
        t = pc()
        await admin.execute_command("CLIENT", "KILL", "ID", mine[0]["id"])
        assert await lease.wait_lost(5000) and lease.lost_reason == "closed", lease.lost_reason
        res["asyncio CLIENT KILL (bound)"].append(pc() - t)
    await admin.aclose()
    return res


if __name__ == "__main__":
    sys.exit(main())
