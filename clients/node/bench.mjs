#!/usr/bin/env node
// Added latency of a lock through redis-flock over the raw commands, on loopback.
//   node bench.mjs --port N [--iterations 5000] [--lib ioredis|node-redis|all] [--replicas R] [--loss N]
// A server with the flock module must listen on 127.0.0.1:N. Per iteration, "raw" is
// FLOCK.ACQUIRE key owner ttl + FLOCK.RELEASE key owner token sent by hand on the same client;
// "flock" is flock.acquire() + lease.release() (random owner, lease clock, watchdog timers armed
// and cleared). Both run interleaved on one connection; the report gives median and p99 of each
// and of the difference (target: under 150 us per lock).
// --replicas R: the cost of durable grants instead. The server must be a master with at least
// R replicas; "plain" is flock.acquire() + release(), "durable" the same with { replicas: R }
// (ACQUIRE + WAIT R pipelined on a connection of Flock's pool), "raw" and "raw+WAIT" the
// commands by hand without the client (the floor), interleaved.
// --loss N: rule 9's measurement instead: N REVOKEs of a watched lease (ttl 30 s) and N
// CLIENT KILLs of a BOUND lease's connection (ttl 30 s), each timed from the moment the REVOKE or
// KILL is sent to the lease's AbortSignal firing; p50/p99/max per library. 10 other leases are
// held meanwhile, so the WATCH names 11 keys.
import { performance } from "node:perf_hooks";
import { randomBytes } from "node:crypto";
import { createRequire } from "node:module";
import { Flock } from "./dist/index.js";

const require = createRequire(import.meta.url);
const argv = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = argv.indexOf(`--${name}`);
  return i >= 0 ? argv[i + 1] : dflt;
};
const port = Number(opt("port", process.env.PORT || 6379));
const iterations = Math.max(2000, Number(opt("iterations", 5000)));
const which = opt("lib", "all");
const replicas = Number(opt("replicas", 0));

const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};
const us = (ms) => (ms * 1000).toFixed(1).padStart(8);

async function bench(name, raw, client) {
  const flock = new Flock(client);
  const key = `bench:${name}:${randomBytes(4).toString("hex")}`;
  const rawOnce = async () => {
    const owner = randomBytes(16).toString("hex");
    const t = await raw(["FLOCK.ACQUIRE", key, owner, "30000"]);
    await raw(["FLOCK.RELEASE", key, owner, String(t)]);
  };
  const flockOnce = async () => {
    const lease = await flock.acquire(key, { ttlMs: 30000 });
    await lease.release();
  };
  for (let i = 0; i < 500; i++) {
    await rawOnce();
    await flockOnce();
  }
  const r = [], f = [];
  for (let i = 0; i < iterations; i++) {
    // Alternate the order so that neither side always runs on a warm path.
    if (i & 1) {
      let t0 = performance.now(); await rawOnce(); r.push(performance.now() - t0);
      t0 = performance.now(); await flockOnce(); f.push(performance.now() - t0);
    } else {
      let t0 = performance.now(); await flockOnce(); f.push(performance.now() - t0);
      t0 = performance.now(); await rawOnce(); r.push(performance.now() - t0);
    }
  }
  const d = f.map((x, i) => x - r[i]);
  console.log(
    `${name.padEnd(14)} raw p50 ${us(pct(r, 50))} us  p99 ${us(pct(r, 99))} us | flock p50 ${us(pct(f, 50))} us  p99 ${us(pct(f, 99))} us | added p50 ${us(pct(f, 50) - pct(r, 50))} us  p99 ${us(pct(f, 99) - pct(r, 99))} us  (per-iteration difference p50 ${us(pct(d, 50))} us)`,
  );
  return pct(f, 50) - pct(r, 50);
}

