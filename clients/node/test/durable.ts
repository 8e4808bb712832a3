// Durable grants (docs/CLIENTS.md rule 10): `replicas`, `fsync`, `durableTimeoutMs`, run once
// per client library against real servers: a Redis master with a replica, a lone Redis master
// (7.0: no WAITAOF), and a Valkey server with appendonly (WAITAOF).
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { after, before, describe, test } from "node:test";
import { Flock, FlockError, InvalidArgumentError, keySlot, LockLostError, LockNotDurableError } from "redis-flock";
import type { Lib } from "./libs.js";
import { Cluster, Server, sleep, valkeyServer, until } from "./servers.js";
import { libKey } from "./suite.js";

const asMap = (reply: unknown): Record<string, unknown> => {
  const a = reply as unknown[];
  const out: Record<string, unknown> = {};
  for (let i = 0; i < a.length; i += 2) out[String(a[i])] = a[i + 1];
  return out;
};

/** INFO commandstats as { command: calls }. */
async function calls(s: Server): Promise<Record<string, number>> {
  const text = await s.admin.info("commandstats");
  return Object.fromEntries([...text.matchAll(/^cmdstat_([^:]+):calls=(\d+)/gm)].map((m) => [m[1], Number(m[2])]));
}

const stat = async (s: Server, field: string): Promise<number> =>
  Number(new RegExp(`^flock_${field}:(\\d+)`, "m").exec(await s.admin.info("flock"))?.[1] ?? 0);

/** Every command MONITOR shows on `s`, with the client address it came from. */
async function watch(s: Server): Promise<{ seen: Array<{ args: string[]; source: string }>; stop: () => void }> {
  const monitor = await s.admin.monitor();
  const seen: Array<{ args: string[]; source: string }> = [];
  monitor.on("monitor", (_time: string, args: string[], source: string) => seen.push({ args, source }));
  return { seen, stop: () => monitor.disconnect() };
}

const notDurable = (fields: Partial<LockNotDurableError>) => (e: unknown) => {
  assert.ok(e instanceof LockNotDurableError, `not a LockNotDurableError: ${String(e)}`);
  assert.ok(e instanceof FlockError && e instanceof Error);
  assert.equal(e.name, "LockNotDurableError");
  for (const [k, v] of Object.entries(fields)) assert.equal((e as any)[k], v, `${k} of ${e.message}`);
  return true;
};

