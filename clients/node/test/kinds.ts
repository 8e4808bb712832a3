// Shared, counted and bound leases (docs/SPEC.md "Lock kinds", "Connection-bound grants"),
// run once per client library against a real redis-server with the flock module.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { createInterface } from "node:readline";
import { after, before, describe, test } from "node:test";
import { Flock, FlockError, InvalidArgumentError, LockBusyError, LockLostError, type Lease } from "redis-flock";
import type { Lib } from "./libs.js";
import { Server, sleep, until } from "./servers.js";
import { libKey } from "./suite.js";

const asMap = (reply: unknown): Record<string, unknown> => {
  const a = reply as unknown[];
  const out: Record<string, unknown> = {};
  for (let i = 0; i < a.length; i += 2) out[String(a[i])] = a[i + 1];
  return out;
};

/** CLIENT LIST as records. */
async function clientList(s: Server): Promise<Array<Record<string, string>>> {
  const text = String(await s.admin.call("CLIENT", "LIST"));
  return text
    .trim()
    .split("\n")
    .map((line) => Object.fromEntries(line.split(" ").map((f) => [f.slice(0, f.indexOf("=")), f.slice(f.indexOf("=") + 1)])));
}

const stat = async (s: Server, field: string): Promise<number> =>
  Number(new RegExp(`^flock_${field}:(\\d+)`, "m").exec(await s.admin.info("flock"))?.[1] ?? NaN);

/** A server's reply error (the client's own errors are FlockErrors). */
const serverError = (re: RegExp) => (e: unknown) => e instanceof Error && !(e instanceof FlockError) && re.test(e.message);

