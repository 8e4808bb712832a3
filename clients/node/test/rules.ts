// docs/CLIENTS.md scenarios 9.x (loss heard through FLOCK.WATCH), 11.x (one grant one lease),
// 12.x (argument checks, loss reasons) and I.x (inspection), once per client library, against
// real redis-server processes with the flock module. Each test's name starts with its scenario.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { after, before, describe, test } from "node:test";
import { Flock, FlockError, InvalidArgumentError, LockBusyError, LockLostError, type Lease } from "redis-flock";
import type { Lib } from "./libs.js";
import { Server, sleep, until } from "./servers.js";
import { libKey } from "./suite.js";

async function clientList(s: Server): Promise<Array<Record<string, string>>> {
  const text = String(await s.admin.call("CLIENT", "LIST"));
  return text
    .trim()
    .split("\n")
    .map((line) => Object.fromEntries(line.split(" ").map((f) => [f.slice(0, f.indexOf("=")), f.slice(f.indexOf("=") + 1)])));
}

const stat = async (s: Server, field: string): Promise<number> =>
  Number(new RegExp(`^flock_${field}:(\\d+)`, "m").exec(await s.admin.info("flock"))?.[1] ?? NaN);

/** How long after `end()` (which ends the grant on the server) the lease is lost, in ms. */
async function heardAfter(lease: Lease, end: () => Promise<unknown>): Promise<number> {
  const t0 = performance.now();
  await end();
  assert.equal(await lease.waitLost(10000), true, "the loss was not heard within 10 s");
  return performance.now() - t0;
}

/** Until a WATCH naming the lease waits on the server. */
async function watched(flock: Flock, s: Server, ...leases: Lease[]): Promise<void> {
  await until("the lease watched", async () =>
    leases.every((l) => flock._watcher._watching(l.key, l.token)) && (await stat(s, "watchers")) >= 1,
  );
}

/** Generous for a loaded 2-core machine; bench.mjs --loss measures the real p50/p99. */
const HEARD_MS = 2000;

