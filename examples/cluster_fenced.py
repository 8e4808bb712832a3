#!/usr/bin/env python3
"""flock on Redis Cluster with redis-py's RedisCluster client.

A lock and the data it guards share a slot through a hash tag ({order:42}:lock and
{order:42}:data), so FLOCK.FENCED can check the token and write in one step on the node that
owns both. A FENCED write to a key in another slot is refused with CROSSSLOT.

Usage: python3 examples/cluster_fenced.py --port 7000 [--host 127.0.0.1]
(any node of the cluster; every node must have the flock module loaded)
"""
import argparse
import sys

from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException, ResponseError


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=7000)
    a = ap.parse_args()
    rc = RedisCluster(host=a.host, port=a.port, decode_responses=True)
    lock, data = "{order:42}:lock", "{order:42}:data"
    print(f"slot of {lock}: {rc.keyslot(lock)}, of {data}: {rc.keyslot(data)}")
    print(f"node serving them: {rc.get_node_from_key(lock).name}")

    token = rc.execute_command("FLOCK.ACQUIRE", lock, "worker-1", 30000)
    print(f"FLOCK.ACQUIRE {lock} worker-1 30000 -> {token}")
    if not isinstance(token, int) or token <= 0:
        sys.exit(f"expected a token, got {token!r}")

    r = rc.execute_command("FLOCK.FENCED", lock, token, "SET", data, "paid")
    print(f"FLOCK.FENCED {lock} {token} SET {data} paid -> {r}")
    if r not in ("OK", True):
        sys.exit(f"fenced write refused: {r!r}")
    if rc.get(data) != "paid":
        sys.exit("the fenced write did not land")

    # redis-py reads FENCED's key positions (COMMAND GETKEYS: the lock and the inner keys) and
    # refuses keys in different slots before sending; a client that sends anyway gets
    # CROSSSLOT from the server.
    try:
        rc.execute_command("FLOCK.FENCED", lock, token, "SET", "order:43:data", "x")
        sys.exit("a FENCED write to a key in another slot was accepted")
    except (RedisClusterException, ResponseError) as e:
        print(f"FLOCK.FENCED with a key in another slot -> refused: {e}")
        if "slot" not in str(e).lower():
            sys.exit(f"unexpected error: {e}")
    node = rc.get_node_from_key(lock)
    try:
        rc.execute_command("FLOCK.FENCED", lock, token, "SET", "order:43:data", "x", target_nodes=node)
        sys.exit("the server accepted a FENCED write to a key in another slot")
    except ResponseError as e:
        print(f"sent to {node.name} anyway -> server error: {e}")
        # redis-py strips the error code; the text is Redis's CROSSSLOT message.
        if "same slot" not in str(e):
            sys.exit(f"expected CROSSSLOT, got: {e}")
    if rc.exists("order:43:data"):
        sys.exit("the refused write landed")

    stale = token - 1
    try:
        rc.execute_command("FLOCK.FENCED", lock, stale, "SET", data, "stale")
        sys.exit("a stale token wrote")
    except ResponseError as e:
        print(f"FLOCK.FENCED with a stale token -> error: {e}")

    released = rc.execute_command("FLOCK.RELEASE", lock, "worker-1")
    print(f"FLOCK.RELEASE {lock} worker-1 -> {released}")
    if released != 1:
        sys.exit("release failed")
    rc.delete(data)
    print("OK: routed by key, fenced write in the lock's slot, other slots refused.")


if __name__ == "__main__":
    main()