export function kindsSuite(lib: Lib): void {
  describe(`redis-flock kinds on ${lib.name}`, () => {
    let server: Server;
    let client: any;
    let flock: Flock;
    let n = 0;
    const key = () => `kind:${libKey(lib)}:${++n}`;

    before(async () => {
      server = await Server.start();
      client = await lib.client(server.port);
      flock = new Flock(client);
    });
    after(async () => {
      await lib.close(client);
      server.kill();
    });

    test("8.2 shared leases hold together; a writer waits with BLOCK until every reader released; tokens distinct and growing", async () => {
      const k = key();
      const readers: Lease[] = [];
      for (let i = 0; i < 3; i++) {
        // 900 ms (renewed every 300 ms): 450 ms left 300 ms for a late renewal
        const l = await flock.acquire(k, { ttlMs: 900, shared: true });
        assert.ok(l, `reader ${i}`);
        assert.equal(l.kind, "shared");
        readers.push(l);
      }
      const tokens = readers.map((l) => l.token);
      assert.deepEqual([...tokens].sort((a, b) => a - b), tokens);
      assert.equal(new Set(tokens).size, 3);
      const info = asMap(await server.admin.call("FLOCK.INFO", k));
      assert.deepEqual([info.mode, info.holders, info.limit], ["shared", 3, 0]);
      const holders = (await server.admin.call("FLOCK.HOLDERS", k)) as unknown[][];
      assert.deepEqual(holders.map((h) => [h[0], h[1]]), readers.map((l) => [l.owner, l.token]));

      // A writer gets nothing while readers hold: null, or LockBusyError from withLock.
      assert.equal(await flock.acquire(k, { ttlMs: 5000 }), null);
      await assert.rejects(flock.withLock(k, { ttlMs: 5000 }, async () => 0), LockBusyError);
      // A reader's fenced() runs reads; a write is the server's error and the lease stays live.
      assert.equal(await readers[0].fenced("GET", `${k}:data`), null);
      await assert.rejects(readers[0].fenced("SET", `${k}:data`, "x"), serverError(/shared grant runs read-only commands only/));
      assert.equal(readers[0].lost, false);
      assert.equal(readers[0].signal.aborted, false);

      const writer = flock.acquire(k, { ttlMs: 5000, waitMs: 20000 });
      let writerDone = false;
      void writer.then(() => (writerDone = true));
      await server.waitBlocked(1);
      // A reader coming after the waiting writer does not jump the queue.
      assert.equal(await flock.acquire(k, { ttlMs: 5000, shared: true }), null);
      // The readers' watchdogs keep their 900 ms leases alive while the writer waits.
      const base = await stat(server, "renewals");
      await until("two renewals per reader", async () => (await stat(server, "renewals")) >= base + 6);
      assert.ok(readers.every((l) => !l.lost));
      assert.equal(await readers[0].release(), true);
      assert.equal(await readers[1].release(), true);
      assert.equal(((await server.admin.call("FLOCK.HOLDERS", k)) as unknown[]).length, 1);
      assert.equal(await server.blockedClients(), 1, "the writer waits for the last reader");
      assert.equal(writerDone, false);
      assert.equal(await readers[2].release(), true);
      const w = await writer;
      assert.ok(w);
      assert.equal(w.kind, "exclusive");
      assert.ok(w.token > Math.max(...tokens));
      const after = asMap(await server.admin.call("FLOCK.INFO", k));
      assert.deepEqual([after.mode, after.owner], ["exclusive", w.owner]);
      assert.equal(await w.fenced("SET", `${k}:data`, "w"), "OK");
      assert.equal(await w.release(), true);
      assert.ok(readers.every((l) => !l.lost));
    });

    test("8.2 counted leases: LIMIT n admits n holders, the n+1-th waits and gets a released permit", async () => {
      const k = key();
      await flock.withLock(k, { ttlMs: 5000, limit: 3 }, async (first) => {
        assert.equal(first.kind, "permit");
        const permits = [first];
        for (let i = 0; i < 2; i++) {
          const l = await flock.acquire(k, { ttlMs: 5000, limit: 3 });
          assert.ok(l);
          permits.push(l);
        }
        const tokens = permits.map((l) => l.token);
        assert.ok(tokens[0] < tokens[1] && tokens[1] < tokens[2], String(tokens));
        const info = asMap(await server.admin.call("FLOCK.INFO", k));
        assert.deepEqual([info.mode, info.holders, info.limit], ["permits", 3, 3]);
        assert.equal(await permits[1].fenced("INCR", `${k}:count`), 1); // a permit may write
        assert.equal(await flock.acquire(k, { ttlMs: 5000, limit: 3 }), null);
        await assert.rejects(flock.withLock(k, { ttlMs: 5000, limit: 3 }, async () => 0), LockBusyError);
        const fourth = flock.acquire(k, { ttlMs: 5000, limit: 3, waitMs: 20000 });
        let done = false;
        void fourth.then(() => (done = true));
        await server.waitBlocked(1);
        assert.equal(done, false);
        assert.equal(await permits[1].release(), true);
        const f = await fourth;
        assert.ok(f);
        assert.ok(f.token > tokens[2]);
        const holders = (await server.admin.call("FLOCK.HOLDERS", k)) as unknown[][];
        assert.deepEqual(
          holders.map((h) => [h[0], h[1]]),
          [permits[0], permits[2], f].map((l) => [l.owner, l.token]),
        );
        assert.equal(await f.fenced("INCR", `${k}:count`), 2);
        assert.equal(await f.release(), true);
        assert.equal(await permits[2].release(), true);
      });
      assert.equal(await server.admin.exists(k), 0);
    });

    test("limit mismatch and mode conflicts reject at once with the server's error; a key taken in another mode is busy", async () => {
      const k = key();
      const a = await flock.acquire(k, { ttlMs: 5000, limit: 2, owner: "a" });
      const b = await flock.acquire(k, { ttlMs: 5000, limit: 2 });
      assert.ok(a && b);
      const mismatch = new RegExp(`^ERR limit mismatch: ${k} admits 2 shared holders$`);
      for (const opts of [{ limit: 3 }, { shared: true }, { limit: 3, bound: true }]) {
        await assert.rejects(flock.acquire(k, { ttlMs: 5000, ...opts }), serverError(mismatch), JSON.stringify(opts));
        // With a wait (the key is full): rejected at once, neither a wait nor LockBusyError.
        const t0 = performance.now();
        await assert.rejects(flock.withLock(k, { ttlMs: 5000, waitMs: 20000, ...opts }, async () => 0), serverError(mismatch));
        assert.ok(performance.now() - t0 < 5000);
      }
      // An exclusive request on a limited key is no mismatch: busy.
      assert.equal(await flock.acquire(k, { ttlMs: 5000 }), null);
      // The owner holding a permit asks again in another mode: from this Flock that is rule 11
      // (LockBusyError at once, before anything is sent); from another, the server's error.
      await assert.rejects(flock.acquire(k, { ttlMs: 5000, owner: "a" }), LockBusyError);
      const other = new Flock(client);
      await assert.rejects(other.acquire(k, { ttlMs: 5000, owner: "a" }), serverError(/owner already holds a permit grant of/));
      await assert.rejects(
        other.acquire(k, { ttlMs: 5000, owner: "a", shared: true, waitMs: 1000 }),
        serverError(/owner already holds a permit grant of/),
      );
      const holders = (await server.admin.call("FLOCK.HOLDERS", k)) as unknown[][];
      assert.deepEqual(holders.map((h) => [h[0], h[1]]), [["a", a.token], [b.owner, b.token]]);
      assert.equal(asMap(await server.admin.call("FLOCK.INFO", k)).waiters, 0);
      assert.ok(!a.lost && !b.lost && (await a.check()) > 0 && (await b.check()) > 0);
      await a.release();
      await b.release();

      const s = key();
      const sh = await flock.acquire(s, { ttlMs: 5000, shared: true, owner: "s" });
      assert.ok(sh);
      await assert.rejects(flock.acquire(s, { ttlMs: 5000, limit: 2 }), serverError(/limit mismatch: .* admits any number of shared holders/));
      await assert.rejects(other.acquire(s, { ttlMs: 5000, owner: "s" }), serverError(/owner already holds a shared grant of/));
      await sh.release();
      const x = key();
      const ex = await flock.acquire(x, { ttlMs: 5000 });
      assert.ok(ex);
      assert.equal(await flock.acquire(x, { ttlMs: 5000, shared: true }), null);
      await assert.rejects(flock.withLock(x, { ttlMs: 5000, limit: 4 }, async () => 0), LockBusyError);
      await ex.release();
      await assert.rejects(flock.acquire(key(), { ttlMs: 5000, limit: 1e6 }), serverError(/invalid limit/));
      for (const bad of [0, -1, 1.5]) await assert.rejects(flock.acquire(key(), { ttlMs: 5000, limit: bad }), InvalidArgumentError);
      await assert.rejects(flock.acquire(key(), { ttlMs: 5000, limit: 2, shared: true }), InvalidArgumentError);
    });

    test("8.1 a bound lease whose connection is killed is lost at once (signal, withLock rejects) and a waiter gets the lock", async () => {
      const k = key();
      const ttl = 3000;
      const name = `bound-${libKey(lib)}`;
      const own = await lib.client(server.port, name);
      try {
        const f = new Flock(own);
        const mainId = Number(await lib.raw(own, ["CLIENT", "ID"]));
        const closed = await stat(server, "bound_closed");
        let lease: Lease | undefined;
        let noticedMs = -1;
        let grantedMs = -1;
        let waited = null as Lease | null;
        await assert.rejects(
          f.withLock(k, { ttlMs: ttl, bound: true }, async (l, signal) => {
            lease = l;
            assert.equal(l.bound, true);
            // The lease's own connection (a duplicate of the client), not the client's.
            const mine = (await clientList(server)).filter((c) => c.name === name && Number(c.id) !== mainId);
            assert.equal(mine.length, 1, JSON.stringify(mine));
            const waiter = flock.acquire(k, { ttlMs: 10000, waitMs: 20000 });
            await server.waitBlocked(1);
            const t0 = performance.now();
            const aborted = once(signal, "abort");
            assert.equal(await server.admin.call("CLIENT", "KILL", "ID", mine[0].id), 1);
            await aborted;
            noticedMs = performance.now() - t0;
            assert.ok(signal.reason instanceof LockLostError);
            assert.equal(signal.reason.reason, "closed");
            assert.equal(l.lost, true);
            assert.equal(l.remainingMs(), 0);
            assert.throws(() => l.ensure(), LockLostError);
            waited = await waiter;
            grantedMs = performance.now() - t0;
            return "done";
          }),
          (e: unknown) => e instanceof LockLostError && e.reason === "closed",
        );
        // Noticed from the connection's close event, not at the next renewal (a third of the ttl).
        assert.ok(noticedMs >= 0 && noticedMs < ttl / 3, `noticed after ${noticedMs.toFixed(0)} ms`);
        assert.ok(waited, "the waiter got the lock");
        assert.ok(grantedMs < ttl / 2, `the waiter got it after ${grantedMs.toFixed(0)} ms`);
        assert.ok(waited!.token > lease!.token);
        assert.equal(Number(await server.admin.call("FLOCK.CHECK", k, lease!.token)), 0);
        assert.equal(await stat(server, "bound_closed"), closed + 1);
        assert.equal(await lease!.release(), false);
        assert.equal(await waited!.release(), true);
        // The client itself was not touched: a new bound lease works, and is released.
        const again = await f.acquire(k, { ttlMs: 1000, bound: true });
        assert.ok(again);
        assert.equal(await again.release(), true);
        await until("the bound connections closed", async () =>
          (await clientList(server)).filter((c) => c.name === name && Number(c.id) !== mainId).length === 0,
        );
      } finally {
        await lib.close(own);
      }
    });

    test("8.1 a bound lease renews on its own connection and releases there; it closes with the lease", async () => {
      const k = key();
      const name = `bound-own-${libKey(lib)}`;
      const own = await lib.client(server.port, name);
      try {
        const f = new Flock(own);
        const mainId = Number(await lib.raw(own, ["CLIENT", "ID"]));
        // 600 ms (renewed every 200 ms): 300 ms left too little for a late renewal
        const lease = await f.acquire(k, { ttlMs: 600, bound: true });
        assert.ok(lease);
        const mine = (await clientList(server)).filter((c) => c.name === name && Number(c.id) !== mainId);
        assert.equal(mine.length, 1);
        const base = await stat(server, "renewals");
        await until("renewals on the bound connection", async () => {
          const c = (await clientList(server)).find((x) => x.id === mine[0].id);
          return c?.cmd === "flock.renew" && (await stat(server, "renewals")) >= base + 6;
        });
        assert.equal(lease.lost, false);
        assert.ok((await lease.check()) > 0);
        assert.equal(await stat(server, "bound_grants"), 1);
        assert.equal(await lease.release(), true);
        assert.equal(lease.lost, false);
        assert.equal(await server.admin.exists(k), 0);
        await until("the bound connection closed", async () => !(await clientList(server)).some((c) => c.id === mine[0].id));
        assert.equal(await stat(server, "bound_grants"), 0);
      } finally {
        await lib.close(own);
      }
    });

    test("readers waiting behind a writer are granted together, in wait order, each renewed at once", async () => {
      const k = key();
      const writer = await flock.acquire(k, { ttlMs: 10000 });
      assert.ok(writer);
      const waits: Array<Promise<Lease | null>> = [];
      for (let i = 1; i <= 3; i++) {
        waits.push(flock.acquire(k, { ttlMs: 900, shared: true, waitMs: 20000 }));
        await server.waitBlocked(i);
      }
      assert.equal(await writer.release(), true);
      const readers = await Promise.all(waits);
      assert.ok(readers.every((l) => l !== null));
      const rs = readers as Lease[];
      const tokens = rs.map((l) => l.token);
      assert.ok(tokens[0] > writer.token && tokens[0] < tokens[1] && tokens[1] < tokens[2], String(tokens));
      const holders = (await server.admin.call("FLOCK.HOLDERS", k)) as unknown[][];
      assert.deepEqual(holders.map((h) => [h[0], h[1]]), rs.map((l) => [l.owner, l.token]));
      const base = await stat(server, "renewals");
      await until("two renewals per reader", async () => (await stat(server, "renewals")) >= base + 6);
      assert.ok(rs.every((l) => !l.lost));
      for (const l of rs) assert.equal(await l.release(), true);
      assert.equal(await server.admin.exists(k), 0);
    });

    test("a bound wait across a killed connection waits again; its grant is bound to the new connection", async () => {
      const k = key();
      const holder = await flock.acquire(k, { ttlMs: 20000 });
      assert.ok(holder);
      const waiting = flock.acquire(k, { ttlMs: 3000, bound: true, waitMs: 20000 });
      const acquirers = async () =>
        (await clientList(server)).filter((c) => c.cmd === "flock.acquire" && c.flags.includes("b")).map((c) => c.id);
      await until("the bound wait", async () => (await acquirers()).length === 1);
      const [first] = await acquirers();
      assert.equal(await server.admin.call("CLIENT", "KILL", "ID", first), 1);
      await until("the wait on a new connection", async () => {
        const now = await acquirers();
        return now.length === 1 && now[0] !== first;
      });
      const [second] = await acquirers();
      assert.equal(await holder.release(), true);
      const lease = await waiting;
      assert.ok(lease);
      assert.equal(lease.bound, true);
      assert.equal(lease.lost, false);
      assert.equal(await stat(server, "bound_grants"), 1);
      assert.equal(await server.admin.call("CLIENT", "KILL", "ID", second), 1);
      await until("the bound grant ends with its connection", async () => Number(await server.admin.call("FLOCK.CHECK", k, lease.token)) === 0);
      // from the connection's close event (not the local deadline, the reason says)
      assert.equal(await lease.waitLost(2000), true);
      assert.equal((lease.signal.reason as LockLostError).reason, "closed");
      assert.equal(await lease.release(), false);
    });

    test("a bound lease whose connection dies during its release: lost at once (the grant ended with the connection)", async () => {
      const k = key();
      const ttl = 6000;
      const name = `bound-rel-${libKey(lib)}`;
      const own = await lib.client(server.port, name);
      try {
        const f = new Flock(own);
        const mainId = Number(await lib.raw(own, ["CLIENT", "ID"]));
        const lease = await f.acquire(k, { ttlMs: ttl, bound: true });
        assert.ok(lease);
        const [mine] = (await clientList(server)).filter((c) => c.name === name && Number(c.id) !== mainId);
        await server.admin.call("CLIENT", "PAUSE", "5000", "WRITE"); // the RELEASE waits in the server
        let released: Promise<boolean>;
        try {
          released = lease.release();
          await until("the RELEASE held by the pause", async () =>
            (await clientList(server)).some((c) => c.id === mine.id && c.cmd === "flock.release" && c.flags.includes("b")),
          );
          const t0 = performance.now();
          assert.equal(await server.admin.call("CLIENT", "KILL", "ID", mine.id), 1);
          await server.admin.call("CLIENT", "UNPAUSE");
          assert.equal(await released, false);
          const took = performance.now() - t0;
          assert.ok(took < ttl / 3, `release() resolved ${took.toFixed(0)} ms after the kill (ttl ${ttl})`);
        } finally {
          await server.admin.call("CLIENT", "UNPAUSE");
        }
        assert.equal(lease.lost, true);
        assert.equal(lease.signal.aborted, true);
        // The server ends it once the pause is over (never inside a client pause).
        await until("the bound grant ends with its connection", async () => Number(await server.admin.call("FLOCK.CHECK", k, lease.token)) === 0);
      } finally {
        await lib.close(own);
      }
    });

    test("a bound withLock in a process that dies: a waiter gets the lock at once, not at the end of the lease", async () => {
      const k = key();
      const ttl = 30000;
      const child = spawn(process.execPath, [join(__dirname, "bound-holder.js"), libKey(lib), String(server.port), k, String(ttl)], {
        stdio: ["ignore", "pipe", "inherit"],
      });
      try {
        const lines = createInterface({ input: child.stdout! });
        const [first] = (await once(lines, "line", { signal: AbortSignal.timeout(10000) })) as string[];
        const m = /^HOLDING (\d+) true$/.exec(first);
        assert.ok(m, first);
        const token = Number(m[1]);
        assert.equal(await flock.acquire(k, { ttlMs: 5000 }), null);
        const closed = await stat(server, "bound_closed");
        const waiter = flock.acquire(k, { ttlMs: 5000, waitMs: 20000 });
        await server.waitBlocked(1);
        const t0 = performance.now();
        child.kill("SIGKILL"); // inside the block: no release is ever sent
        const lease = await waiter;
        const waited = performance.now() - t0;
        assert.ok(lease);
        assert.ok(waited < 5000, `granted ${waited.toFixed(0)} ms after the holder died (ttl ${ttl})`);
        assert.ok(lease.token > token);
        assert.equal(await stat(server, "bound_closed"), closed + 1);
        assert.equal(await lease.release(), true);
      } finally {
        child.kill("SIGKILL");
      }
    });
  });
}