async function benchDurable(name, raw, client) {
  const flock = new Flock(client);
  const key = `bench:${name}:${randomBytes(4).toString("hex")}`;
  const once = async (opts) => {
    const lease = await flock.acquire(key, { ttlMs: 30000, ...opts });
    await lease.release();
  };
  const plainOnce = () => once({});
  const durableOnce = () => once({ replicas });
  // The floor: the raw pair, and the same with WAIT sent right behind the ACQUIRE (both in
  // flight at once), without the client: what the WAIT costs any durable lock on this machine.
  const rawKey = `${key}:raw`;
  const rawOnce = async (wait) => {
    const owner = randomBytes(16).toString("hex");
    const acquire = raw(["FLOCK.ACQUIRE", rawKey, owner, "30000"]);
    let t;
    if (wait) {
      const [token, acked] = await Promise.all([acquire, raw(["WAIT", String(replicas), "1000"])]);
      if (Number(acked) < replicas) throw new Error(`WAIT ${replicas}: ${acked} acknowledged`);
      t = token;
    } else {
      t = await acquire;
    }
    await raw(["FLOCK.RELEASE", rawKey, owner, String(t)]);
  };
  const variants = [plainOnce, durableOnce, () => rawOnce(false), () => rawOnce(true)];
  for (let i = 0; i < 500; i++) for (const v of variants) await v();
  const times = variants.map(() => []);
  for (let i = 0; i < iterations; i++) {
    // Every other iteration in reverse order, so that no variant always runs first.
    const order = i & 1 ? [3, 2, 1, 0] : [0, 1, 2, 3];
    for (const j of order) {
      const t0 = performance.now();
      await variants[j]();
      times[j].push(performance.now() - t0);
    }
  }
  const [p, d, r, w] = times;
  console.log(
    `${name.padEnd(14)} plain p50 ${us(pct(p, 50))} us  p99 ${us(pct(p, 99))} us | replicas:${replicas} p50 ${us(pct(d, 50))} us  p99 ${us(pct(d, 99))} us | added p50 ${us(pct(d, 50) - pct(p, 50))} us  p99 ${us(pct(d, 99) - pct(p, 99))} us`,
  );
  console.log(
    `${name.padEnd(14)} raw   p50 ${us(pct(r, 50))} us  p99 ${us(pct(r, 99))} us | raw+WAIT   p50 ${us(pct(w, 50))} us  p99 ${us(pct(w, 99))} us | added p50 ${us(pct(w, 50) - pct(r, 50))} us  p99 ${us(pct(w, 99) - pct(r, 99))} us  (the floor: no client)`,
  );
}

const loss = Number(opt("loss", 0));

async function benchLoss(name, client, admin) {
  const flock = new Flock(client);
  const tag = randomBytes(4).toString("hex");
  const others = [];
  for (let i = 0; i < 10; i++) others.push(await flock.acquire(`loss:${name}:${tag}:other:${i}`, { ttlMs: 30000 }));
  const watched = async (lease) => {
    const t0 = performance.now();
    while (!flock._watcher._watching(lease.key, lease.token)) {
      if (performance.now() - t0 > 5000) throw new Error("never watched");
      await new Promise((r) => setTimeout(r, 1));
    }
  };
  const heard = async (lease, end) => {
    let t0 = 0;
    const aborted = new Promise((r) => lease.signal.addEventListener("abort", () => r(performance.now()), { once: true }));
    t0 = performance.now();
    await end();
    const t1 = await aborted;
    return t1 - t0;
  };
  const revokes = [], kills = [];
  const reasons = new Map();
  for (let i = 0; i < loss; i++) {
    const lease = await flock.acquire(`loss:${name}:${tag}:${i}`, { ttlMs: 30000 });
    await watched(lease);
    revokes.push(await heard(lease, () => admin.call("FLOCK.REVOKE", lease.key)));
    reasons.set(lease.lostReason, (reasons.get(lease.lostReason) ?? 0) + 1);
  }
  for (let i = 0; i < loss; i++) {
    const lease = await flock.acquire(`loss:${name}:${tag}:b${i}`, { ttlMs: 30000, bound: true });
    await watched(lease);
    const list = String(await admin.call("CLIENT", "LIST"));
    const line = list.split("\n").find((l) => / cmd=flock\.acquire /.test(l));
    const id = /^id=(\d+)/.exec(line ?? "")?.[1];
    if (!id) throw new Error("no bound connection found");
    kills.push(await heard(lease, () => admin.call("CLIENT", "KILL", "ID", id)));
    reasons.set(lease.lostReason, (reasons.get(lease.lostReason) ?? 0) + 1);
  }
  for (const o of others) await o.release();
  const ms = (x) => x.toFixed(2).padStart(7);
  for (const [what, xs] of [["REVOKE", revokes], ["CLIENT KILL (bound)", kills]]) {
    console.log(`${name.padEnd(14)} ${what.padEnd(20)} n=${xs.length} p50 ${ms(pct(xs, 50))} ms  p99 ${ms(pct(xs, 99))} ms  max ${ms(Math.max(...xs))} ms`);
  }
  console.log(`${name.padEnd(14)} reasons: ${[...reasons].map(([r, n]) => `${r} ${n}`).join(", ")}`);
}