export function rulesSuite(lib: Lib): void {
  describe(`redis-flock rules 9, 11, 12 and inspection on ${lib.name}`, () => {
    let server: Server;
    let client: any;
    let flock: Flock;
    let n = 0;
    const key = () => `rule:${libKey(lib)}:${++n}`;

    before(async () => {
      server = await Server.start();
      client = await lib.client(server.port);
      flock = new Flock(client);
    });
    after(async () => {
      await lib.close(client);
      server.kill();
    });

    // ------------------------------------------------------------------ rule 9
    test("9.2 CLIENT KILL of a BOUND lease's connection: lost with reason closed at once", async (t) => {
      const k = key();
      const lease = await flock.acquire(k, { ttlMs: 30000, bound: true });
      assert.ok(lease);
      await sleep(50);
      const id = (await clientList(server)).find((c) => c.cmd === "flock.acquire")?.id;
      assert.ok(id, "the bound lease's connection");
      const ms = await heardAfter(lease, () => server.admin.call("CLIENT", "KILL", "ID", id));
      t.diagnostic(`bound connection kill heard after ${ms.toFixed(1)} ms`);
      assert.ok(ms < HEARD_MS, `${ms} ms`);
      assert.equal(lease.lostReason, "closed");
      assert.equal((lease.signal.reason as LockLostError).reason, "closed");
    });

    test("9.3 DEL and FLUSHALL of the key: lost with reason lost, heard from the WATCH", async (t) => {
      const k1 = key();
      const k2 = key();
      const a = await flock.acquire(k1, { ttlMs: 30000 });
      const b = await flock.acquire(k2, { ttlMs: 30000 });
      assert.ok(a && b);
      await watched(flock, server, a, b);
      const del = await heardAfter(a, () => server.admin.del(k1));
      assert.equal(a.lostReason, "lost");
      assert.throws(() => a.ensure(), (e: unknown) => e instanceof LockLostError && e.reason === "lost");
      await watched(flock, server, b); // re-armed without a (a FLUSHALL before is told `gone`)
      const flush = await heardAfter(b, () => server.admin.call("FLUSHALL"));
      assert.equal(b.lostReason, "lost");
      t.diagnostic(`DEL heard after ${del.toFixed(1)} ms, FLUSHALL after ${flush.toFixed(1)} ms`);
      assert.ok(del < HEARD_MS && flush < HEARD_MS, `${del} / ${flush} ms`);
      assert.equal(await a.release(), false);
    });

    test("9.4 many leases use one watching connection; a lease acquired while the WATCH waits is watched too; a released one is not", async () => {
      const f = new Flock(client);
      const leases: Lease[] = [];
      for (let i = 0; i < 10; i++) {
        const l = await f.acquire(key(), { ttlMs: 30000 });
        assert.ok(l);
        leases.push(l);
      }
      await until("one WATCH waiting", async () => f._watcher.connections === 1 && (await stat(server, "watchers")) >= 1);
      assert.equal(f._watcher.size, 10);
      const watching = (await clientList(server)).filter((c) => c.name === "flock-watch" && c.cmd === "flock.watch");
      assert.equal(f._watcher.connections, 1);
      assert.ok(watching.length >= 1);
      // Acquired while the WATCH waits: re-armed with it, so its revoke is heard.
      const late = await f.acquire(key(), { ttlMs: 30000 });
      assert.ok(late);
      await watched(f, server, late);
      const ms = await heardAfter(late, () => server.admin.call("FLOCK.REVOKE", late.key));
      assert.ok(ms < HEARD_MS, `${ms} ms`);
      assert.equal(late.lostReason, "revoked");
      // A released lease leaves the watch set; the others stay watched on the one connection.
      assert.equal(await leases[0].release(), true);
      assert.equal(leases[0].lost, false);
      assert.equal(f._watcher.size, 9);
      await watched(f, server, leases[5]);
      assert.equal(f._watcher.connections, 1);
      const again = await heardAfter(leases[5], () => server.admin.call("FLOCK.REVOKE", leases[5].key));
      assert.ok(again < HEARD_MS);
      for (const l of leases) await l.release();
      assert.equal(f._watcher.size, 0);
    });

    test("9.5 a lease's own release is not a loss, and renewals go on while the WATCH waits", async () => {
      const k = key();
      const lease = await flock.acquire(k, { ttlMs: 600 });
      assert.ok(lease);
      const before = await stat(server, "renewals");
      await sleep(2000); // more than three ttls
      assert.equal(lease.lost, false);
      assert.ok((await stat(server, "renewals")) - before >= 5);
      assert.ok((await stat(server, "watchers")) >= 1, "the WATCH waits meanwhile");
      assert.equal(await lease.release(), true);
      await sleep(100);
      assert.equal(lease.lost, false);
      assert.equal(lease.lostReason, null);
      assert.equal(lease.signal.aborted, false);
    });

    test("9.6 a release by another process with the lease's owner is heard as revoked", async () => {
      const k = key();
      const lease = await flock.acquire(k, { ttlMs: 30000, owner: "svc-9-6" });
      assert.ok(lease);
      await watched(flock, server, lease);
      const other = await lib.client(server.port);
      try {
        const ms = await heardAfter(lease, () => new Flock(other).release(k, "svc-9-6"));
        assert.ok(ms < HEARD_MS, `${ms} ms`);
        assert.equal(lease.lostReason, "revoked");
      } finally {
        await lib.close(other);
      }
    });

    // ------------------------------------------------------------------ rule 11
    test("11.1 the same owner acquiring a key this Flock holds: LockBusyError at once, the held lease intact", async () => {
      const k = key();
      const lease = await flock.acquire(k, { ttlMs: 5000, owner: "o-11-1" });
      assert.ok(lease);
      const t0 = performance.now();
      await assert.rejects(flock.acquire(k, { ttlMs: 5000, owner: "o-11-1", waitMs: 5000 }), LockBusyError);
      assert.ok(performance.now() - t0 < 1000, "at once, not after the wait");
      assert.equal(lease.lost, false);
      assert.ok((await flock.check(k, lease.token)) > 0);
      assert.equal(await lease.release(), true);
      // Two calls at once with one owner: one lease object, never two sharing the grant.
      const k2 = key();
      const both = await Promise.allSettled([
        flock.acquire(k2, { ttlMs: 5000, owner: "o-11-1" }),
        flock.acquire(k2, { ttlMs: 5000, owner: "o-11-1" }),
      ]);
      assert.deepEqual(both.map((r) => r.status).sort(), ["fulfilled", "rejected"]);
      const won = both.find((r) => r.status === "fulfilled") as PromiseFulfilledResult<Lease | null>;
      assert.ok((both.find((r) => r.status === "rejected") as PromiseRejectedResult).reason instanceof LockBusyError);
      assert.ok(won.value);
      const [r1, r2] = await Promise.all([
        flock.acquire(k2, { ttlMs: 5000, owner: "o-11-1b", reentrant: true }).catch((e) => e),
        flock.acquire(k2, { ttlMs: 5000, owner: "o-11-1b", reentrant: true }).catch((e) => e),
      ]);
      assert.equal(r1, null, "another owner holds k2");
      assert.equal(r2, null);
      await won.value.release();
      const [c1, c2] = await Promise.all([
        flock.acquire(k2, { ttlMs: 5000, owner: "o-11-1c", reentrant: true }),
        flock.acquire(k2, { ttlMs: 5000, owner: "o-11-1c", reentrant: true }),
      ]);
      assert.ok(c1 && c1 === c2);
      assert.equal(c1.holds, 2);
      await c1.release();
      await c1.release();
      assert.equal(await flock.locked(k2), false);
      // Released: the same owner may take it again, as a new lease.
      const again = await flock.acquire(k, { ttlMs: 5000, owner: "o-11-1" });
      assert.ok(again && again !== lease);
      await again.release();
    });

    test("11.2 reentrant: the same lease object, one hold more; only the last release frees the key", async () => {
      const k = key();
      const a = await flock.acquire(k, { ttlMs: 5000, owner: "o-11-2", reentrant: true });
      const b = await flock.acquire(k, { ttlMs: 5000, owner: "o-11-2", reentrant: true });
      assert.ok(a && b);
      assert.equal(a, b);
      assert.equal(a.holds, 2);
      assert.equal(await b.release(), true);
      assert.equal(a.holds, 1);
      assert.ok((await flock.check(k, a.token)) > 0, "a release before the last keeps the grant");
      assert.equal(await a.release(), true);
      assert.equal(await flock.check(k, a.token), 0);
      assert.equal(await flock.locked(k), false);
    });

    test("11.3 a reentrant acquire asking for another kind than the held lease: InvalidArgumentError", async () => {
      const k = key();
      const a = await flock.acquire(k, { ttlMs: 5000, owner: "o-11-3", reentrant: true });
      assert.ok(a);
      await assert.rejects(flock.acquire(k, { ttlMs: 5000, owner: "o-11-3", reentrant: true, shared: true }), InvalidArgumentError);
      await assert.rejects(flock.acquire(k, { ttlMs: 5000, owner: "o-11-3", reentrant: true, bound: true }), InvalidArgumentError);
      assert.equal(a.holds, 1);
      assert.equal(await a.release(), true);
    });

    test("11.4 reentrant without an owner: the same task re-enters, another task waits as another holder", async () => {
      // A task is a withLock callback and what it starts (AsyncLocalStorage); two withLocks
      // started side by side are two tasks.
      const k = key();
      let release!: () => void;
      const held = new Promise<void>((r) => (release = r));
      let entered!: () => void;
      const isHeld = new Promise<void>((r) => (entered = r));
      let outerToken = 0;
      let otherGotAt = -1;
      let releasedAt = -1;
      const first = flock.withLock(k, { ttlMs: 5000, reentrant: true }, async (lease) => {
        outerToken = lease.token;
        // This task re-enters, nested, without waiting.
        await flock.withLock(k, { ttlMs: 5000, reentrant: true, waitMs: 20000 }, async (inner) => {
          assert.equal(inner, lease);
          assert.equal(inner.holds, 2);
        });
        assert.equal(lease.holds, 1);
        assert.ok((await flock.check(k, lease.token)) > 0, "the inner release kept the grant");
        entered();
        await held;
        releasedAt = performance.now();
      });
      await isHeld;
      const second = flock.withLock(k, { ttlMs: 5000, reentrant: true, waitMs: 20000 }, async (l2) => {
        otherGotAt = performance.now();
        assert.notEqual(l2.token, outerToken);
      });
      await server.waitBlocked(1);
      assert.equal(otherGotAt, -1, "the other task waits");
      release();
      await first;
      await second;
      assert.ok(otherGotAt >= releasedAt);
      assert.equal(await flock.check(k, outerToken), 0);
    });

    test("11.5 a nested default acquire with a wait on a key its own task holds: LockBusyError at once", async () => {
      const k = key();
      await flock.withLock(k, { ttlMs: 5000 }, async (lease) => {
        const t0 = performance.now();
        await assert.rejects(flock.withLock(k, { ttlMs: 5000, waitMs: 10000 }, async () => 0), LockBusyError);
        await assert.rejects(flock.acquire(k, { ttlMs: 5000, waitMs: 10000 }), LockBusyError);
        assert.ok(performance.now() - t0 < 2000, "at once, not after its 10 s wait");
        assert.equal(lease.lost, false);
        assert.equal(await server.blockedClients(), 0);
      });
    });

    test("11.6 a lease dropped without release (garbage collected) stops renewing and is released", async () => {
      const k = key();
      // In a process of its own with --expose-gc: it acquires (ttl 6 s), drops the lease and
      // collects garbage every 50 ms while it stays alive. The lease is held strongly until its
      // first renewal (2 s), then weakly: collected, released with its token (a RELEASE, not an
      // expiry), long before its ttl would have run out.
      const ttl = 6000;
      const releases = await stat(server, "releases");
      const expirations = await stat(server, "expirations");
      const child = spawn(process.execPath, ["--expose-gc", join(__dirname, "forget.js"), libKey(lib), String(server.port), k, String(ttl)], {
        stdio: ["ignore", "pipe", "inherit"],
      });
      let out = "";
      child.stdout!.on("data", (d) => (out += String(d)));
      try {
        await until("the child's grant", () => /GRANTED \d+/.test(out), 20000);
        const t0 = performance.now();
        await until("the forgotten lease released", async () => (await server.admin.exists(k)) === 0, 20000);
        const freedAfter = performance.now() - t0;
        assert.ok(freedAfter < ttl, `freed after ${freedAfter.toFixed(0)} ms`);
        assert.equal(await stat(server, "releases"), releases + 1, "released, not expired");
        assert.equal(await stat(server, "expirations"), expirations);
        const renewals = await stat(server, "renewals");
        await sleep(300);
        assert.equal(await stat(server, "renewals"), renewals, "nothing renews it");
        await until("the child saw it collected", () => /COLLECTED/.test(out), 5000);
        assert.equal(child.exitCode, null, "the child still runs: only the lease is gone");
      } finally {
        child.kill("SIGKILL");
        await once(child, "exit").catch(() => {});
      }
    });

    // ------------------------------------------------------------------ rule 12
    test("12.1-12.5 argument checks: InvalidArgumentError (a FlockError), nothing sent", async () => {
      const bad = (p: Promise<unknown>) => assert.rejects(p, (e: unknown) => e instanceof InvalidArgumentError && e instanceof FlockError && (e as Error).name === "InvalidArgumentError");
      const calls = Number(/cmdstat_flock\.acquire:calls=(\d+)/.exec(await server.admin.info("commandstats"))?.[1] ?? 0);
      // 12.1 keys
      for (const k of ["", 5, null, undefined, Buffer.from("k"), ["k"]]) await bad(flock.acquire(k as any, { ttlMs: 1000 }));
      // 12.2 ttls
      for (const ttl of [0, -1, 1.5, true, "1000", NaN, Infinity, undefined]) await bad(flock.acquire(key(), { ttlMs: ttl as any }));
      // 12.3 owners
      for (const owner of ["", "x".repeat(257), "\u00e9".repeat(129), Buffer.from("o"), 42]) await bad(flock.acquire(key(), { ttlMs: 1000, owner: owner as any }));
      assert.ok(await flock.acquire(key(), { ttlMs: 1000, owner: "x".repeat(256) }).then((l) => l?.release()));
      // 12.4 an unknown option: the misspelt `wait`, in plain JS too
      await bad(flock.acquire(key(), { ttlMs: 1000, wait: 5000 } as any));
      await bad(flock.withLock(key(), { ttlMs: 1000, timeout: 5 } as any, async () => 0));
      await bad(flock.acquire(key(), null as any));
      // 12.5 waits, limits, combinations
      for (const waitMs of [-1, NaN, "5"]) await bad(flock.acquire(key(), { ttlMs: 1000, waitMs: waitMs as any }));
      for (const limit of [0, -1, 1.5, "2"]) await bad(flock.acquire(key(), { ttlMs: 1000, limit: limit as any }));
      await bad(flock.acquire(key(), { ttlMs: 1000, shared: true, limit: 2 }));
      await bad(flock.acquire(key(), { ttlMs: 1000, bound: true, replicas: 1 }));
      await bad(flock.acquire(key(), { ttlMs: 1000, shared: "yes" as any }));
      await bad(flock.release("", "o"));
      await bad(flock.revoke(""));
      await bad(flock.info(""));
      const after = Number(/cmdstat_flock\.acquire:calls=(\d+)/.exec(await server.admin.info("commandstats"))?.[1] ?? 0);
      assert.equal(after - calls, 1, "only the one valid acquire was sent");
    });

    test("12.6 2.2 each loss names its reason on the lease and on the LockLostError", async () => {
      const reasons: Record<string, string> = {};
      const lose = async (what: string, opts: object, how: (l: Lease) => Promise<unknown>) => {
        const l = await flock.acquire(key(), { ttlMs: 30000, ...opts });
        assert.ok(l);
        await watched(flock, server, l);
        await how(l);
        assert.equal(await l.waitLost(10000), true, what);
        assert.equal((l.signal.reason as LockLostError).reason, l.lostReason);
        assert.throws(() => l.ensure(), (e: unknown) => e instanceof LockLostError && e.reason === l.lostReason);
        reasons[what] = l.lostReason!;
      };
      await lose("revoked", {}, (l) => flock.revoke(l.key));
      await lose("lost", {}, (l) => server.admin.del(l.key));
      const unwatched = new Flock(client);
      unwatched._watcher.close();
      {
        // Stale before any watcher could say so: the server refuses the fenced write.
        const l = await unwatched.acquire(key(), { ttlMs: 30000, renew: false });
        assert.ok(l);
        await flock.revoke(l.key);
        await assert.rejects(l.fenced("SET", `${l.key}:x`, "1"));
        reasons["fenced-refused"] = l.lostReason!;
        assert.equal((l.signal.reason as LockLostError).reason, "fenced-refused");
      }
      // Without a watcher (closed), what the client's own round trips find.
      const quiet = new Flock(client);
      quiet._watcher.close();
      {
        const l = await quiet.acquire(key(), { ttlMs: 200, renew: false });
        assert.ok(l);
        assert.equal(await l.waitLost(5000), true);
        reasons["deadline-passed"] = l.lostReason!;
      }
      for (const [what, how] of [
        ["gone", (l: Lease) => l.check()],
        ["renew-refused", (l: Lease) => l.renew().catch(() => {})],
      ] as const) {
        const l = await quiet.acquire(key(), { ttlMs: 30000, renew: false });
        assert.ok(l);
        await flock.revoke(l.key);
        await how(l);
        assert.equal(l.lost, true, what);
        assert.equal((l.signal.reason as LockLostError).reason, l.lostReason);
        reasons[what] = l.lostReason!;
      }
      assert.deepEqual(reasons, {
        revoked: "revoked", lost: "lost", "fenced-refused": "fenced-refused", "deadline-passed": "deadline-passed", gone: "gone",
        "renew-refused": "renew-refused",
      });
    });

    test("12.7 fenced(), ensure() and renew() after a clean release: LockLostError released, nothing sent, lost false", async () => {
      const k = key();
      const lease = await flock.acquire(k, { ttlMs: 5000 });
      assert.ok(lease);
      assert.equal(await lease.release(), true);
      await server.admin.call("CONFIG", "RESETSTAT");
      const isReleased = (e: unknown) => e instanceof LockLostError && e.reason === "released";
      await assert.rejects(lease.fenced("SET", `${k}:x`, "1"), isReleased);
      assert.throws(() => lease.ensure(), isReleased);
      await assert.rejects(lease.renew(), isReleased);
      assert.equal(lease.lost, false);
      assert.doesNotMatch(await server.admin.info("commandstats"), /cmdstat_flock\.(fenced|renew)/);
    });

    // ------------------------------------------------------------------ inspection
    test("I.1-I.5 info, holders, waiters, locked and check", async () => {
      const k = key();
      assert.equal(await flock.info(k), null);
      assert.deepEqual(await flock.holders(k), []);
      assert.deepEqual(await flock.waiters(k), []);
      assert.equal(await flock.locked(k), false);
      const a = await flock.acquire(k, { ttlMs: 5000, shared: true, owner: "reader-a" });
      const b = await flock.acquire(k, { ttlMs: 4000, shared: true, owner: "reader-b" });
      assert.ok(a && b);
      const w = flock.acquire(k, { ttlMs: 5000, owner: "writer", waitMs: 20000 });
      await server.waitBlocked(1);
      const info = await flock.info(k);
      assert.ok(info);
      assert.equal(info.mode, "shared");
      assert.equal(info.holders, 2);
      assert.equal(info.waiters, 1);
      const hs = await flock.holders(k);
      assert.deepEqual(hs.map((h) => [h.owner, h.token]), [["reader-a", a.token], ["reader-b", b.token]]);
      assert.ok(hs[1].ttlMs > 0 && hs[1].ttlMs <= 4000);
      assert.deepEqual((await a.holders()).map((h) => h.owner), ["reader-a", "reader-b"]);
      const ws = await flock.waiters(k);
      assert.equal(ws.length, 1);
      assert.equal(ws[0].owner, "writer");
      assert.equal(ws[0].mode, "exclusive");
      assert.ok(ws[0].waitedMs >= 0);
      assert.equal(await flock.locked(k), true);
      const left = await flock.check(k, a.token);
      assert.ok(left > 0 && left <= 5000);
      await a.release();
      await b.release();
      const writer = await w;
      assert.ok(writer);
      assert.deepEqual(await flock.waiters(k), []);
      const wi = await flock.info(k);
      assert.ok(wi);
      assert.equal(wi.mode, "exclusive");
      assert.equal(wi.owner, "writer");
      assert.equal(wi.token, writer.token);
      assert.ok(wi.ttl! > 0 && wi.ttl! <= 5000);
      await writer.release();
      assert.equal(await flock.check(k, writer.token), 0);
      assert.equal(await flock.locked(k), false);
    });

    test("I.6 stats() and stats(cls): the class of a key counts its grants and releases", async () => {
      for (let i = 0; i < 3; i++) {
        const l = await flock.acquire(`stats:${libKey(lib)}:order:${100 + i}`, { ttlMs: 5000 });
        assert.ok(l);
        await l.release();
      }
      const cls = `stats:${libKey(lib)}:order:#`;
      const all = await flock.stats();
      assert.ok(all.classes[cls], JSON.stringify(Object.keys(all.classes)));
      assert.equal(typeof all.overflow, "number");
      const one = await flock.stats(cls);
      assert.deepEqual(Object.keys(one.classes), [cls]);
      assert.equal(one.classes[cls].grants, 3);
      assert.equal(one.classes[cls].released, 3);
      const hold = one.classes[cls].hold_ms as Record<string, unknown>;
      assert.equal(typeof hold.p50, "number");
    });
  });
}
