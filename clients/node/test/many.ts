// docs/CLIENTS.md scenario M.1: several keys at once (acquireMany / withLocks over
// FLOCK.MACQUIRE), once per client library, against real servers with the module.
import assert from "node:assert/strict";
import { performance } from "node:perf_hooks";
import { after, before, describe, test } from "node:test";
import { Flock, InvalidArgumentError, keySlot, LockBusyError, LockLostError, LockNotDurableError, type Lease } from "redis-flock";
import type { Lib } from "./libs.js";
import { Cluster, Server, sleep, until } from "./servers.js";
import { libKey } from "./suite.js";

const commandCalls = async (s: Server, cmd: string): Promise<number> =>
  Number(new RegExp(`^cmdstat_${cmd.replace(".", "\\.")}:calls=(\\d+)`, "m").exec(await s.admin.info("commandstats"))?.[1] ?? 0);

/** Whether a promise has settled yet (without waiting for it). */
async function settled(p: Promise<unknown>): Promise<boolean> {
  const mark = Symbol("pending");
  return (await Promise.race([p.then(() => 1, () => 1), sleep(0).then(() => mark)])) !== mark;
}

export function manySuite(lib: Lib): void {
  describe(`redis-flock several keys (M.1) on ${lib.name}`, () => {
    let server: Server;
    let client: any;
    let flock: Flock;
    let n = 0;
    // One hash tag per test: the keys of one call share a slot, as a cluster needs.
    const keys = (count: number) => {
      const tag = `{many:${libKey(lib)}:${++n}}`;
      return Array.from({ length: count }, (_, i) => `${tag}:${String.fromCharCode(97 + i)}`);
    };
    const held = async (k: string): Promise<Array<[string, number, number]>> => (await server.admin.call("FLOCK.HOLDERS", k)) as any;

    before(async () => {
      server = await Server.start();
      client = await lib.client(server.port);
      flock = new Flock(client);
    });
    after(async () => {
      await lib.close(client);
      server.kill();
    });

    test("M.1 all free: one ordinary lease per key, in order, fenced and watched, released together", async () => {
      const ks = keys(3);
      const leases = await flock.acquireMany(ks, { ttlMs: 5000, owner: "batch" });
      assert.ok(leases);
      assert.deepEqual(leases.map((l) => l.key), ks);
      for (const l of leases) {
        assert.equal(l.owner, "batch");
        assert.equal(l.kind, "exclusive");
        assert.deepEqual((await held(l.key)).map(([o, t]) => [o, t]), [["batch", l.token]]);
        const server_ms = Number(await server.admin.call("FLOCK.CHECK", l.key, l.token));
        assert.ok(l.remainingMs() <= server_ms, `rule 1: ${l.remainingMs()} <= ${server_ms}`);
      }
      // New tokens grow in the order the keys are given (SPEC "MACQUIRE").
      assert.ok(leases[0].token < leases[1].token && leases[1].token < leases[2].token);
      // Fenced writes go through with each lease's own token.
      assert.equal(await leases[1].fenced("SET", `${ks[1]}:data`, "x"), "OK");
      // Rule 11: a key of the batch is held by this Flock with this owner.
      await assert.rejects(flock.acquire(ks[0], { ttlMs: 1000, owner: "batch" }), LockBusyError);
      // Rule 9: each lease is watched; revoking one is heard by that one alone.
      await until("all watched", () => leases.every((l) => flock._watcher._watching(l.key, l.token)));
      assert.equal(await server.admin.call("FLOCK.REVOKE", ks[2]), 1);
      assert.equal(await leases[2].waitLost(5000), true);
      assert.equal(leases[2].lostReason, "revoked");
      assert.equal(leases[0].lost || leases[1].lost, false);
      assert.deepEqual(await Promise.all(leases.map((l) => l.release())), [true, true, false]);
      for (const k of ks) assert.deepEqual(await held(k), []);
    });

    test("M.1 one key held by another owner: null, and nothing taken", async () => {
      const ks = keys(3);
      await server.admin.call("FLOCK.ACQUIRE", ks[1], "other", 5000);
      const before = Number((await server.admin.info("flock")).match(/^flock_grants:(\d+)/m)?.[1]);
      assert.equal(await flock.acquireMany(ks, { ttlMs: 5000 }), null);
      assert.deepEqual(await held(ks[0]), []);
      assert.deepEqual(await held(ks[2]), []);
      assert.equal((await held(ks[1]))[0][0], "other");
      const grants = Number((await server.admin.info("flock")).match(/^flock_grants:(\d+)/m)?.[1]);
      assert.equal(grants, before, "no grant was made");
      // A wait not granted in time also answers null and takes nothing.
      const t0 = performance.now();
      assert.equal(await flock.acquireMany(ks, { ttlMs: 5000, waitMs: 200 }), null);
      assert.ok(performance.now() - t0 >= 190);
      assert.deepEqual(await held(ks[0]), []);
      await server.admin.call("FLOCK.RELEASE", ks[1], "other");
    });

    test("M.1 waiting for all at once: granted only when the last key frees, counted from a RENEW", async () => {
      const ks = keys(3);
      await server.admin.call("FLOCK.ACQUIRE", ks[0], "x", 10000);
      await server.admin.call("FLOCK.ACQUIRE", ks[2], "y", 10000);
      const renews = await commandCalls(server, "flock.renew");
      const p = flock.acquireMany(ks, { ttlMs: 3000, waitMs: 20000 });
      await server.waitBlocked(1);
      // It waits in every key's queue at once, the free one too (which nobody may take meanwhile).
      for (const k of ks) assert.equal(((await server.admin.call("FLOCK.WAITERS", k)) as unknown[]).length, 1);
      assert.equal(await server.admin.call("FLOCK.ACQUIRE", ks[1], "z", 1000), null);
      await server.admin.call("FLOCK.RELEASE", ks[0], "x");
      await sleep(100);
      assert.equal(await settled(p), false, "still waiting for the last key");
      assert.deepEqual(await held(ks[0]), [], "nothing granted while one key is held");
      await server.admin.call("FLOCK.RELEASE", ks[2], "y");
      const leases = await p;
      assert.ok(leases);
      assert.deepEqual(leases.map((l) => l.key), ks);
      // Rule 1 (1.3): each grant after a wait was confirmed by a token-qualified RENEW.
      assert.ok((await commandCalls(server, "flock.renew")) >= renews + ks.length);
      for (const l of leases) {
        const server_ms = Number(await server.admin.call("FLOCK.CHECK", l.key, l.token));
        assert.ok(server_ms > 0 && l.remainingMs() <= server_ms);
      }
      // The watchdog keeps every lease past its ttl.
      await sleep(3500);
      for (const l of leases) assert.ok(Number(await server.admin.call("FLOCK.CHECK", l.key, l.token)) > 0, `${l.key} renewed`);
      for (const l of leases) assert.equal(await l.release(), true);
    });

    test("M.1 withLocks: scope exit releases every key (also when fn throws); not granted -> LockBusyError; a loss -> LockLostError", async () => {
      const ks = keys(2);
      let seen: Lease[] = [];
      const out = await flock.withLocks(ks, { ttlMs: 5000 }, async (leases, signal) => {
        seen = leases;
        assert.equal(signal.aborted, false);
        for (const l of leases) assert.equal((await held(l.key)).length, 1);
        return 42;
      });
      assert.equal(out, 42);
      assert.ok(seen.length === 2 && seen.every((l) => l.released));
      for (const k of ks) assert.deepEqual(await held(k), []);

      const boom = new Error("boom");
      await assert.rejects(flock.withLocks(ks, { ttlMs: 5000 }, () => { throw boom; }), (e) => e === boom);
      for (const k of ks) assert.deepEqual(await held(k), []);

      await server.admin.call("FLOCK.ACQUIRE", ks[1], "other", 5000);
      let ran = false;
      await assert.rejects(flock.withLocks(ks, { ttlMs: 5000 }, () => { ran = true; }), LockBusyError);
      assert.equal(ran, false);
      assert.deepEqual(await held(ks[0]), []);
      await server.admin.call("FLOCK.RELEASE", ks[1], "other");

      // A loss of one key aborts the scope's signal and rejects on leaving; the other is released.
      await assert.rejects(
        flock.withLocks(ks, { ttlMs: 5000 }, async (leases, signal) => {
          // (Once its WATCH is armed: a revoke before that is heard as `gone`.)
          await until("watched", () => flock._watcher._watching(leases[0].key, leases[0].token));
          await server.admin.call("FLOCK.REVOKE", leases[0].key);
          await until("signal aborted", () => signal.aborted);
          assert.ok(signal.reason instanceof LockLostError);
        }),
        (e) => e instanceof LockLostError && e.key === ks[0] && e.reason === "revoked",
      );
      for (const k of ks) assert.deepEqual(await held(k), []);
    });

    test("M.2 bound: every grant on one connection of their own; releasing one keeps the others; a kill loses the rest (closed)", async () => {
      const ks = keys(3);
      const leases = await flock.acquireMany(ks, { ttlMs: 5000, bound: true });
      assert.ok(leases);
      assert.ok(leases.every((l) => l.bound));
      // The shared connection: the one whose last command was the MACQUIRE (no renewal yet).
      const lines = String(await server.admin.call("CLIENT", "LIST")).trim().split("\n");
      const mine = lines.filter((l) => / cmd=flock\.macquire /.test(l));
      assert.equal(mine.length, 1, "one connection for every bound grant");
      const id = /\bid=(\d+)/.exec(mine[0])![1];
      assert.equal(await leases[0].release(), true);
      await sleep(50);
      for (const l of leases.slice(1)) assert.ok(Number(await server.admin.call("FLOCK.CHECK", l.key, l.token)) > 0, "still held");
      assert.equal(await server.admin.call("CLIENT", "KILL", "ID", id), 1);
      for (const l of leases.slice(1)) {
        assert.equal(await l.waitLost(5000), true);
        assert.equal(l.lostReason, "closed");
      }
      for (const k of ks) await until(`${k} free`, async () => (await held(k)).length === 0);
      for (const l of leases.slice(1)) assert.equal(await l.release(), false);
    });

    test("M.4 rule 11: a key of the set this Flock holds with the same owner: LockBusyError at once, nothing taken, the held lease intact", async () => {
      const ks = keys(3);
      const mine = await flock.acquire(ks[1], { ttlMs: 5000, owner: "me" });
      assert.ok(mine);
      const calls = await commandCalls(server, "flock.macquire");
      const t0 = performance.now();
      await assert.rejects(flock.acquireMany(ks, { ttlMs: 5000, owner: "me", waitMs: 5000 }), LockBusyError);
      await assert.rejects(flock.withLocks(ks, { ttlMs: 5000, owner: "me" }, () => 1), LockBusyError);
      assert.ok(performance.now() - t0 < 1000, "at once");
      assert.equal(await commandCalls(server, "flock.macquire"), calls, "nothing sent");
      assert.deepEqual(await held(ks[0]), []);
      assert.deepEqual((await held(ks[1])).map(([o, t]) => [o, t]), [["me", mine.token]]);
      assert.equal(mine.lost, false);
      assert.equal(await mine.release(), true);
      const leases = await flock.acquireMany(ks, { ttlMs: 5000, owner: "me" });
      assert.ok(leases && leases.every((l) => l.owner === "me"));
      for (const l of leases) assert.equal(await l.release(), true);
    });

    test("M.1 argument errors (rule 12): InvalidArgumentError, nothing sent", async () => {
      const calls = await commandCalls(server, "flock.macquire");
      const many = Array.from({ length: 65 }, (_, i) => `{t}:${i}`);
      const bad: Array<[unknown, unknown]> = [
        [[], { ttlMs: 1000 }],
        [["{t}:a", "{t}:a"], { ttlMs: 1000 }],
        [many, { ttlMs: 1000 }],
        ["{t}:a", { ttlMs: 1000 }],
        [["{t}:a", ""], { ttlMs: 1000 }],
        [["{t}:a"], { ttlMs: 1000, shared: true }],
        [["{t}:a"], { ttlMs: 1000, limit: 2 }],
        [["{t}:a"], { ttlMs: 1000, reentrant: true }],
        [["{t}:a"], { ttlMs: 1000, bound: true, replicas: 1 }],
        [["{t}:a"], { ttlMs: 1000, bound: true, fsync: true }],
        [["{t}:a"], { ttlMs: 1000, replicas: -1 }],
        [["{t}:a"], { ttlMs: 1000, fsync: "yes" }],
        [["{t}:a"], { ttlMs: 1000, replicas: 1, durableTimeoutMs: 0 }],
        [["{t}:a"], { ttlMs: 1000, ttl: 5 }],
        [["{t}:a"], { ttlMs: 0 }],
        [["{t}:a"], { ttlMs: 1000, waitMs: -1 }],
        [["{t}:a"], { ttlMs: 1000, owner: "" }],
        [["{t}:a"], null],
      ];
      for (const [ks, o] of bad) {
        await assert.rejects(flock.acquireMany(ks as string[], o as any), InvalidArgumentError, JSON.stringify([ks, o]).slice(0, 80));
      }
      await assert.rejects(flock.withLocks([], { ttlMs: 1000 }, () => 1), InvalidArgumentError);
      // 64 keys is the limit, and allowed.
      const ok = await flock.acquireMany(many.slice(0, 64), { ttlMs: 2000 });
      assert.equal(ok?.length, 64);
      await Promise.all(ok!.map((l) => l.release()));
      assert.equal(await commandCalls(server, "flock.macquire"), calls + 1, "only the valid call was sent");
    });

    test("M.1 in a cluster: keys of one slot are granted on its master; keys of two slots refused before sending", async () => {
      const cluster = await Cluster.start();
      const cc = await lib.cluster(cluster.nodes[0].port);
      try {
        const cf = new Flock(cc);
        const tag = `{m1-${libKey(lib)}}`;
        const ks = [`${tag}:a`, `${tag}:b`];
        const leases = await cf.acquireMany(ks, { ttlMs: 5000 });
        assert.ok(leases);
        const owner = await cluster.ownerOf(keySlot(ks[0]));
        for (const l of leases) assert.ok(Number(await owner.admin.call("FLOCK.CHECK", l.key, l.token)) > 0);
        // Waiting on the slot's master.
        await owner.admin.call("FLOCK.RELEASE", ks[1], leases[1].owner);
        await owner.admin.call("FLOCK.ACQUIRE", ks[1], "other", 10000);
        await leases[0].release();
        const p = cf.acquireMany(ks, { ttlMs: 5000, waitMs: 20000 });
        await owner.waitBlocked(1);
        await owner.admin.call("FLOCK.RELEASE", ks[1], "other");
        const got = await p;
        assert.ok(got);
        for (const l of got) assert.equal(await l.release(), true);
        let a = "x0", b = "x1";
        for (let i = 2; keySlot(a) === keySlot(b); i++) b = `x${i}`;
        await assert.rejects(cf.acquireMany([a, b], { ttlMs: 1000 }), InvalidArgumentError);
      } finally {
        await lib.close(cc);
        cluster.kill();
      }
    });
  });

  describe(`redis-flock several keys, durable (M.3) on ${lib.name}`, () => {
    let master: Server;
    let replica: Server;
    let client: any;
    let flock: Flock;
    let n = 0;
    const keys = () => {
      const tag = `{dmany:${libKey(lib)}:${++n}}`;
      return [`${tag}:a`, `${tag}:b`, `${tag}:c`];
    };
    const info = (s: Server, k: string) => s.admin.call("FLOCK.INFO", k);

    before(async () => {
      master = await Server.start(["--repl-diskless-sync-delay", "0"]);
      replica = await Server.startReplica(master);
      // The replica streams once the master had its first REPLCONF ACK: a write and a WAIT.
      await master.admin.set("warm-up", "1");
      assert.equal(await master.admin.call("WAIT", "1", "5000"), 1);
      client = await lib.client(master.port);
      flock = new Flock(client);
    });
    after(async () => {
      await lib.close(client);
      replica.kill();
      master.kill();
    });

    test("M.3 durable: replicas 1 with one replica: every grant is on the replica when acquireMany resolves", async () => {
      const ks = keys();
      const leases = await flock.acquireMany(ks, { ttlMs: 6000, replicas: 1 });
      assert.ok(leases);
      for (const l of leases) {
        assert.ok(Number(await replica.admin.call("FLOCK.CHECK", l.key, l.token)) > 0, `${l.key} on the replica`);
        assert.deepEqual(l.durability, { replicas: 1, fsync: false, timeoutMs: 2000 });
      }
      for (const l of leases) assert.equal(await l.release(), true);
    });

    test("M.3 durable: replicas 2 with one replica: LockNotDurableError (1 of 2), every key released, at once and after a wait", async () => {
      const ks = keys();
      const notDurable = (e: unknown) =>
        e instanceof LockNotDurableError && e.acknowledged === 1 && e.asked === 2 && /1 of 2 replicas acknowledged/.test(e.message);
      await assert.rejects(flock.acquireMany(ks, { ttlMs: 6000, replicas: 2, durableTimeoutMs: 300 }), notDurable);
      for (const k of ks) assert.equal(await info(master, k), null, `${k} released`);
      await until("the releases on the replica", async () => {
        for (const k of ks) if ((await info(replica, k)) !== null) return false;
        return true;
      });
      // After a BLOCK wait: the WAIT follows the RENEWs that confirm the grants.
      await master.admin.call("FLOCK.ACQUIRE", ks[2], "other", 10000);
      const p = flock.acquireMany(ks, { ttlMs: 6000, replicas: 2, durableTimeoutMs: 300, waitMs: 10000 });
      await master.waitBlocked(1);
      await master.admin.call("FLOCK.RELEASE", ks[2], "other");
      await assert.rejects(p, notDurable);
      for (const k of ks) assert.equal(await info(master, k), null, `${k} released after the wait`);
    });
  });
}