if (loss > 0) {
  console.log(`redis-flock loss-to-signal: 127.0.0.1:${port}, ${loss} REVOKEs and ${loss} bound connection kills per library, ttl 30 s`);
  const Redis = require("ioredis");
  const admin = new Redis({ port, host: "127.0.0.1" });
  if (which === "all" || which === "ioredis") {
    const c = new Redis({ port, host: "127.0.0.1" });
    await c.ping();
    await benchLoss("ioredis", c, admin);
    c.disconnect();
  }
  if (which === "all" || which === "node-redis") {
    const { createClient } = require("redis");
    const c = createClient({ socket: { port, host: "127.0.0.1" } });
    c.on("error", () => {});
    await c.connect();
    await benchLoss("node-redis", c, admin);
    c.destroy();
  }
  admin.disconnect();
  process.exit(0);
}

if (replicas > 0) {
  console.log(`redis-flock bench: 127.0.0.1:${port}, ${iterations} iterations of acquire+release each, plain against { replicas: ${replicas} }`);
  const Redis = require("ioredis");
  const probe = new Redis({ port, host: "127.0.0.1" });
  const info = await probe.info("replication");
  probe.disconnect();
  const connected = Number(/connected_slaves:(\d+)/.exec(info)?.[1] ?? 0);
  if (connected < replicas) throw new Error(`the server has ${connected} replicas connected, fewer than --replicas ${replicas}`);
  if (which === "all" || which === "ioredis") {
    const c = new Redis({ port, host: "127.0.0.1" });
    await c.ping();
    await benchDurable("ioredis", (a) => c.call(...a), c);
    c.disconnect();
  }
  if (which === "all" || which === "node-redis") {
    const { createClient } = require("redis");
    const c = createClient({ socket: { port, host: "127.0.0.1" } });
    c.on("error", () => {});
    await c.connect();
    await benchDurable("node-redis", (a) => c.sendCommand(a), c);
    c.destroy();
  }
  process.exit(0);
}

let worst = 0;
console.log(`redis-flock bench: 127.0.0.1:${port}, ${iterations} iterations of acquire+release each`);
if (which === "all" || which === "ioredis") {
  const Redis = require("ioredis");
  const c = new Redis({ port, host: "127.0.0.1" });
  await c.ping();
  worst = Math.max(worst, await bench("ioredis", (a) => c.call(...a), c));
  c.disconnect();
}
if (which === "all" || which === "node-redis") {
  const { createClient } = require("redis");
  const c = createClient({ socket: { port, host: "127.0.0.1" } });
  c.on("error", () => {});
  await c.connect();
  worst = Math.max(worst, await bench("node-redis", (a) => c.sendCommand(a), c));
  c.destroy();
}
console.log(`added median latency per lock: ${(worst * 1000).toFixed(1)} us (target < 150 us): ${worst * 1000 < 150 ? "ok" : "OVER"}`);
