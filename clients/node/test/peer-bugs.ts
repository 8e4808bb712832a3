// The peers' worst client-side lock bugs as regression tests, each named after its report
// (docs/CLIENTS.md names them), run once per client library against a real server with the
// module. What the client sent is read from the server's MONITOR, so the tests prove what was
// and was not sent.
import assert from "node:assert/strict";
import { connect, type Socket } from "node:net";
import { performance } from "node:perf_hooks";
import { after, before, describe, test } from "node:test";
import { Flock, LockLostError } from "redis-flock";
import type { Lib } from "./libs.js";
import { Server, sleep, until } from "./servers.js";

/**
 * Every command the server runs, in order, as its arguments: MONITOR on a plain socket. (ioredis's monitor() can
 * fail with "Command queue state error" when a monitored command arrives with the +OK.)
 */
class Monitor {
  readonly seen: string[][] = [];
  #sock!: Socket;
  static async start(s: Server): Promise<Monitor> {
    const m = new Monitor();
    m.#sock = connect(s.port, "127.0.0.1");
    let buf = "";
    let started!: () => void;
    const ok = new Promise<void>((res) => (started = res));
    m.#sock.setEncoding("latin1");
    m.#sock.on("data", (chunk: string) => {
      buf += chunk;
      let nl: number;
      while ((nl = buf.indexOf("\r\n")) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 2);
        if (line === "+OK") started();
        else if (line.startsWith("+")) m.seen.push(monitorArgs(line));
      }
    });
    m.#sock.on("error", () => {});
    m.#sock.write("MONITOR\r\n");
    await ok;
    return m;
  }
  /** The commands named `name` (any case) on `key`. */
  of(name: string, key: string): string[][] {
    return this.seen.filter((a) => a.length > 1 && a[0].toUpperCase() === name && a[1] === key);
  }
  /** The commands after the first one named `name` on `key`. */
  after(name: string, key: string): string[][] {
    const i = this.seen.findIndex((a) => a.length > 1 && a[0].toUpperCase() === name && a[1] === key);
    assert.ok(i >= 0, `no ${name} ${key} seen`);
    return this.seen.slice(i + 1);
  }
  close(): void {
    this.#sock.destroy();
  }
}

const ESCAPES: Record<string, string> = { n: "\n", r: "\r", t: "\t", a: "\x07", b: "\b" };

/** The quoted arguments of a MONITOR line (`+time [db addr] "a" "b"`), unescaped. */
function monitorArgs(line: string): string[] {
  const out: string[] = [];
  let i = line.indexOf("]") + 1;
  while ((i = line.indexOf('"', i)) >= 0) {
    let arg = "";
    i++;
    while (i < line.length && line[i] !== '"') {
      if (line[i] === "\\" && i + 1 < line.length) {
        const c = line[i + 1];
        if (c === "x") {
          arg += String.fromCharCode(parseInt(line.slice(i + 2, i + 4), 16));
          i += 4;
          continue;
        }
        arg += ESCAPES[c] ?? c;
        i += 2;
        continue;
      }
      arg += line[i++];
    }
    out.push(arg);
    i++;
  }
  return out;
}

