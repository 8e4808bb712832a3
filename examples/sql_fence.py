#!/usr/bin/env python3
"""Fencing an outside resource: a SQL database refuses a stale lock holder's write.

The lock lives in Redis (flock); the data lives elsewhere, here in a SQLite table. Every
writer passes its fencing token to the database, which stores the largest token it has seen
per row and refuses a write whose token is not larger:

    UPDATE accounts SET balance = ?, fence = ? WHERE id = ? AND fence < ?

Client A takes the lock on account 1, checks that its grant is live, reads the balance and
then stalls (a GC pause, here a sleep) past its 1 s lease. Client B takes the lock (a
larger token) and writes through the database. A wakes up and writes late: Redis is not
involved in that write at all, yet the DATABASE refuses it (0 rows updated), and the balance
keeps B's value.

Needs a Redis with the flock module (`make run`) and redis-py (`pip install redis`):
    python3 examples/sql_fence.py [--host 127.0.0.1] [--port 6379]
Exits 0 when everything happened as told, 1 otherwise.
"""
import argparse
import sqlite3
import sys
import time

try:
    import redis
except ImportError:
    sys.exit("this example needs redis-py: python3 -m pip install redis")

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
    db = sqlite3.connect(":memory:", isolation_level=None)  # autocommit: one statement each
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

    # Client A: lock, check, read ... and stall.
    t_a = r.execute_command("FLOCK.ACQUIRE", LOCK, "client-A", LEASE_MS)
    expect(isinstance(t_a, int), f"A: FLOCK.ACQUIRE should grant the free lock, got {t_a!r}")
    say("A", f"FLOCK.ACQUIRE {LOCK} client-A {LEASE_MS} -> {t_a}")
    left = r.execute_command("FLOCK.CHECK", LOCK, t_a)
    expect(isinstance(left, int) and left > 0, f"A's fresh grant should be live, CHECK says {left!r}")
    say("A", f"FLOCK.CHECK {LOCK} {t_a} -> {left} ms left: all good, go on")
    a_seen = read_balance(db)
    a_new = a_seen + 50
    say("A", f"reads balance {a_seen}, will deposit 50 -> {a_new} ... and stalls (GC pause)")

    # A's pause: wait (polling) until its lease is over. A does nothing meanwhile.
    paused_at = time.monotonic()
    end = paused_at + DEADLINE_S
    while left != 0:
        expect(isinstance(left, int) and left > 0, f"FLOCK.CHECK: unexpected reply {left!r}")
        expect(time.monotonic() < end, f"A's {LEASE_MS} ms lease did not end within {DEADLINE_S} s")
        time.sleep(0.02)
        left = r.execute_command("FLOCK.CHECK", LOCK, t_a)
    say("-", f"FLOCK.CHECK {LOCK} {t_a} -> 0   (A's lease is over; A is still paused)")

    # Client B: lock, read, write through the database.
    t_b = r.execute_command("FLOCK.ACQUIRE", LOCK, "client-B", 30000)
    expect(isinstance(t_b, int), f"B: FLOCK.ACQUIRE should grant the expired lock, got {t_b!r}")
    say("B", f"FLOCK.ACQUIRE {LOCK} client-B 30000 -> {t_b}   ({t_b} > {t_a})")
    expect(t_b > t_a, f"B's token {t_b} should be greater than A's {t_a}")
    b_seen = read_balance(db)
    expect(b_seen == 100, f"B should read the untouched balance 100, read {b_seen}")
    b_new = b_seen - 30
    say("B", f"reads balance {b_seen}, withdraws 30 -> {b_new}")
    expect(write_balance(db, "B", b_new, t_b), "B's write with the live token should be taken")
    say("db", f"accounts: (id, balance, fence) = {row(db)}")

    # A wakes up and writes what it computed before the pause.
    say("A", f"... wakes up after {(time.monotonic() - paused_at) * 1000:.0f} ms "
             f"and writes the balance it computed: {a_new}")
    took = write_balance(db, "A", a_new, t_a)
    expect(not took, "the database should refuse A's write with the stale token")

    balance = read_balance(db)
    say("db", f"accounts: (id, balance, fence) = {row(db)}")
    expect(balance == b_new, f"the balance should be B's {b_new}, is {balance}")
    expect(row(db)[2] == t_b, f"the row's fence should be B's token {t_b}, is {row(db)[2]}")

    released = r.execute_command("FLOCK.RELEASE", LOCK, "client-A")
    say("A", f"FLOCK.RELEASE {LOCK} client-A -> {released}   (A held nothing any more)")
    expect(released == 0, f"A's FLOCK.RELEASE should be 0, got {released!r}")
    released = r.execute_command("FLOCK.RELEASE", LOCK, "client-B")
    say("B", f"FLOCK.RELEASE {LOCK} client-B -> {released}")
    expect(released == 1, f"B's FLOCK.RELEASE should be 1, got {released!r}")


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
