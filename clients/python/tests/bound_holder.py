"""A holder process for test_a_bound_scoped_lock_is_freed_when_its_process_dies: takes the lock
with bound=True in a `with` block, prints its token and its connection's id, then waits on
stdin inside the block until the test kills it (SIGKILL: no release, no cleanup)."""
import sys

import redis

from redis_flock import Flock


def main() -> int:
    port, key, ttl = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    flock = Flock(redis.Redis(host="127.0.0.1", port=port, socket_timeout=30,
                              client_name="bound-holder"))
    with flock.lock(key, ttl, bound=True) as lease:
        print(f"token {lease.token} bound {lease.bound}", flush=True)
        sys.stdin.readline()  # the test kills this process before it writes anything
        print("not killed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
