#!/usr/bin/env python3
"""Fencing an outside resource: a SQL database refuses a stale lock holder's write.

The lock lives in Redis (flock); the data lives elsewhere, here in a SQLite table. Every
writer passes its fencing token to the database, which stores the largest token it has seen
per row and refuses a write whose token is not larger:

    UPDATE accounts SET balance = ?, fence = ? WHERE id = ? AND fence < ?

Client A takes the lock on account 1 with the flock client (clients/python), checks that its
grant is live, reads the balance and then stalls (a GC pause) past its 1 s lease. Client B,
waiting for the lock, takes it (a larger token) and writes through the database. A wakes up
and writes late with lease.token: Redis is not involved in that write at all, yet the DATABASE
refuses it (0 rows updated), and the balance keeps B's value.

Needs a Redis with the flock module (`make run`) and redis-py (`pip install redis`); the flock
client comes from clients/python (`pip install ./clients/python`, or found next to this file):
    python3 examples/sql_fence.py [--host 127.0.0.1] [--port 6379]
Exits 0 when everything happened as told, 1 otherwise.
"""
import argparse
import os
import sqlite3
import sys
import threading
import time

try:
    import redis
except ImportError:
    sys.exit("this example needs redis-py: python3 -m pip install redis")
try:
    from redis_flock import Flock
except ImportError:  # not installed: the client in this repository
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "..", "clients", "python", "src"))
    from redis_flock import Flock

LOCK = "account:1:lock"
ACCOUNT = 1
LEASE_MS = 1000
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


# --- the outside resource ---------------------------------------------------------------------

def open_db():
    # autocommit: one statement each; B writes from its own thread (never at the same time as A)
    db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    db.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER,"
               " fence INTEGER NOT NULL DEFAULT 0)")
    db.execute("INSERT INTO accounts (id, balance) VALUES (?, ?)", (ACCOUNT, 100))
    return db


def read_balance(db):
    return db.execute("SELECT balance FROM accounts WHERE id = ?", (ACCOUNT,)).fetchone()[0]


def write_balance(db, who, balance, token):
    """The fenced write: the database itself checks the token. True when it took the write."""
    cur = db.execute("UPDATE accounts SET balance = ?, fence = ? WHERE id = ? AND fence < ?",
                     (balance, token, ACCOUNT, token))
    if cur.rowcount == 1:
        say(who, f"UPDATE accounts SET balance = {balance}, fence = {token} "
                 f"WHERE id = {ACCOUNT} AND fence < {token} -> 1 row: written")
        return True
    fence = db.execute("SELECT fence FROM accounts WHERE id = ?", (ACCOUNT,)).fetchone()[0]
    say(who, f"UPDATE accounts SET balance = {balance}, fence = {token} "
             f"WHERE id = {ACCOUNT} AND fence < {token} -> 0 rows: "
             f"refused: stale token (the row's fence is already {fence})")
    return False


def row(db):
    return db.execute("SELECT id, balance, fence FROM accounts WHERE id = ?",
                      (ACCOUNT,)).fetchone()


# --- the story --------------------------------------------------------------------------------

def story(r, db):
    say("db", f"accounts: (id, balance, fence) = {row(db)}")
    flock = Flock(r)

    # Client A: lock, check, read ... and stall. (renew=False: a real pause would stop A's
    # watchdog too; in this one-process demo, A's pause is a sleep, which would not.)
    lease_a = flock.acquire(LOCK, LEASE_MS, owner="client-A", renew=False)
    expect(lease_a is not None, "A: flock.acquire should grant the free lock")
    t_a = lease_a.token
    say("A", f"flock.acquire({LOCK!r}, {LEASE_MS}) -> token {t_a}")
    left = lease_a.check()
    expect(left > 0, f"A's fresh grant should be live, CHECK says {left!r}")
    say("A", f"lease.check() (FLOCK.CHECK {LOCK} {t_a}) -> {left} ms left: all good, go on")
    a_seen = read_balance(db)
    a_new = a_seen + 50
    say("A", f"reads balance {a_seen}, will deposit 50 -> {a_new} ... and stalls (GC pause)")
    paused_at = time.monotonic()

    # Client B (another thread, as it would be another process): waits for the lock with
    # BLOCK, reads, writes through the database.
    b = {}

    def client_b():
        try:
            with flock.lock(LOCK, 30000, wait_ms=DEADLINE_S * 1000, owner="client-B") as lease:
                b["token"] = lease.token
                say("B", f"flock.lock({LOCK!r}, 30000, wait_ms=...) -> granted when A's lease "
                         f"ran out: token {lease.token}   ({lease.token} > {t_a})")
                b["seen"] = read_balance(db)
                b["new"] = b["seen"] - 30
                say("B", f"reads balance {b['seen']}, withdraws 30 -> {b['new']}")
                b["took"] = write_balance(db, "B", b["new"], lease.token)
            say("B", "left the with block: lock released")
        except Exception as e:  # checked below
            b["error"] = e

    tb = threading.Thread(target=client_b)
    tb.start()
    tb.join(DEADLINE_S)
    expect(not tb.is_alive(), f"B did not get the lock within {DEADLINE_S} s")
    expect("error" not in b, f"B failed: {b.get('error')!r}")
    expect(b["token"] > t_a, f"B's token {b['token']} should be greater than A's {t_a}")
    expect(b["seen"] == 100, f"B should read the untouched balance 100, read {b['seen']}")
    expect(b["took"], "B's write with the live token should be taken")
    say("db", f"accounts: (id, balance, fence) = {row(db)}")

    # A wakes up and writes what it computed before the pause, with its token.
    say("A", f"... wakes up after {(time.monotonic() - paused_at) * 1000:.0f} ms "
             f"and writes the balance it computed: {a_new}  (lease.lost = {lease_a.lost}, but "
             f"say A does not look)")
    took = write_balance(db, "A", a_new, lease_a.token)
    expect(not took, "the database should refuse A's write with the stale token")

    balance = read_balance(db)
    say("db", f"accounts: (id, balance, fence) = {row(db)}")
    expect(balance == b["new"], f"the balance should be B's {b['new']}, is {balance}")
    expect(row(db)[2] == b["token"], f"the row's fence should be B's token {b['token']}, "
                                     f"is {row(db)[2]}")

    released = lease_a.release()
    say("A", f"lease.release() (FLOCK.RELEASE {LOCK} client-A {t_a}) -> {released}   "
             "(A held nothing any more)")
    expect(released is False, f"A's release should find nothing to release, got {released!r}")
    expect(r.execute_command("FLOCK.INFO", LOCK) is None, "B's lock should be released")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=6379)
    args = p.parse_args()

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

    print(f"Fencing a SQL table with flock on {args.host}:{args.port}: lock {LOCK}, "
          f"A's lease {LEASE_MS} ms", flush=True)
    db = open_db()
    try:
        story(r, db)
    except Failure as e:
        print(f"FAILED: {e}", file=sys.stderr)
        return 1
    except redis.RedisError as e:
        print(f"FAILED: unexpected Redis error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        db.close()
    print("OK: the database refused the stale holder's write; the balance holds B's value.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
