/*
 * Leader election over one key (docs/CLIENTS.md "The API": etcd's concurrency.Election,
 * Curator's LeaderLatch). A candidate waits in the key's queue (BLOCK) for a BOUND grant, so a
 * leader whose process dies steps down at once and the next in line leads; the lease is renewed
 * and watched like any other (rule 9 tells a leader it was deposed). observe() follows the
 * leadership with FLOCK.WATCH on a connection of its own: never polling.
 */
import type { Adapter, Conn } from "./adapter.js";
import { isReplyError } from "./adapter.js";
import { InvalidArgumentError, LockBusyError } from "./errors.js";
import type { Lease } from "./lease.js";
import { checkTtl } from "./options.js";

/** A leader: its owner and the token of its grant (a fencing token for what it writes). */
export interface Leader {
  owner: string;
  token: number;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, Math.max(0, ms)).unref());

/** @internal what an Election needs of its Flock. */
export interface ElectionHost {
  adapter: Adapter;
  acquire(key: string, opts: { ttlMs: number; waitMs: number; bound: true; owner: string }): Promise<Lease | null>;
}

/** The current leader of `key` from FLOCK.INFO on `conn`, or null while the key is free. */
async function leaderOn(conn: Conn, key: string): Promise<Leader | null> {
  const r = await conn.call(["FLOCK.INFO", key]);
  if (r === null || r === undefined) return null;
  const o: Record<string, unknown> = {};
  if (Array.isArray(r)) for (let i = 0; i + 1 < r.length; i += 2) o[String(r[i])] = r[i + 1];
  else if (r instanceof Map) for (const [k, v] of r) o[String(k)] = v;
  else Object.assign(o, r);
  if (o.owner === null || o.owner === undefined || Number(o.holders ?? 0) < 1) return null;
  return { owner: String(o.owner), token: Number(o.token) };
}

export class Election {
  readonly key: string;
  readonly ttlMs: number;
  /** This candidate's owner (given, or random per election). */
  readonly owner: string;
  readonly #host: ElectionHost;
  #lease: Lease | null = null;

  /** @internal use flock.election() */
  constructor(host: ElectionHost, key: string, ttlMs: number, owner: string) {
    checkTtl(ttlMs);
    this.#host = host;
    this.key = key;
    this.ttlMs = ttlMs;
    this.owner = owner;
  }

  /** The lease while this candidate leads (null before, after resign() or once lost). */
  get lease(): Lease | null {
    return this.#lease && !this.#lease.lost && !this.#lease.released ? this.#lease : null;
  }

  /**
   * Waits in line (FLOCK.ACQUIRE ... BOUND BLOCK) until this candidate leads, and returns its
   * lease: watch `lease.signal` to learn that the leadership ended. `waitMs` defaults to no
   * limit; not leading within it throws LockBusyError. Campaigning while leading returns the
   * same lease.
   */
  async campaign(waitMs: number = Infinity): Promise<Lease> {
    if (typeof waitMs !== "number" || Number.isNaN(waitMs) || waitMs < 0) {
      throw new InvalidArgumentError(`waitMs must be 0 or more (Infinity: no limit), got ${String(waitMs)}`);
    }
    if (this.lease) return this.lease;
    const lease = await this.#host.acquire(this.key, { ttlMs: this.ttlMs, waitMs, bound: true, owner: this.owner });
    if (lease === null) throw new LockBusyError(this.key, `${JSON.stringify(this.owner)} did not become leader of ${JSON.stringify(this.key)} in time`);
    this.#lease = lease;
    return lease;
  }

  /** The current leader (FLOCK.INFO), or null while nobody leads. */
  async leader(): Promise<Leader | null> {
    return leaderOn(this.#host.adapter.main, this.key);
  }

  /** Steps down if leading (the next in line is granted at once). True when it was leading. */
  async resign(): Promise<boolean> {
    const l = this.lease;
    this.#lease = null;
    return l ? l.release() : false;
  }

  /**
   * The leadership as it changes: first the current leader (or null), then each change, null
   * while the key is free. Driven by FLOCK.WATCH (token 0 to learn the next leader, the
   * leader's token to learn its end) on a connection of its own; ends with close(), a `break`
   * out of `for await`, or leaving an `await using` block.
   */
  observe(): LeaderObserver {
    return new LeaderObserver(this.#host.adapter, this.key);
  }
}

export class LeaderObserver implements AsyncIterableIterator<Leader | null>, AsyncDisposable {
  readonly #adapter: Adapter;
  readonly #key: string;
  readonly #gen: AsyncGenerator<Leader | null, void, undefined>;
  #conn: Conn | null = null;
  #closed = false;

  /** @internal use election.observe() */
  constructor(adapter: Adapter, key: string) {
    this.#adapter = adapter;
    this.#key = key;
    this.#gen = this.#run();
  }

  next(): Promise<IteratorResult<Leader | null, void>> {
    return this.#gen.next();
  }

  async return(): Promise<IteratorResult<Leader | null, void>> {
    this.close();
    return this.#gen.return(undefined);
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  /** Stops observing and closes its connection. */
  close(): void {
    this.#closed = true;
    if (this.#conn) void this.#conn.close();
    this.#conn = null;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.return();
  }

  async *#run(): AsyncGenerator<Leader | null, void, undefined> {
    let last: string | undefined;
    let backoff = 10;
    try {
      while (!this.#closed) {
        try {
          const conn = this.#conn ?? (this.#conn = await this.#adapter.dedicated({ bound: false, name: "flock-observe" }));
          if (this.#closed) return;
          const now = await leaderOn(conn, this.#key);
          const seen = JSON.stringify(now);
          if (seen !== last) {
            last = seen;
            yield now;
            if (this.#closed) return;
          }
          // Fires when that leader's grant ends, or (token 0) when someone leads.
          await conn.call(["FLOCK.WATCH", 0, this.#key, now ? now.token : 0], this.#key);
          backoff = 10;
        } catch (err) {
          if (this.#closed) return;
          if (isReplyError(err) && /unknown command|NOPERM/i.test((err as Error).message)) throw err;
          await sleep(backoff);
          backoff = Math.min(backoff * 2, 500);
        }
      }
    } finally {
      this.close();
    }
  }
}
