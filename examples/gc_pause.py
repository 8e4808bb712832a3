#!/usr/bin/env python3
"""The GC-pause story, with two real clients and a real pause.

Client A (a child process) takes the lock {order:42}:lock with a 500 ms lease (the flock client,
clients/python, renews it in the background) and is about to write {order:42}:data. Then it
freezes (we send it SIGSTOP, as a long GC pause, a swapped-out VM or a stalled disk would), its
watchdog with it, until its lease is over. Client B, waiting for the lock with BLOCK, gets it (a
larger token) and writes through FLOCK.FENCED. A wakes up (SIGCONT): its own clock tells it at
once that the lease is gone (lease.lost, lease.ensure()), but say it writes anyway with its old
token: FLOCK.FENCED refuses, nothing runs, and the data keeps B's value.

Needs a Redis with the flock module (`make run`) and redis-py (`pip install redis`); the flock
client comes from clients/python (`pip install ./clients/python`, or found next to this file):
    python3 examples/gc_pause.py [--host 127.0.0.1] [--port 6379]
Exits 0 when everything happened as told, 1 otherwise.
"""
import argparse
import os
import select
import signal
import sys
import time

try:
    import redis
except ImportError:
    sys.exit("this example needs redis-py: python3 -m pip install redis")
try:
    from redis_flock import FencedError, Flock, LockLostError
except ImportError:  # not installed: the client in this repository
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "..", "clients", "python", "src"))
    from redis_flock import FencedError, Flock, LockLostError

LOCK = "{order:42}:lock"  # the hash tag keeps lock and data in one slot (Redis Cluster)
DATA = "{order:42}:data"
LEASE_MS = 500
DEADLINE_S = 30.0  # generous bound for anything that "should happen soon" on a loaded box


class Failure(Exception):
    pass


def expect(cond, msg):
    if not cond:
        raise Failure(msg)


def say(who, msg):
    print(f"[{who}] {msg}", flush=True)


def connect(host, port):
    return redis.Redis(host=host, port=port, decode_responses=True,
                       socket_timeout=DEADLINE_S, socket_connect_timeout=DEADLINE_S)


# --- messages between the two processes: one line per message over a pipe ---------------

def send(fd, msg):
    os.write(fd, (msg + "\n").encode())


def recv(fd, buf, what):
    """Next line from fd (buf carries bytes already read); waits at most DEADLINE_S."""
    end = time.monotonic() + DEADLINE_S
    while b"\n" not in buf[0]:
        left = end - time.monotonic()
        if left <= 0:
            raise Failure(f"timed out waiting for {what}")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                raise Failure(f"pipe closed while waiting for {what}")
            buf[0] += chunk
    line, buf[0] = buf[0].split(b"\n", 1)
    return line.decode()


# --- client A: the child process -------------------------------------------------------------

