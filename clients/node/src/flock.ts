import { randomBytes } from "node:crypto";
import { performance } from "node:perf_hooks";
import { adapt, isClosedClientError, isReplyError, replyCode, type Adapter, type Arg, type Conn } from "./adapter.js";
import { callAcked, DurablePool, type Acked, type Durability } from "./durable.js";
import { FlockError, LockBusyError, LockLostError, LockNotDurableError } from "./errors.js";
import { checkTtl, Lease, type LeaseKind } from "./lease.js";

const now = () => performance.now();
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, Math.max(0, ms)).unref());

export interface AcquireOptions {
  /** Lease length in ms (the server's ttl). Required. */
  ttlMs: number;
  /** How long to wait for the lock with BLOCK: undefined/null/0 = one try, Infinity = no limit. */
  waitMs?: number | null;
  /** A shared (read) grant (SPEC "Lock kinds"). */
  shared?: boolean;
  /** A permit of a counting semaphore admitting `limit` holders (SPEC "Lock kinds"). */
  limit?: number | null;
  /** A connection-bound grant (SPEC "BOUND"): on a connection of its own, lost when it closes. */
  bound?: boolean;
  /** Run the watchdog (renew at a third of the ttl). Default true. */
  renew?: boolean;
  /** The owner; default a random 128-bit hex string per lease (rule 7). */
  owner?: string;
  /**
   * Durable grants (rule 10): hand the lease over only once at least this many replicas
   * acknowledged the grant (WAIT), and count renewals only once they acknowledged them. Default 0.
   */
  replicas?: number;
  /** Durable grants: only once the master's AOF has the grant on disk (WAITAOF). Default false. */
  fsync?: boolean;
  /** How long to wait for the acknowledgements of `replicas`/`fsync`, ms. Default a third of the ttl. */
  durableTimeoutMs?: number;
}

/** A random 128-bit owner (rule 7). */
export function randomOwner(): string {
  return randomBytes(16).toString("hex");
}

/**
 * The factory over an existing ioredis (`Redis`, `Cluster`) or node-redis (`createClient`,
 * `createCluster`, v4 and v5) client. The client stays the caller's: Flock never closes it.
 */
export class Flock {
  readonly #adapter: Adapter;
  readonly #pool: DurablePool;
  /** Whether the server has WAITAOF (asked once, on the first `fsync` acquire). */
  #hasWaitaof: Promise<boolean> | null = null;

  constructor(client: unknown) {
    this.#adapter = adapt(client);
    this.#pool = new DurablePool(this.#adapter);
  }

  /** Which client library was detected. */
  get library(): Adapter["library"] {
    return this.#adapter.library;
  }