export function durableSuite(lib: Lib): void {
  describe(`redis-flock durable grants on ${lib.name}`, () => {
    let master: Server;
    let replica: Server;
    let lone: Server;
    let client: any;
    let loneClient: any;
    let flock: Flock;
    let loneFlock: Flock;
    let n = 0;
    const key = () => `durable:${libKey(lib)}:${++n}`;

    before(async () => {
      [master, lone] = await Promise.all([Server.start(["--repl-diskless-sync-delay", "0"]), Server.start()]);
      replica = await Server.startReplica(master);
      client = await lib.client(master.port);
      loneClient = await lib.client(lone.port);
      flock = new Flock(client);
      loneFlock = new Flock(loneClient);
    });
    after(async () => {
      await lib.close(client);
      await lib.close(loneClient);
      replica.kill();
      master.kill();
      lone.kill();
    });

    test("10.1 rule 10: replicas 1 with a live replica hands the lease over once the replica holds the grant; ACQUIRE and WAIT on one connection", async (t) => {
      const k = key();
      const mon = await watch(master);
      try {
        const t0 = performance.now();
        const lease = await flock.acquire(k, { ttlMs: 6000, replicas: 1 });
        t.diagnostic(`handed over after ${(performance.now() - t0).toFixed(1)} ms (the first one opens a connection)`);
        assert.ok(lease);
        // Right after the handover, before anything else: the replica has the grant.
        assert.ok(Number(await replica.admin.call("FLOCK.CHECK", k, lease.token)) > 0, "the replica holds the grant");
        const info = asMap(await replica.admin.call("FLOCK.INFO", k));
        assert.equal(info.token, lease.token);
        assert.equal(info.owner, lease.owner);
        assert.deepEqual(lease.durability, { replicas: 1, fsync: false, timeoutMs: 2000 });
        await until("the ACQUIRE and WAIT on the monitor", () => mon.seen.some((e) => e.args[0].toUpperCase() === "WAIT"));
        const acq = mon.seen.findIndex((e) => e.args[0].toUpperCase() === "FLOCK.ACQUIRE" && e.args[1] === k);
        assert.ok(acq >= 0);
        const source = mon.seen[acq].source;
        const next = mon.seen.slice(acq + 1).find((e) => e.source === source);
        assert.deepEqual(next?.args, ["WAIT", "1", "2000"], "the WAIT came next on the ACQUIRE's connection");
        const mainId = Number(await lib.raw(client, ["CLIENT", "ID"]));
        const list = String(await master.admin.call("CLIENT", "LIST", "ID", String(mainId)));
        assert.ok(!list.includes(`addr=${source} `), "not on the caller's own connection (a WAIT may hold it)");
        assert.equal(await lease.release(), true);
        assert.equal(await master.admin.exists(k), 0);
        await until("the release on the replica", async () => (await replica.admin.exists(k)) === 0);
      } finally {
        mon.stop();
      }
    });

    test("10.2 rule 10: replicas 1 on a master without replicas throws LockNotDurableError after about durableTimeoutMs, and the key is free", async (t) => {
      const k = key();
      let t0 = performance.now();
      let thrown: LockNotDurableError | undefined;
      await assert.rejects(
        loneFlock.acquire(k, { ttlMs: 3000, replicas: 1, durableTimeoutMs: 400 }),
        (e: unknown) => {
          thrown = e as LockNotDurableError;
          return notDurable({ operation: "acquire", acknowledged: 0, asked: 1, fsync: false, timeoutMs: 400 })(e);
        },
      );
      let dt = performance.now() - t0;
      t.diagnostic(`LockNotDurableError after ${dt.toFixed(0)} ms (durableTimeoutMs 400): ${thrown!.message}`);
      assert.ok(dt >= 390 && dt < 400 + 1500, `thrown after ${dt.toFixed(0)} ms`);
      assert.match(thrown!.message, /0 of 1 replica acknowledged it within 400 ms; the grant was released/);
      assert.ok(thrown!.token > 0);
      assert.equal(await lone.admin.exists(k), 0, "the grant was released");
      assert.equal(Number(await lone.admin.call("FLOCK.CHECK", k, thrown!.token)), 0);
      // Default: a third of the ttl; withLock rejects the same way and never runs its block.
      t0 = performance.now();
      let ran = false;
      await assert.rejects(
        loneFlock.withLock(k, { ttlMs: 900, replicas: 1 }, async () => {
          ran = true;
        }),
        notDurable({ acknowledged: 0, asked: 1, timeoutMs: 300 }),
      );
      dt = performance.now() - t0;
      assert.ok(dt >= 290 && dt < 300 + 1500, `default timeout: thrown after ${dt.toFixed(0)} ms`);
      assert.equal(ran, false);
      assert.equal(await lone.admin.exists(k), 0);
      // The key is free: a plain lease gets it at once.
      const plain = await loneFlock.acquire(k, { ttlMs: 1000 });
      assert.ok(plain);
      assert.equal(await plain.release(), true);
    });

    test("10.2 rule 10: replicas 2 with one replica throws LockNotDurableError (1 of 2), and the key is free", async () => {
      const k = key();
      await assert.rejects(
        flock.acquire(k, { ttlMs: 3000, replicas: 2, durableTimeoutMs: 300 }),
        (e: unknown) => notDurable({ acknowledged: 1, asked: 2 })(e) && /1 of 2 replicas acknowledged/.test((e as Error).message),
      );
      assert.equal(await master.admin.exists(k), 0);
      await until("the release on the replica", async () => (await replica.admin.exists(k)) === 0);
    });

    test("10.3 rule 10: fsync on a server without WAITAOF (Redis 7.0) throws a clear error before anything is sent; asked once per Flock", async () => {
      assert.deepEqual(await lone.admin.call("COMMAND", "INFO", "WAITAOF"), [null], "this test needs a server without WAITAOF");
      const k = key();
      const fresh = new Flock(loneClient);
      await lone.admin.call("CONFIG", "RESETSTAT");
      for (let i = 0; i < 2; i++) {
        await assert.rejects(
          fresh.acquire(k, { ttlMs: 1000, fsync: true }),
          (e: unknown) =>
            e instanceof FlockError && !(e instanceof LockNotDurableError) && e.name === "FlockError" &&
            /fsync: true needs WAITAOF \(Redis 7\.2 or later, or Valkey\)/.test(e.message),
        );
      }
      await assert.rejects(fresh.acquire(k, { ttlMs: 1000, fsync: true, replicas: 1, waitMs: 500 }), /needs WAITAOF/);
      const c = await calls(lone);
      assert.equal(c["flock.acquire"], undefined, "no ACQUIRE was sent");
      assert.equal(c["command|info"], 1, "COMMAND INFO WAITAOF asked once");
      assert.equal(await lone.admin.exists(k), 0, "the key was never created");
    });

    test("rule 10: fsync on Valkey with appendonly: handed over once the AOF has it; short replicas and appendonly off are refused and released", async () => {
      const vk = await Server.start(["--appendonly", "yes", "--appendfsync", "everysec"], { bin: valkeyServer() });
      const vc = await lib.client(vk.port);
      try {
        const vf = new Flock(vc);
        const k = key();
        const lease = await vf.acquire(k, { ttlMs: 6000, fsync: true });
        assert.ok(lease);
        assert.deepEqual(lease.durability, { replicas: 0, fsync: true, timeoutMs: 2000 });
        assert.equal((await calls(vk))["waitaof"], 1);
        // On disk by now (WAITAOF answered local 1): the AOF holds the grant.
        const aofDir = join(vk.dir, "appendonlydir");
        const aof = readdirSync(aofDir).map((f) => readFileSync(join(aofDir, f), "latin1")).join("");
        assert.ok(aof.includes(k) && aof.includes(String(lease.token)), "the AOF has the grant");
        // Renewals wait for the AOF too.
        await lease.renew();
        assert.equal((await calls(vk))["waitaof"], 2);
        assert.equal(await lease.release(), true);

        // fsync and replicas: the AOF has it, no replica does.
        const k2 = key();
        await assert.rejects(
          vf.acquire(k2, { ttlMs: 3000, fsync: true, replicas: 1, durableTimeoutMs: 300 }),
          (e: unknown) =>
            notDurable({ acknowledged: 0, asked: 1, fsync: true, fsynced: true })(e) && /0 of 1 replica acknowledged it/.test((e as Error).message),
        );
        assert.equal(await vk.admin.exists(k2), 0);

        // appendonly off: the server refuses WAITAOF 1 after the grant: released, and the error says why.
        await vk.admin.call("CONFIG", "SET", "appendonly", "no");
        const k3 = key();
        await assert.rejects(
          vf.acquire(k3, { ttlMs: 3000, fsync: true }),
          (e: unknown) => e instanceof FlockError && !(e instanceof LockNotDurableError) && /was released: the server refused WAITAOF: .*appendonly/i.test((e as Error).message),
        );
        assert.equal(await vk.admin.exists(k3), 0);
      } finally {
        await lib.close(vc);
        vk.kill();
      }
    });

    test("10.3 rule 10: bound with replicas or fsync, and bad durable options, are refused before anything is sent", async () => {
      const k = key();
      await lone.admin.call("CONFIG", "RESETSTAT");
      const bad: Array<[object, RegExp]> = [
        [{ bound: true, replicas: 1 }, /bound excludes replicas and fsync: a bound grant ends at any promotion/],
        [{ bound: true, fsync: true }, /bound excludes replicas and fsync/],
        [{ replicas: -1 }, /replicas must be a non-negative integer, got -1/],
        [{ replicas: 1.5 }, /replicas must be a non-negative integer/],
        [{ replicas: "1" }, /replicas must be a non-negative integer/],
        [{ fsync: "yes" }, /fsync must be a boolean/],
        [{ replicas: 1, durableTimeoutMs: 0 }, /durableTimeoutMs must be a positive integer/],
        [{ replicas: 1, durableTimeoutMs: 2.5 }, /durableTimeoutMs must be a positive integer/],
      ];
      for (const [opts, re] of bad) {
        await assert.rejects(loneFlock.acquire(k, { ttlMs: 1000, ...opts } as any), (e: unknown) => e instanceof InvalidArgumentError && re.test((e as Error).message));
      }
      const c = await calls(lone);
      assert.equal(c["flock.acquire"], undefined, "nothing was sent");
      assert.equal(await lone.admin.exists(k), 0);
      // replicas 0 without fsync is a plain lease, bound or not.
      const b = await loneFlock.acquire(k, { ttlMs: 1000, bound: true, replicas: 0, fsync: false });
      assert.ok(b);
      assert.equal(b.durability, null);
      assert.equal(await b.release(), true);
    });

    test("rule 10: a durable renewal moves the local deadline; one that falls short (replica SIGSTOPped) leaves it where it was", async (t) => {
      const k = key();
      const lease = await flock.acquire(k, { ttlMs: 4000, replicas: 1, renew: false, durableTimeoutMs: 400 });
      assert.ok(lease);
      await sleep(600);
      const before = lease.remainingMs();
      await lease.renew();
      const renewed = lease.remainingMs();
      assert.ok(renewed > before + 400, `renewed: ${before} -> ${renewed} ms left`);
      assert.ok(Number(await replica.admin.call("FLOCK.CHECK", k, lease.token)) > before + 400, "the replica has the renewal");

      replica.pause();
      try {
        await sleep(300);
        const r0 = lease.remainingMs();
        const t0 = performance.now();
        let thrown: LockNotDurableError | undefined;
        await assert.rejects(lease.renew(), (e: unknown) => {
          thrown = e as LockNotDurableError;
          return notDurable({ operation: "renew", acknowledged: 0, asked: 1, token: lease.token })(e);
        });
        const dt = performance.now() - t0;
        const r1 = lease.remainingMs();
        t.diagnostic(`short renewal after ${dt.toFixed(0)} ms: ${r0} -> ${r1} ms left; ${thrown!.message}`);
        assert.ok(dt >= 390, `the WAIT waited ${dt.toFixed(0)} ms`);
        assert.match(thrown!.message, /the lease keeps the deadline of its last durable renewal/);
        assert.ok(r1 <= r0 - 350, `the local deadline moved: ${r0} -> ${r1}`);
        assert.equal(lease.lost, false, "a short renewal does not lose the lease");
        const onMaster = Number(await master.admin.call("FLOCK.CHECK", k, lease.token));
        // The two deadlines differ by the time between the renewals (the 300 ms sleep and a
        // little more): 300 itself was seen on a loaded machine, so leave room below it.
        assert.ok(onMaster > r1 + 200, `the master renewed it (${onMaster} ms) but the client kept ${r1} ms`);
      } finally {
        replica.resume();
      }
      // Acknowledged again: the deadline moves.
      await lease.renew();
      assert.ok(lease.remainingMs() > 3500, `after the replica came back: ${lease.remainingMs()} ms left`);
      assert.equal(await lease.release(), true);
    });

    test("rule 10: the watchdog's durable renewals keep the lease with a live replica; with the replica stopped it runs out by its own clock and the grant is handed back", async (t) => {
      const k = key();
      const ttl = 1500;
      const lease = await flock.acquire(k, { ttlMs: ttl, replicas: 1 });
      assert.ok(lease);
      const r0 = await stat(master, "renewals");
      await sleep(2000); // more than a ttl: only acknowledged renewals keep it
      assert.equal(lease.lost, false);
      assert.ok((await stat(master, "renewals")) - r0 >= 3, "the watchdog renewed");
      assert.ok(Number(await replica.admin.call("FLOCK.CHECK", k, lease.token)) > 0);

      const left = lease.remainingMs();
      const r1 = await stat(master, "renewals");
      replica.pause();
      const t0 = performance.now();
      try {
        assert.equal(await lease.waitLost(ttl + 2000), true);
        const dt = performance.now() - t0;
        t.diagnostic(`lost ${dt.toFixed(0)} ms after the replica stopped (${left} ms were left)`);
        assert.equal((lease.signal.reason as LockLostError).reason, "deadline-passed");
        assert.ok(dt >= left - 50 && dt <= ttl + 600, `lost after ${dt.toFixed(0)} ms, ${left} ms were left`);
        assert.ok((await stat(master, "renewals")) > r1, "renewals were sent meanwhile, and did not count");
        // The short renewals extended the grant on the master past the local deadline: the
        // client hands it back at once rather than leave it held by nobody.
        await until("the grant handed back", async () => (await master.admin.exists(k)) === 0, 500);
      } finally {
        replica.resume();
      }
      assert.equal(await lease.release(), false);
    });

    test("rule 10: after a BLOCK wait the RENEW and WAIT follow the granting ACQUIRE on its connection; the replica holds the grant at the handover", async () => {
      const k = key();
      assert.ok(await master.admin.call("FLOCK.ACQUIRE", k, "holder", 10000));
      const mon = await watch(master);
      try {
        const waiting = flock.acquire(k, { ttlMs: 3000, waitMs: 10000, replicas: 1 });
        await master.waitBlocked(1);
        assert.equal(await master.admin.call("FLOCK.RELEASE", k, "holder"), 1);
        const lease = await waiting;
        assert.ok(lease);
        assert.ok(Number(await replica.admin.call("FLOCK.CHECK", k, lease.token)) > 0, "the replica holds the grant");
        assert.ok(lease.remainingMs() > 2500);
        await until("the WAIT on the monitor", () => mon.seen.some((e) => e.args[0].toUpperCase() === "WAIT" && mon.seen.some((b) => b.args.includes("BLOCK"))));
        await until("the WAIT after the BLOCK", () => {
          const b = mon.seen.findIndex((e) => e.args.includes("BLOCK"));
          return mon.seen.slice(b + 1).some((e) => e.source === mon.seen[b].source && e.args[0] === "WAIT");
        });
        const b = mon.seen.findIndex((e) => e.args[0].toUpperCase() === "FLOCK.ACQUIRE" && e.args.includes("BLOCK"));
        const after = mon.seen.slice(b + 1).filter((e) => e.source === mon.seen[b].source).slice(0, 2);
        assert.deepEqual(after.map((e) => e.args), [
          ["FLOCK.RENEW", k, lease.owner, "3000", String(lease.token)],
          ["WAIT", "1", "1000"],
        ]);
        assert.equal(await lease.release(), true);
      } finally {
        mon.stop();
      }
    });

    test("rule 10: durable round trips one after another reuse one connection of the pool, which closes once the pool went 5 s unused", async () => {
      const own = await lib.client(master.port);
      try {
        const f = new Flock(own);
        // The connections whose last command was a WAIT, by id: the durable pools' own.
        const waiting = async () =>
          [...String(await master.admin.call("CLIENT", "LIST")).matchAll(/^id=(\d+) .* cmd=wait /gm)].map((m) => m[1]);
        const before = new Set(await waiting());
        const mine = async () => (await waiting()).filter((id) => !before.has(id));
        const once = async () => {
          const lease = await f.acquire(key(), { ttlMs: 6000, replicas: 1, renew: false });
          assert.ok(lease);
          assert.equal(await lease.release(), true);
        };
        await once(); // opens the pool's connection
        const [pooled, ...more] = await mine();
        assert.ok(pooled !== undefined && more.length === 0, `one pool connection, not ${[pooled, ...more]}`);
        for (let i = 0; i < 20; i++) await once();
        assert.deepEqual(await mine(), [pooled], "the same connection for 21 durable locks in a row");
        // Used every 2 s, past 5 s after the first use: still the same connection.
        for (let i = 0; i < 4; i++) {
          await sleep(2000);
          await once();
        }
        assert.deepEqual(await mine(), [pooled], "kept while in use");
        await sleep(4000);
        assert.deepEqual(await mine(), [pooled], "kept until 5 s after the last use");
        await until("the idle pool connection closed", async () => (await mine()).length === 0, 3000);
      } finally {
        await lib.close(own);
      }
    });

    test("rule 10: a WAIT that times out does not hold up the caller's connection", async () => {
      const k = key();
      const guard = await loneFlock.acquire(key(), { ttlMs: 600 }); // a plain lease renewing meanwhile
      assert.ok(guard);
      const t0 = performance.now();
      const pending = loneFlock.acquire(k, { ttlMs: 6000, replicas: 1, durableTimeoutMs: 1500 });
      await sleep(100);
      const p0 = performance.now();
      assert.equal(await lib.raw(loneClient, ["PING"]), "PONG");
      const ping = performance.now() - p0;
      assert.ok(ping < 300, `PING on the caller's client took ${ping.toFixed(0)} ms while the WAIT waited`);
      await assert.rejects(pending, notDurable({ acknowledged: 0, asked: 1 }));
      assert.ok(performance.now() - t0 >= 1490);
      assert.equal(guard.lost, false, "the plain lease kept renewing");
      assert.equal(await guard.release(), true);
      assert.equal(await lone.admin.exists(k), 0);
    });

    test("rule 10 on a cluster: the WAIT reaches the key's master right after the ACQUIRE, also after the slot moved", async () => {
      const cluster = await Cluster.start();
      const cc = await lib.cluster(cluster.nodes[0].port);
      try {
        const cf = new Flock(cc);
        const k = `{durable-${libKey(lib)}}:lock`;
        const slot = keySlot(k);
        const waits = async () => Promise.all(cluster.nodes.map(async (x) => (await calls(x))["wait"] ?? 0));
        const src = await cluster.ownerOf(slot);
        // No replicas in this cluster: not durable, released, and the WAIT ran on the key's master.
        await assert.rejects(cf.acquire(k, { ttlMs: 3000, replicas: 1, durableTimeoutMs: 200 }), notDurable({ acknowledged: 0, asked: 1 }));
        assert.deepEqual(await waits(), cluster.nodes.map((x) => (x === src ? 1 : 0)));
        assert.equal(await src.admin.exists(k), 0);
        // Move the (empty) slot: the pool's cluster connection still routes to the old master,
        // is told MOVED, and sends ACQUIRE + WAIT again to the new one.
        const dst = cluster.nodes.find((x) => x !== src)!;
        const dstId = await cluster.nodeId(dst);
        for (const node of [dst, src, ...cluster.nodes.filter((x) => x !== src && x !== dst)]) {
          await node.admin.call("CLUSTER", "SETSLOT", slot, "NODE", dstId);
        }
        await assert.rejects(cf.acquire(k, { ttlMs: 3000, replicas: 1, durableTimeoutMs: 200 }), notDurable({ acknowledged: 0, asked: 1 }));
        // The old master answered the ACQUIRE with MOVED (and ran the WAIT behind it, whose
        // count was dropped); the new one ran both.
        assert.ok(Number(/errorstat_MOVED:count=(\d+)/.exec(await src.admin.info("errorstats"))?.[1] ?? 0) >= 1, "redirected");
        assert.deepEqual(await waits(), cluster.nodes.map((x) => (x === src ? 2 : x === dst ? 1 : 0)));
        assert.equal((await calls(dst))["flock.acquire"], 1);
        assert.equal(await dst.admin.exists(k), 0);
        // M.3 in a cluster: acquireMany's MACQUIRE names numkeys first; it and its WAIT are
        // routed by the keys' slot, to its master; not durable there: every key released.
        // As many keys as make numkeys, read as a key, name a slot of another master.
        let count = 2;
        while ((await cluster.ownerOf(keySlot(String(count)))) === dst) count++;
        const ks = Array.from({ length: count }, (_, i) => `{durable-${libKey(lib)}}:${i}`);
        await assert.rejects(cf.acquireMany(ks, { ttlMs: 3000, replicas: 1, durableTimeoutMs: 200 }), notDurable({ acknowledged: 0, asked: 1 }));
        assert.deepEqual(await waits(), cluster.nodes.map((x) => (x === src ? 2 : x === dst ? 2 : 0)));
        assert.equal((await calls(dst))["flock.macquire"], 1);
        assert.equal(await dst.admin.exists(...ks), 0);
      } finally {
        await lib.close(cc);
        cluster.kill();
      }
    });
  });
}
