// docs/CLIENTS.md scenarios E.1-E.5: leader election over one key, once per client library.
import assert from "node:assert/strict";
import { performance } from "node:perf_hooks";
import { after, before, describe, test } from "node:test";
import { Flock, LockBusyError, type Leader, type LeaderObserver } from "redis-flock";
import type { Lib } from "./libs.js";
import { Server, sleep } from "./servers.js";
import { libKey } from "./suite.js";

/** Takes the next value of an observer, failing after `ms`. */
async function nextOf(obs: LeaderObserver, ms = 10000): Promise<Leader | null> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, rej) => (timer = setTimeout(() => rej(new Error(`no leader change within ${ms} ms`)), ms)));
  try {
    const r = await Promise.race([obs.next(), timeout]);
    assert.equal(r.done, false);
    return r.value as Leader | null;
  } finally {
    clearTimeout(timer);
  }
}

const commandCalls = async (s: Server, cmd: string): Promise<number> =>
  Number(new RegExp(`^cmdstat_${cmd.replace(".", "\\.")}:calls=(\\d+)`, "m").exec(await s.admin.info("commandstats"))?.[1] ?? 0);

export function electionSuite(lib: Lib): void {
  describe(`redis-flock election on ${lib.name}`, () => {
    let server: Server;
    let client: any;
    let flock: Flock;
    let n = 0;
    const key = () => `leader:${libKey(lib)}:${++n}`;

    before(async () => {
      server = await Server.start();
      client = await lib.client(server.port);
      flock = new Flock(client);
    });
    after(async () => {
      await lib.close(client);
      server.kill();
    });

    test("E.1 campaign() on a free key leads at once; leader() names it", async () => {
      const k = key();
      const e = flock.election(k, 5000, { owner: "node-1" });
      assert.equal(await e.leader(), null);
      const lease = await e.campaign();
      assert.equal(lease.bound, true);
      assert.deepEqual(await e.leader(), { owner: "node-1", token: lease.token });
      assert.equal(e.lease, lease);
      assert.equal(await e.resign(), true);
      assert.equal(await e.leader(), null);
      assert.equal(await e.resign(), false);
    });

    test("E.2 a second candidate waits in line and leads when the first resigns; E.3 observe() follows, one WATCH at a time", async () => {
      const k = key();
      const obs = flock.election(k, 5000).observe();
      try {
        assert.equal(await nextOf(obs), null, "first the current state: free");
        const a = flock.election(k, 5000, { owner: "a" });
        const b = flock.election(k, 5000, { owner: "b" });
        const la = await a.campaign();
        assert.deepEqual(await nextOf(obs), { owner: "a", token: la.token });
        const bLeads = b.campaign(20000);
        await server.waitBlocked(1);
        // (The rule-9 watcher's WATCH of a's lease is armed by now: only the observer's counts.)
        while (!flock._watcher._watching(k, la.token)) await sleep(5);
        const watches = await commandCalls(server, "flock.watch");
        await sleep(500); // no polling meanwhile: no further WATCH, no INFO loop
        assert.equal(await commandCalls(server, "flock.watch"), watches);
        assert.equal(await a.resign(), true);
        const lb = await bLeads;
        assert.deepEqual(await nextOf(obs), { owner: "b", token: lb.token });
        assert.ok(lb.token > la.token);
        await b.resign();
        assert.equal(await nextOf(obs), null);
      } finally {
        await obs.return();
      }
    });

    test("E.4 a leader whose connection dies (BOUND) is replaced, and observe() sees it", async () => {
      const k = key();
      const other = await lib.client(server.port, "doomed");
      const obs = flock.election(k, 30000).observe();
      try {
        assert.equal(await nextOf(obs), null);
        const first = new Flock(other).election(k, 30000, { owner: "doomed" });
        const lf = await first.campaign();
        assert.deepEqual(await nextOf(obs), { owner: "doomed", token: lf.token });
        const next = flock.election(k, 30000, { owner: "heir" });
        const heir = next.campaign();
        await server.waitBlocked(1);
        const t0 = performance.now();
        // The leader's connection dies (as with its process): the server ends the bound grant.
        const list = String(await server.admin.call("CLIENT", "LIST")).trim().split("\n");
        const bound = list.filter((l) => / name=doomed /.test(l) && / cmd=flock\.acquire /.test(l));
        assert.equal(bound.length, 1, list.join("\n"));
        await server.admin.call("CLIENT", "KILL", "ID", /^id=(\d+)/.exec(bound[0])![1]);
        const lh = await heir;
        assert.ok(performance.now() - t0 < 5000, "the heir leads long before the 30 s ttl");
        const seen = await nextOf(obs);
        // The observer may see the key free for a moment (null) before the heir's grant.
        const final = seen === null ? await nextOf(obs) : seen;
        assert.deepEqual(final, { owner: "heir", token: lh.token });
        assert.equal(await lf.waitLost(5000), true);
        assert.equal(lf.lostReason, "closed");
        await next.resign();
      } finally {
        obs.close();
        await lib.close(other);
      }
    });

    test("E.5 campaign(waitMs) not leading in time: LockBusyError", async () => {
      const k = key();
      const a = flock.election(k, 5000, { owner: "a" });
      await a.campaign();
      const t0 = performance.now();
      await assert.rejects(flock.election(k, 5000, { owner: "b" }).campaign(200), LockBusyError);
      assert.ok(performance.now() - t0 >= 190);
      await a.resign();
    });
  });
}
