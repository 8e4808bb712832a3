"""A holder process for test_a_holder_process_paused_past_its_lease: takes the lock, prints its
token, then obeys one command per line on stdin (ensure, write, quit), answering on stdout."""
import sys
import time

import redis

from redis_flock import FencedError, Flock, LockLostError


def main() -> int:
    port, key, data, ttl = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    flock = Flock(redis.Redis(host="127.0.0.1", port=port, socket_timeout=30))
    lease = flock.acquire(key, ttl)
    print(f"token {lease.token}", flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "ensure":
            t0 = time.monotonic()
            try:
                lease.ensure(1)
                print("ensure-passed", flush=True)
            except LockLostError as e:
                ms = (time.monotonic() - t0) * 1000
                print(f"ensure-failed {type(e).__name__} {ms:.3f} lost={lease.lost}", flush=True)
        elif cmd == "write":
            try:
                lease.fenced("SET", data, "written by A (stale)")
                print("write-accepted", flush=True)
            except FencedError as e:
                print(f"write-refused FencedError {e}", flush=True)
        elif cmd == "quit":
            lease.release()
            return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
