#!/usr/bin/env python3
"""Sizing a lock's TTL from what the server measured: FLOCK.STATS.

A pool of workers takes `job:<n>` locks (one lock class, `job:#`) and holds each for a critical
section whose length follows a known distribution: mostly 5-25 ms, one in twenty 40-60 ms. After
a few seconds the script reads `FLOCK.STATS GET job:#` and prints the server's hold-time p99
and its TTL advice ([5x, 10x] the p99) next to the p99 the workers really slept. It exits 0
when the server's p99 is within 10% (plus 3 ms of scheduling noise) of the true one and the
advice is 5 and 10 times it, 1 otherwise.

Usage: python3 examples/ttl_advice.py [--port 6379] [--host 127.0.0.1] [--seconds 3]
"""
import argparse
import os
import random
import sys
import threading
import time

from redis import Redis

try:
    from redis_flock import Flock
except ImportError:  # not installed: the client in this repository
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "..", "clients", "python", "src"))
    from redis_flock import Flock


def section_ms(rng: random.Random) -> float:
    """The critical section's length: the distribution the advice should discover."""
    if rng.random() < 0.05:
        return rng.uniform(40, 60)
    return rng.uniform(5, 25)


def as_dict(reply):
    """FLOCK.STATS maps: dicts in RESP3, flat lists in RESP2."""
    if isinstance(reply, dict):
        return reply
    return {reply[i]: reply[i + 1] for i in range(0, len(reply), 2)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=6379)
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args()
    r = Redis(host=a.host, port=a.port, decode_responses=True)
    flock = Flock(r)
    r.execute_command("FLOCK.STATS", "RESET")
    held = []  # the sections the workers really ran, measured around the lock
    lock = threading.Lock()
    stop = time.monotonic() + a.seconds

    def worker(w: int) -> None:
        rng = random.Random(w)
        n = 0
        while time.monotonic() < stop:
            n += 1
            with flock.lock(f"job:{w}-{n}", ttl_ms=5_000, renew=False):
                t0 = time.monotonic()
                time.sleep(section_ms(rng) / 1000)
                took = (time.monotonic() - t0) * 1000
            with lock:
                held.append(took)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    held.sort()
    true_p99 = held[min(len(held) - 1, int(0.99 * len(held)))]
    stats = as_dict(r.execute_command("FLOCK.STATS", "GET", "job:#"))
    job = as_dict(as_dict(stats["classes"])["job:#"])
    hold = as_dict(job["hold_ms"])
    advice = job["ttl_advice_ms"]
    print(f"{len(held)} critical sections by 8 workers in {a.seconds:.0f} s, lock class job:#")
    print(f"  server: grants {job['grants']}, released {job['released']}, expired {job['expired']}")
    print(f"  hold time p50 {hold['p50']} ms, p99 {hold['p99']} ms, max {hold['max']} ms (server)")
    print(f"  true p99 of the sections: {true_p99:.1f} ms (measured by the workers)")
    print(f"  ttl advice: {advice} ms, i.e. 5x to 10x the hold p99")
    ok = (
        job["released"] == len(held)
        and abs(int(hold["p99"]) - true_p99) <= true_p99 * 0.10 + 3
        and advice is not None
        and [int(x) for x in advice] == [5 * int(hold["p99"]), 10 * int(hold["p99"])]
    )
    print("as told" if ok else "NOT as told")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
