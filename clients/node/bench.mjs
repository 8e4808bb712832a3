#!/usr/bin/env node
// Added latency of a lock through redis-flock over the raw commands, on loopback.
//   node bench.mjs --port N [--iterations 5000] [--lib ioredis|node-redis|all]
// A server with the flock module must listen on 127.0.0.1:N. Per iteration, "raw" is
// FLOCK.ACQUIRE key owner ttl + FLOCK.RELEASE key owner token sent by hand on the same client;
// "flock" is flock.acquire() + lease.release() (random owner, lease clock, watchdog timers armed
// and cleared). Both run interleaved on one connection; the report gives median and p99 of each
// and of the difference (target: under 150 us per lock).
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
