// 11.6: a lease dropped without release, in a process of its own run with --expose-gc.
// argv: lib port key ttlMs. Acquires `key`, prints "GRANTED <token>", drops every reference
// to the lease, collects it, prints "COLLECTED" once the FinalizationRegistry saw it go, and then
// stays alive (the parent kills it): the key must be freed while the process still runs.
import { Flock } from "redis-flock";
import { libs } from "./libs.js";

async function main() {
  const [libName, port, key, ttl] = process.argv.slice(2);
  const lib = libs[libName];
  const client = await lib.client(Number(port));
  const flock = new Flock(client);
  const seen = new FinalizationRegistry<string>(() => process.stdout.write("COLLECTED\n"));
  await (async () => {
    const lease = await flock.acquire(key, { ttlMs: Number(ttl) });
    if (!lease) throw new Error("not granted");
    seen.register(lease, "lease");
    process.stdout.write(`GRANTED ${lease.token}\n`);
  })();
  const gc = (globalThis as any).gc as () => void;
  setInterval(() => gc(), 50); // alive until killed
}
main().catch((e) => {
  process.stdout.write(`FAIL ${String(e?.stack ?? e)}\n`);
  process.exit(1);
});