def client_a(host, port, to_parent, from_parent):
    """Runs in the child. Reports to the parent over a pipe; returns the exit code."""
    buf = [b""]
    try:
        flock = Flock(connect(host, port))
        lease = flock.acquire(LOCK, LEASE_MS, owner="client-A")
        expect(lease is not None, "A: flock.acquire should grant the free lock")
        token = lease.token
        say("A", f"flock.acquire({LOCK!r}, {LEASE_MS}) -> token {token}   (A holds the lock; "
                 f"its watchdog renews it every {LEASE_MS // 3} ms)")
        say("A", f"computing the new order state; about to write {DATA} with token {token} ...")
        send(to_parent, f"token {token}")
        # A is now "between the check and the write": here it gets frozen. The line it reads
        # next only makes the demo deterministic (A writes after it is woken, not before).
        go = recv(from_parent, buf, "the parent's go")
        expect(go == "go", f"A: unexpected message {go!r}")
        say("A", "... back. (From A's point of view no time has passed.)")
        try:
            lease.ensure(min_ms=50)
            say("A", "lease.ensure(min_ms=50) -> passed")
            send(to_parent, "ensure passed")
        except LockLostError as e:
            say("A", f"lease.ensure(min_ms=50) -> LockLostError: {e}   (by A's own clock, no "
                     f"round trip; lease.lost = {lease.lost})")
            send(to_parent, "ensure failed")
        say("A", "A writes anyway, with its old token:")
        try:
            reply = lease.fenced("SET", DATA, "written by A (stale)")
            say("A", f"lease.fenced(SET {DATA} \"written by A (stale)\") -> {reply!r}")
            send(to_parent, f"accepted {reply}")
        except FencedError as e:
            say("A", f"lease.fenced(SET {DATA} \"written by A (stale)\") -> FencedError: {e}")
            send(to_parent, f"refused {e}")
        released = lease.release()
        say("A", f"lease.release() -> {released}   (A no longer held anything)")
        send(to_parent, f"released {int(released)}")
        return 0
    except Exception as e:  # report everything: the parent decides
        print(f"[A] FAILED: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        try:
            send(to_parent, f"error {type(e).__name__}: {e}")
        except OSError:
            pass
        return 1


# --- the parent: orchestrates, and is client B -----------------------------------------------

def process_state(pid):
    """The one-letter state of a process from /proc (T = stopped), or None when unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def reap(pid, wait_s):
    """A's exit status once it exited, waiting at most wait_s seconds (None: forever);
    None when it is still running."""
    if wait_s is None:
        return os.waitpid(pid, 0)[1]
    end = time.monotonic() + wait_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() >= end:
            return None
        time.sleep(0.01)


def wait_stopped(pid):
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        wpid, status = os.waitpid(pid, os.WUNTRACED | os.WNOHANG)
        if wpid == pid:
            expect(os.WIFSTOPPED(status), f"A exited instead of stopping (status {status})")
            return
        time.sleep(0.01)
    raise Failure("A did not stop after SIGSTOP")


def story(host, port, pid, from_a, to_a):
    buf = [b""]
    r = connect(host, port)
    flock = Flock(r)

    msg = recv(from_a, buf, "A's token")
    expect(msg.startswith("token "), f"A did not get the lock: {msg}")
    t_a = int(msg.split()[1])

    os.kill(pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    wait_stopped(pid)
    state = process_state(pid)
    say("-", f"SIGSTOP -> A (pid {pid}) is frozen, its watchdog too"
             + (f" (state {state})" if state else ""))

    left = r.execute_command("FLOCK.CHECK", LOCK, t_a)
    say("-", f"FLOCK.CHECK {LOCK} {t_a} -> {left}   "
             + ("(A's lease still runs)" if left else "(already over: a slow machine)"))

    say("B", f"flock.lock({LOCK!r}, 30000, wait_ms={int(DEADLINE_S * 1000)}): waits with BLOCK ...")
    with flock.lock(LOCK, 30000, wait_ms=DEADLINE_S * 1000, owner="client-B") as lease_b:
        t_b = lease_b.token
        say("B", f"... granted when A's lease ran out: token {t_b}")
        left = r.execute_command("FLOCK.CHECK", LOCK, t_a)
        say("-", f"FLOCK.CHECK {LOCK} {t_a} -> {left}   (A's grant is over; A is still frozen)")
        expect(left == 0, f"A's grant should be over, CHECK says {left!r}")
        expect(t_b > t_a, f"B's token {t_b} should be greater than A's {t_a}")
        say("B", f"token {t_b} > {t_a}: B's grant is newer than A's")
        reply = lease_b.fenced("SET", DATA, "written by B")
        say("B", f"lease.fenced(SET {DATA} \"written by B\") -> {reply!r}")
        expect(reply == "OK", f"B's fenced write should be accepted, got {reply!r}")

        send(to_a, "go")  # A reads it once it runs again
        say("-", f"SIGCONT -> A wakes up after {(time.monotonic() - stopped_at) * 1000:.0f} ms frozen")
        os.kill(pid, signal.SIGCONT)

        msg = recv(from_a, buf, "A's ensure() result")
        expect(not msg.startswith("error"), f"A failed: {msg}")
        expect(msg == "ensure failed", f"A's ensure() should fail at once from its clock: {msg}")
        msg = recv(from_a, buf, "A's write result")
        expect(not msg.startswith("error"), f"A failed: {msg}")
        expect(msg.startswith("refused "), f"A's stale write should be refused, but: {msg}")
        err = msg[len("refused "):]
        expect(err.startswith("FENCED"), f"A's stale write should get a FENCED error, got: {err}")
        expect(str(t_a) in err, f"the FENCED error should name A's token {t_a}: {err}")
        msg = recv(from_a, buf, "A's release result")
        expect(msg == "released 0", f"A's release should find nothing to release, got: {msg}")

        value = r.get(DATA)
        say("B", f"GET {DATA} -> {value!r}")
        expect(value == "written by B", f"{DATA} should hold B's value, holds {value!r}")
        expect(lease_b.check() > 0, "B's grant should still be live")
        expect(not lease_b.lost, f"B's lease should not be lost: {lease_b.lost_reason}")
    say("B", f"left the with block: released (FLOCK.INFO {LOCK} -> "
             f"{r.execute_command('FLOCK.INFO', LOCK)})")
    expect(r.execute_command("FLOCK.INFO", LOCK) is None, "B's lock should be released")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=6379)
    args = p.parse_args()

    # Before the story: the server is there, has flock, and the example's keys are clean.
    try:
        r = connect(args.host, args.port)
        r.ping()
    except redis.ConnectionError as e:
        print(f"FAILED: cannot reach Redis at {args.host}:{args.port} ({e}); "
              "start one with flock loaded: make run", file=sys.stderr)
        return 1
    try:
        if r.execute_command("FLOCK.INFO", LOCK) is not None:
            r.execute_command("FLOCK.REVOKE", LOCK)
            print(f"(a lock {LOCK} was left over from an earlier run: revoked it)")
    except redis.ResponseError as e:
        print(f"FAILED: is the flock module loaded? FLOCK.INFO: {e}", file=sys.stderr)
        return 1
    r.delete(DATA)
    r.close()

    print(f"The GC-pause story on {args.host}:{args.port}: lock {LOCK}, data {DATA}, "
          f"A's lease {LEASE_MS} ms", flush=True)
    a_to_parent_r, a_to_parent_w = os.pipe()
    parent_to_a_r, parent_to_a_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # client A
        os.close(a_to_parent_r)
        os.close(parent_to_a_w)
        code = 1
        try:
            code = client_a(args.host, args.port, a_to_parent_w, parent_to_a_r)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(a_to_parent_w)
    os.close(parent_to_a_r)

    ok = False
    try:
        story(args.host, args.port, pid, a_to_parent_r, parent_to_a_w)
        ok = True
    except Failure as e:
        print(f"FAILED: {e}", file=sys.stderr, flush=True)
    except redis.RedisError as e:
        print(f"FAILED: unexpected Redis error: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    finally:
        # Never leave A behind, stopped or not: wait for it (when all went well), else kill it.
        status = reap(pid, DEADLINE_S if ok else 0.0)
        if status is None:
            os.kill(pid, signal.SIGKILL)  # works on a stopped process too
            status = reap(pid, None)
            if ok:
                print("FAILED: A did not exit", file=sys.stderr)
                ok = False
        if ok and not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
            print(f"FAILED: A exited with status {status}", file=sys.stderr)
            ok = False
    if ok:
        print("OK: the stale holder's write was refused by the server; the data holds B's value.")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
