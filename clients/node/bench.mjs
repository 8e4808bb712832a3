#!/usr/bin/env node
// Added latency of a lock through redis-flock over the raw commands, on loopback.
//   node bench.mjs --port N [--iterations 5000] [--lib ioredis|node-redis|all] [--replicas R]
// A server with the flock module must listen on 127.0.0.1:N. Per iteration, "raw" is
// FLOCK.ACQUIRE key owner ttl + FLOCK.RELEASE key owner token sent by hand on the same client;
// "flock" is flock.acquire() + lease.release() (random owner, lease clock, watchdog timers armed
// and cleared). Both run interleaved on one connection; the report gives median and p99 of each
// and of the difference (target: under 150 us per lock).
// --replicas R: the cost of durable grants instead. The server must be a master with at least
// R replicas; "plain" is flock.acquire() + release(), "durable" the same with { replicas: R }
// (ACQUIRE + WAIT R pipelined on a connection of Flock's pool), interleaved.
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

async function benchDurable(name, client) {
  const flock = new Flock(client);
  const key = `bench:${name}:${randomBytes(4).toString("hex")}`;
  const once = async (opts) => {
    const lease = await flock.acquire(key, { ttlMs: 30000, ...opts });
    await lease.release();
  };
  const plainOnce = () => once({});
  const durableOnce = () => once({ replicas });
  for (let i = 0; i < 500; i++) {
    await plainOnce();
    await durableOnce();
  }
  const p = [], d = [];
  for (let i = 0; i < iterations; i++) {
    if (i & 1) {
      let t0 = performance.now(); await plainOnce(); p.push(performance.now() - t0);
      t0 = performance.now(); await durableOnce(); d.push(performance.now() - t0);
    } else {
      let t0 = performance.now(); await durableOnce(); d.push(performance.now() - t0);
      t0 = performance.now(); await plainOnce(); p.push(performance.now() - t0);
    }
  }
  console.log(
    `${name.padEnd(14)} plain p50 ${us(pct(p, 50))} us  p99 ${us(pct(p, 99))} us | replicas:${replicas} p50 ${us(pct(d, 50))} us  p99 ${us(pct(d, 99))} us | added p50 ${us(pct(d, 50) - pct(p, 50))} us  p99 ${us(pct(d, 99) - pct(p, 99))} us`,
  );
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
    await benchDurable("ioredis", c);
    c.disconnect();
  }
  if (which === "all" || which === "node-redis") {
    const { createClient } = require("redis");
    const c = createClient({ socket: { port, host: "127.0.0.1" } });
    c.on("error", () => {});
    await c.connect();
    await benchDurable("node-redis", c);
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