export function peerBugsSuite(lib: Lib): void {
  describe(`peers' lock bugs on ${lib.name}`, () => {
    let server: Server;
    let client: any;
    let flock: Flock;
    let n = 0;
    const key = (bug: string) => `pb:${bug}:${lib.name.replace(/\W/g, "")}:${++n}`;

    before(async () => {
      server = await Server.start();
      client = await lib.client(server.port, "pb-holder");
      flock = new Flock(client);
    });
    after(async () => {
      await lib.close(client);
      server.kill();
    });

    test("redisson#7272: no RENEW after RELEASE, none after a RENEW answered nil", async () => {
      const mon = await Monitor.start(server);
      try {
        const rel = key("rel");
        const rev = key("rev");
        const mark = key("marker");
        // 600 ms: renewed every 200 ms.
        const lease = await flock.acquire(rel, { ttlMs: 600 });
        assert.ok(lease);
        await until("two renewals", () => mon.of("FLOCK.RENEW", rel).length >= 2);
        assert.equal(await lease.release(), true);
        const revoked = await flock.acquire(rev, { ttlMs: 600 });
        assert.ok(revoked);
        await until("a renewal", () => mon.of("FLOCK.RENEW", rev).length >= 1);
        assert.equal(await server.admin.call("FLOCK.REVOKE", rev), 1);
        assert.equal(await revoked.waitLost(10000), true);
        // A marker lease renews five times meanwhile: renewals of the other two would show.
        const marker = await flock.acquire(mark, { ttlMs: 600 });
        assert.ok(marker);
        await until("five renewals", () => mon.of("FLOCK.RENEW", mark).length >= 5);
        assert.equal(await marker.release(), true);
        await until("the marker's release", () => mon.of("FLOCK.RELEASE", mark).length === 1);
        const late = mon.after("FLOCK.RELEASE", rel).filter((a) => a[0].toUpperCase() === "FLOCK.RENEW" && a[1] === rel);
        assert.deepEqual(late, [], "RENEW after RELEASE");
        // After the REVOKE at most the one RENEW that answered nil.
        const afterLoss = mon.after("FLOCK.REVOKE", rev).filter((a) => a[0].toUpperCase() === "FLOCK.RENEW" && a[1] === rev);
        assert.ok(afterLoss.length <= 1, `renewals after the loss: ${JSON.stringify(afterLoss)}`);
        assert.equal(lease.lost, false);
      } finally {
        mon.close();
      }
    });

    test("etcd#22082: a retried release never ends a newer grant of the same owner", async () => {
      const k = key("22082");
      const old = await flock.acquire(k, { ttlMs: 10000, owner: "same", renew: false });
      assert.ok(old);
      // The first RELEASE ran on the server (its reply lost), then the owner was granted again.
      assert.equal(await server.admin.call("FLOCK.RELEASE", k, "same"), 1);
      const newer = Number(await server.admin.call("FLOCK.ACQUIRE", k, "same", 10000));
      assert.ok(newer > old.token);
      const mon = await Monitor.start(server);
      try {
        assert.equal(await old.release(), false, "the retry finds its own grant gone");
        assert.ok(Number(await server.admin.call("FLOCK.CHECK", k, newer)) > 0, "the newer grant ended");
        // The client may know the grant is gone (rule 9's watch told it) and send nothing;
        // whatever it sent came before the CHECK above, which the monitor shows in order.
        await until("the CHECK on the monitor", () => mon.of("FLOCK.CHECK", k).length >= 1);
        for (const a of mon.of("FLOCK.RELEASE", k)) assert.deepEqual(a.slice(1), [k, "same", String(old.token)]);
      } finally {
        mon.close();
      }
    });

    test("etcd#11456: a waiter granted after its ttl passed holds a whole lease", async () => {
      const k = key("11456");
      assert.ok(await server.admin.call("FLOCK.ACQUIRE", k, "holder", 30000));
      const mon = await Monitor.start(server);
      try {
        const waiting = flock.acquire(k, { ttlMs: 1000, waitMs: 20000, renew: false });
        await server.waitBlocked(1);
        await sleep(2000); // twice the ttl in the queue
        assert.equal(await server.admin.call("FLOCK.RELEASE", k, "holder"), 1);
        const lease = await waiting;
        assert.ok(lease);
        assert.equal(lease.lost, false);
        const left = Number(await server.admin.call("FLOCK.CHECK", k, lease.token));
        assert.ok(left > 0, "the grant after the wait is live on the server");
        assert.ok(lease.remainingMs() <= left);
        await until("the RENEW on the monitor", () => mon.of("FLOCK.RENEW", k).length >= 1);
        const renews = mon.of("FLOCK.RENEW", k);
        assert.equal(renews.length, 1, "one RENEW right after the grant");
        assert.deepEqual(renews[0].slice(1), [k, lease.owner, "1000", String(lease.token)]);
        assert.equal(await lease.release(), true);
      } finally {
        mon.close();
      }
    });

    test("redis-semaphore#175: a renewal after expiry takes nothing", async () => {
      const k = key("175");
      const k2 = key("175b");
      const mon = await Monitor.start(server);
      try {
        // Ran out everywhere: renew() is refused.
        const lease = await flock.acquire(k, { ttlMs: 200, renew: false });
        assert.ok(lease);
        await sleep(500);
        await assert.rejects(lease.renew(), LockLostError);
        assert.equal(lease.lost, true);
        assert.equal(await server.admin.exists(k), 0);
        // Ended on the server while the local deadline is far: the RENEW answers nil.
        const lease2 = await flock.acquire(k2, { ttlMs: 20000, renew: false });
        assert.ok(lease2);
        await server.admin.call("FLOCK.REVOKE", k2);
        await assert.rejects(lease2.renew(), LockLostError);
        assert.equal(lease2.lost, true);
        assert.equal(await server.admin.exists(k2), 0);
        // The key is free for the next owner at once.
        const other = await flock.acquire(k, { ttlMs: 1000 });
        assert.ok(other);
        assert.equal(await other.release(), true);
        await until("the release on the monitor", () => mon.of("FLOCK.RELEASE", k).length >= 1);
        assert.equal(mon.of("FLOCK.ACQUIRE", k).length, 2);
        assert.equal(mon.of("FLOCK.ACQUIRE", k2).length, 1);
        assert.equal(mon.of("FLOCK.RENEW", k).length, 0, "no RENEW after the local deadline");
        for (const a of mon.of("FLOCK.RENEW", k2)) assert.equal(a.length, 5, "token-qualified");
      } finally {
        mon.close();
      }
    });

    test("redisson#2515, #5698: the watchdog survives connection errors", async () => {
      const k = key("5698");
      const mon = await Monitor.start(server);
      try {
        // 900 ms (renewed every 300 ms): each renewal after a kill also reconnects.
        const lease = await flock.acquire(k, { ttlMs: 900 });
        assert.ok(lease);
        for (let round = 0; round < 3; round++) {
          let killed = 0;
          const list = String(await server.admin.call("CLIENT", "LIST", "TYPE", "normal"));
          for (const line of list.trim().split("\n")) {
            if (/ name=pb-holder /.test(` ${line} `)) {
              const id = /id=(\d+)/.exec(line)![1];
              killed += Number(await server.admin.call("CLIENT", "KILL", "ID", id));
            }
          }
          assert.ok(killed >= 1, `round ${round}`);
          const base = mon.of("FLOCK.RENEW", k).length;
          await until("renewals after a kill", () => mon.of("FLOCK.RENEW", k).length >= base + 2 || lease.lost);
          assert.equal(lease.lost, false, `round ${round}`);
        }
        await sleep(2700); // three ttls
        assert.equal(lease.lost, false);
        assert.ok(Number(await server.admin.call("FLOCK.CHECK", k, lease.token)) > 0);
        assert.equal(await lease.release(), true);
      } finally {
        mon.close();
      }
    });

    test("redisson#4698: a renewal that fails for good is loud", async () => {
      // The server stops answering (SIGSTOP) for longer than the lease: the lease is marked
      // lost by its local deadline, and its signal aborts.
      const k = key("4698");
      const lease = await flock.acquire(k, { ttlMs: 900 });
      assert.ok(lease);
      server.pause();
      try {
        const t0 = performance.now();
        assert.equal(await lease.waitLost(10000), true);
        assert.ok(performance.now() - t0 < 2000, "lost late");
        assert.equal(lease.lost, true);
        assert.equal(lease.signal.aborted, true);
      } finally {
        server.resume();
      }
    });
  });
}