  /**
   * Takes the lock: a Lease, or null when not granted (at once, or within `waitMs`).
   * Waiting is FLOCK.ACQUIRE ... BLOCK on a duplicate() of the client (rules 5, 8).
   */
  async acquire(key: string, opts: AcquireOptions): Promise<Lease | null> {
    if (typeof key !== "string" || key.length === 0) throw new TypeError("key must be a non-empty string");
    if (!opts || typeof opts !== "object") throw new TypeError("acquire(key, { ttlMs, ... })");
    const ttl = opts.ttlMs;
    checkTtl(ttl);
    const wait = opts.waitMs ?? 0;
    if (typeof wait !== "number" || Number.isNaN(wait) || wait < 0) {
      throw new TypeError(`waitMs must be 0 or more (Infinity: no limit), got ${String(opts.waitMs)}`);
    }
    if (opts.shared && opts.limit != null) throw new TypeError("shared and limit exclude each other");
    if (opts.limit != null && (!Number.isInteger(opts.limit) || opts.limit < 1)) {
      throw new TypeError(`limit must be a positive integer, got ${String(opts.limit)}`);
    }
    const owner = opts.owner ?? randomOwner();
    if (typeof owner !== "string" || owner.length === 0) throw new TypeError("owner must be a non-empty string");
    const bound = opts.bound === true;
    const durability = checkDurability(opts, ttl, bound);
    if (durability?.fsync) await this.#requireWaitaof();
    const kind: LeaseKind = opts.shared ? "shared" : opts.limit != null ? "permit" : "exclusive";

    const base: Arg[] = ["FLOCK.ACQUIRE", key, owner, ttl];
    if (opts.shared) base.push("SHARED");
    else if (opts.limit != null) base.push("LIMIT", opts.limit);
    if (bound) base.push("BOUND");

    const start = now();
    const waitEnd = start + wait;
    // A bound lease lives on a connection of its own, from its ACQUIRE to its RELEASE.
    let conn: Conn = bound ? await this.#adapter.dedicated({ bound: true }) : this.#adapter.main;
    let handedOver = false;
    const make = (token: number, sentAt: number): Lease => {
      handedOver = true;
      return new Lease({
        key, owner, token, ttlMs: ttl, sentAt, conn, ownConn: bound, bound,
        renew: opts.renew !== false, kind,
        durable: durability ? { ...durability, run: (cmd, t) => this.#pool.run(cmd, durability, t) } : null,
      });
    };
    try {
      // One try first (no connection of its own needed when the lock is free).
      if (durability) {
        // ACQUIRE + WAIT pipelined on a connection of the pool (rule 10).
        const got = await this.#acquireDurably(key, owner, ttl, base, durability);
        if (got) return make(got.token, got.sentAt);
      } else {
        const sent = now();
        const tok = await callRetrying(conn, base, () => {
          // Unsure whether a lost reply granted it: the owner is ours, so give it back.
          if (!bound) void conn.call(["FLOCK.RELEASE", key, owner]).catch(() => {});
        });
        if (tok !== null) return make(toToken(tok), sent);
      }
      if (wait <= 0) return null;

      // Wait with BLOCK on a connection of its own, so the wait holds up no renewal (rule 8).
      let waitConn = bound ? conn : await this.#adapter.dedicated({ bound: false });
      try {
        let backoff = 10;
        for (;;) {
          const left = waitEnd - now();
          if (left <= 0) return null;
          const blockMs = Number.isFinite(left) ? Math.max(1, Math.ceil(left)) : 0;
          let granted: unknown;
          try {
            granted = await waitConn.call([...base, "BLOCK", blockMs]);
          } catch (err) {
            // TRYAGAIN: the slot moved while we waited; wait again on its new owner (rule 5).
            // A connection error: the server drops a waiter that went away; wait again.
            if (isReplyError(err) && replyCode(err) !== "TRYAGAIN") throw err;
            if (isClosedClientError(err)) throw err;
            if (bound && !isReplyError(err)) {
              // A bound wait's connection does not reconnect: wait again on a new one.
              void conn.close();
              conn = waitConn = await this.#adapter.dedicated({ bound: true });
            }
            await sleep(Math.min(backoff, Math.max(0, waitEnd - now())));
            backoff = Math.min(backoff * 2, 200);
            continue;
          }
          backoff = 10;
          if (granted === null || granted === undefined) {
            if (waitEnd - now() > 1) continue; // the server timed out early by our clock
            return null;
          }
          const token = toToken(granted);
          if (durability) {
            // The RENEW and its WAIT go on the connection that was granted, right after the
            // grant: the WAIT covers both (replication is one stream).
            const got = await this.#renewDurably(key, owner, ttl, token, durability, waitConn);
            if (got) return make(token, got.sentAt);
            continue; // granted and gone again before the renewal: keep waiting
          }
          // The wait may have been longer than the ttl: renew at once with the token and count
          // the lease from that RENEW (rule 1).
          const renewSent = now();
          const r = await callRetrying(conn, ["FLOCK.RENEW", key, owner, ttl, token], () => {
            // Granted, but never counted as held: give it back to the next waiter.
            void conn.call(["FLOCK.RELEASE", key, owner, token]).catch(() => {});
          });
          if (r !== null) return make(token, renewSent);
          // Granted and gone again before we could renew it (revoked, or expired): keep waiting.
        }
      } finally {
        if (!bound) void waitConn.close();
      }
    } finally {
      if (bound && !handedOver) void conn.close();
    }
  }

  /** Throws before anything is sent when the server has no WAITAOF (Redis before 7.2). */
  async #requireWaitaof(): Promise<void> {
    if (!this.#hasWaitaof) {
      const asked = hasWaitaof(this.#adapter.main);
      this.#hasWaitaof = asked;
      asked.catch(() => {
        if (this.#hasWaitaof === asked) this.#hasWaitaof = null; // not known: ask again next time
      });
    }
    if (!(await this.#hasWaitaof)) {
      throw new FlockError(
        "fsync: true needs WAITAOF (Redis 7.2 or later, or Valkey), and this server does not have it " +
          "(COMMAND INFO WAITAOF answered nil); nothing was sent",
      );
    }
  }

  /**
   * One durable try: ACQUIRE + WAIT pipelined on a connection of the pool. The grant and its
   * local deadline (the ACQUIRE's send time, or that of the confirming RENEW), or null when not
   * granted. Too few acknowledgements: released, then LockNotDurableError.
   */
  async #acquireDurably(
    key: string, owner: string, ttl: number, base: Arg[], d: Durability,
  ): Promise<{ token: number; sentAt: number } | null> {
    let delay = 20;
    let unsure = false; // an earlier try failed on the connection: it may have granted
    for (let attempt = 1; ; attempt++) {
      const sent = now();
      let out: Acked;
      try {
        out = await this.#pool.run(base, d, d.timeoutMs);
      } catch (err) {
        const transient = !isReplyError(err) || ["TRYAGAIN", "LOADING", "CLUSTERDOWN"].includes(replyCode(err));
        if (!transient || attempt >= 4) {
          if (!isReplyError(err) || unsure) void this.#adapter.main.call(["FLOCK.RELEASE", key, owner]).catch(() => {});
          throw err;
        }
        unsure = unsure || !isReplyError(err);
        await sleep(delay);
        delay *= 3;
        continue;
      }
      if (out.reply === null || out.reply === undefined) return null;
      const token = toToken(out.reply);
      // A repeated ACQUIRE (G4: the same token back) may replicate nothing of its own, and a WAIT
      // whose connection failed counted nothing: confirm with a RENEW and its WAIT.
      if (unsure || (out.waitError !== undefined && !isReplyError(out.waitError))) {
        const confirmed = await this.#renewDurably(key, owner, ttl, token, d, null);
        return confirmed && { token, sentAt: confirmed.sentAt };
      }
      await this.#settle(key, owner, token, out, d, "acquire");
      return { token, sentAt: sent };
    }
  }

  /**
   * RENEW + WAIT for a fresh grant (after a BLOCK wait, on `conn`, the connection that was
   * granted; else on the pool), counted from that RENEW. Null when the grant is gone already.
   */
  async #renewDurably(
    key: string, owner: string, ttl: number, token: number, d: Durability, conn: Conn | null,
  ): Promise<{ sentAt: number } | null> {
    const cmd: Arg[] = ["FLOCK.RENEW", key, owner, ttl, token];
    let delay = 20;
    for (let attempt = 1; ; attempt++) {
      const sent = now();
      let out: Acked;
      try {
        out = conn && attempt === 1 ? await callAcked(conn, cmd, d, d.timeoutMs) : await this.#pool.run(cmd, d, d.timeoutMs);
        if (out.waitError !== undefined && !isReplyError(out.waitError)) throw out.waitError;
      } catch (err) {
        const transient = !isReplyError(err) || ["TRYAGAIN", "LOADING", "CLUSTERDOWN"].includes(replyCode(err));
        if (!transient || attempt >= 4) {
          // Granted, but never handed over: give it back.
          void this.#adapter.main.call(["FLOCK.RELEASE", key, owner, token]).catch(() => {});
          throw err;
        }
        await sleep(delay);
        delay *= 3;
        continue;
      }
      if (out.reply === null || out.reply === undefined) return null;
      await this.#settle(key, owner, token, out, d, "acquire");
      return { sentAt: sent };
    }
  }

  /** A grant whose WAIT fell short (or was refused) is released, then the error is thrown. */
  async #settle(key: string, owner: string, token: number, out: Acked, d: Durability, operation: "acquire"): Promise<void> {
    if (out.ok) return;
    try {
      await this.#adapter.main.call(["FLOCK.RELEASE", key, owner, token]);
    } catch {
      /* it ends with its ttl */
    }
    if (out.waitError !== undefined) {
      const msg = out.waitError instanceof Error ? out.waitError.message : String(out.waitError);
      throw new FlockError(`the grant of ${JSON.stringify(key)} was released: the server refused ${d.fsync ? "WAITAOF" : "WAIT"}: ${msg}`, {
        cause: out.waitError,
      });
    }
    throw new LockNotDurableError({
      key, token, operation, acknowledged: out.acknowledged, asked: d.replicas,
      fsync: d.fsync, fsynced: out.fsynced, timeoutMs: d.timeoutMs,
    });
  }

