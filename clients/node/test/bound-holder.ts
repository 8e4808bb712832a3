// A holder of a bound lock in a process of its own, for the "process dies" test.
// argv: lib port key ttlMs. Takes the lock with withLock(..., { bound: true }), prints
// "HOLDING <token> <bound>" from inside the block and then waits there until it is killed.
import { Flock } from "redis-flock";
import { libs } from "./libs.js";

async function main() {
  const [libName, port, key, ttl] = process.argv.slice(2);
  const lib = libs[libName];
  const client = await lib.client(Number(port));
  const flock = new Flock(client);
  await flock.withLock(key, { ttlMs: Number(ttl), bound: true }, async (lease, signal) => {
    process.stdout.write(`HOLDING ${lease.token} ${lease.bound}\n`);
    // Inside the block until SIGKILL (the test never lets it leave).
    await new Promise((resolve) => signal.addEventListener("abort", resolve));
  });
  process.stdout.write("LEFT\n");
  process.exit(0);
}
main().catch((e) => {
  process.stdout.write(`FAIL ${String(e?.stack ?? e)}\n`);
  process.exit(1);
});
