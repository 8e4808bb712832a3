#!/usr/bin/env python3
"""flock on Redis Cluster with redis-py's RedisCluster client and the flock client.

A lock and the data it guards share a slot through a hash tag ({order:42}:lock and
{order:42}:data), so FLOCK.FENCED can check the token and write in one step on the node that
owns both. A FENCED write to a key in another slot is refused with CROSSSLOT.

Usage: python3 examples/cluster_fenced.py --port 7000 [--host 127.0.0.1]
(any node of the cluster; every node must have the flock module loaded; the flock client comes
from clients/python: `pip install ./clients/python`, or found next to this file)
"""
import argparse
import os
import sys

from redis.cluster import RedisCluster
from redis.exceptions import ResponseError

try:
    from redis_flock import FencedError, Flock
except ImportError:  # not installed: the client in this repository
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "..", "clients", "python", "src"))
    from redis_flock import FencedError, Flock


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=7000)
    a = ap.parse_args()
    rc = RedisCluster(host=a.host, port=a.port, decode_responses=True)
    flock = Flock(rc)
    lock, data = "{order:42}:lock", "{order:42}:data"
    print(f"slot of {lock}: {rc.keyslot(lock)}, of {data}: {rc.keyslot(data)}")
    print(f"node serving them: {rc.get_node_from_key(lock).name}")

    with flock.lock(lock, 30000) as lease:
        print(f"flock.lock({lock!r}, 30000) -> token {lease.token} (owner {lease.owner})")

        r = lease.fenced("SET", data, "paid")
        print(f"lease.fenced(SET {data} paid) -> {r}")
        if r != "OK":
            sys.exit(f"fenced write refused: {r!r}")
        if rc.get(data) != "paid":
            sys.exit("the fenced write did not land")

        # The inner command's keys must be in the lock's slot: the node refuses anything else.
        try:
            lease.fenced("SET", "order:43:data", "x")
            sys.exit("the server accepted a FENCED write to a key in another slot")
        except ResponseError as e:
            print(f"lease.fenced(SET order:43:data x) -> server error: {e}")
            # redis-py strips the error code; the text is Redis's CROSSSLOT message.
            if "same slot" not in str(e):
                sys.exit(f"expected CROSSSLOT, got: {e}")
        if rc.exists("order:43:data"):
            sys.exit("the refused write landed")
        if lease.lost:
            sys.exit(f"a CROSSSLOT refusal must not lose the lease: {lease.lost_reason}")

        # A token that is not the live grant's writes nothing.
        stale = lease.token - 1
        try:
            rc.execute_command("FLOCK.FENCED", lock, stale, "SET", data, "stale")
            sys.exit("a stale token wrote")
        except ResponseError as e:
            print(f"FLOCK.FENCED {lock} {stale} SET {data} stale -> error: {e}")
        print(f"lease.check() -> {lease.check()} ms left")
    print(f"left the with block: released (FLOCK.INFO {lock} -> "
          f"{rc.execute_command('FLOCK.INFO', lock)})")
    if rc.execute_command("FLOCK.INFO", lock) is not None:
        sys.exit("release failed")

    # A revoked lease: its next fenced write is refused and the lease is lost.
    lease = flock.acquire(lock, 30000)
    flock.revoke(lock)
    try:
        lease.fenced("SET", data, "after revoke")
        sys.exit("a revoked lease wrote")
    except FencedError as e:
        print(f"after FLOCK.REVOKE: lease.fenced(...) -> FencedError: {e}; lease.lost = {lease.lost}")
    print(f"lease.release() -> {lease.release()}")
    if rc.get(data) != "paid":
        sys.exit("the data changed")
    rc.delete(data)
    print("OK: routed by key, fenced write in the lock's slot, other slots and stale tokens refused.")


if __name__ == "__main__":
    main()