  /**
   * A scoped lock: acquires (LockBusyError when not granted), runs `fn(lease, signal)` where
   * `signal` aborts on loss, and always releases. Resolves with fn's result; rejects with
   * LockLostError when the lease was lost meanwhile, unless fn itself threw: then fn's error goes
   * on unchanged (and `lease.lost` shows the loss).
   */
  async withLock<T>(
    key: string,
    opts: AcquireOptions,
    fn: (lease: Lease, signal: AbortSignal) => Promise<T> | T,
  ): Promise<T> {
    const lease = await this.acquire(key, opts);
    if (lease === null) throw new LockBusyError(key);
    let result: T;
    try {
      result = await fn(lease, lease.signal);
    } catch (err) {
      try {
        await lease.release();
      } catch {
        /* fn's error goes on unchanged */
      }
      throw err;
    }
    const lostBefore = lease.lost;
    const released = await lease.release();
    if (lostBefore || !released) {
      throw lease.signal.reason instanceof LockLostError
        ? lease.signal.reason
        : new LockLostError(key, lease.token, "release-refused");
    }
    return result;
  }

  /**
   * FLOCK.RELEASE key owner [token] from any process (rule 7: a supervisor releasing a named
   * owner's grant). True when a live grant was released.
   */
  async release(key: string, owner: string, token?: number | null): Promise<boolean> {
    const args: Arg[] = ["FLOCK.RELEASE", key, owner];
    if (token !== undefined && token !== null) args.push(token);
    return Number(await this.#adapter.main.call(args)) === 1;
  }

  /** FLOCK.REVOKE key [owner]: ends the key's grants (or only `owner`'s); the number ended. */
  async revoke(key: string, owner?: string | null): Promise<number> {
    const args: Arg[] = ["FLOCK.REVOKE", key];
    if (owner !== undefined && owner !== null) args.push(owner);
    return Number(await this.#adapter.main.call(args));
  }

  /** FLOCK.CHECK key token: remaining ms of that grant, 0 when it is not live. */
  async check(key: string, token: number): Promise<number> {
    return Number(await this.#adapter.main.call(["FLOCK.CHECK", key, token]));
  }
}

/** The durability asked for in `opts`, checked; null for a plain lease. */
function checkDurability(opts: AcquireOptions, ttl: number, bound: boolean): Durability | null {
  const replicas = opts.replicas ?? 0;
  if (typeof replicas !== "number" || !Number.isInteger(replicas) || replicas < 0) {
    throw new TypeError(`replicas must be a non-negative integer, got ${String(opts.replicas)}`);
  }
  const fsync = opts.fsync ?? false;
  if (typeof fsync !== "boolean") throw new TypeError(`fsync must be a boolean, got ${String(opts.fsync)}`);
  const timeoutMs = opts.durableTimeoutMs ?? Math.max(1, Math.floor(ttl / 3));
  if (typeof timeoutMs !== "number" || !Number.isInteger(timeoutMs) || timeoutMs < 1) {
    throw new TypeError(`durableTimeoutMs must be a positive integer of milliseconds, got ${String(opts.durableTimeoutMs)}`);
  }
  if (replicas === 0 && !fsync) return null;
  if (bound) {
    throw new TypeError("bound excludes replicas and fsync: a bound grant ends at any promotion by design, so it cannot be durable");
  }
  return { replicas, fsync, timeoutMs };
}

/** COMMAND INFO WAITAOF: nil on servers without it (Redis 7.0); else INFO's version. */
async function hasWaitaof(main: Conn): Promise<boolean> {
  try {
    const r = await main.call(["COMMAND", "INFO", "WAITAOF"]);
    return Array.isArray(r) && r.length > 0 && r[0] !== null && r[0] !== undefined;
  } catch (err) {
    if (!isReplyError(err)) throw err;
  }
  const info = String(await main.call(["INFO", "server"]));
  if (/^valkey_version:/m.test(info)) return true;
  const m = /^redis_version:(\d+)\.(\d+)/m.exec(info);
  return m !== null && (Number(m[1]) > 7 || (Number(m[1]) === 7 && Number(m[2]) >= 2));
}

function toToken(reply: unknown): number {
  const t = typeof reply === "number" ? reply : Number(reply);
  if (!Number.isSafeInteger(t) || t <= 0) throw new TypeError(`unexpected token reply ${String(reply)}`);
  return t;
}

/**
 * Sends an idempotent command (ACQUIRE by its owner, token-qualified RENEW), retrying a few
 * connection errors. `onGiveUp` runs before the last error is thrown.
 */
async function callRetrying(conn: Conn, args: Arg[], onGiveUp?: () => void): Promise<unknown> {
  let delay = 20;
  for (let attempt = 1; ; attempt++) {
    try {
      return await conn.call(args);
    } catch (err) {
      const transient = !isReplyError(err) || ["TRYAGAIN", "LOADING", "CLUSTERDOWN"].includes(replyCode(err));
      if (!transient || attempt >= 4) {
        if (!isReplyError(err)) onGiveUp?.();
        throw err;
      }
      await sleep(delay);
      delay *= 3;
    }
  }
}
