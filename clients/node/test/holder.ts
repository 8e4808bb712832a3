// A lock holder in a process of its own, for the SIGSTOP test.
// argv: lib port key ttlMs. Prints "READY <token>", then checks ensure(50) every 5 ms and prints
// "ENSURE <error name> <reason>" at its first failure. On stdin "FENCED" it tries a fenced
// write and prints "FENCED_OK <reply>" or "FENCED_ERR <error name>".
import { createInterface } from "node:readline";
import { Flock, LockLostError } from "redis-flock";
import { libs } from "./libs.js";

async function main() {
  const [libName, port, key, ttl] = process.argv.slice(2);
  const lib = libs[libName];
  const client = await lib.client(Number(port));
  const flock = new Flock(client);
  const lease = await flock.acquire(key, { ttlMs: Number(ttl) });
  if (!lease) throw new Error("not granted");
  process.stdout.write(`READY ${lease.token}\n`);
  const tick = setInterval(() => {
    try {
      lease.ensure(50);
    } catch (e) {
      clearInterval(tick);
      process.stdout.write(`ENSURE ${(e as Error).name} ${(e as LockLostError).reason} ${lease.lost}\n`);
    }
  }, 5);
  const rl = createInterface({ input: process.stdin });
  for await (const line of rl) {
    if (line.trim() === "FENCED") {
      try {
        const r = await lease.fenced("SET", `${key}:data`, "from-stale-holder");
        process.stdout.write(`FENCED_OK ${String(r)}\n`);
      } catch (e) {
        process.stdout.write(`FENCED_ERR ${(e as Error).name} ${lease.lost}\n`);
      }
    }
    if (line.trim() === "EXIT") break;
  }
  clearInterval(tick);
  await lib.close(client);
  process.exit(0);
}
main().catch((e) => {
  process.stdout.write(`FAIL ${String(e?.stack ?? e)}\n`);
  process.exit(1);
});
