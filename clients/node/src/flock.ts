import { AsyncLocalStorage } from "node:async_hooks";
import { randomBytes } from "node:crypto";
import { performance } from "node:perf_hooks";
import { adapt, isClosedClientError, keySlot, isReplyError, replyCode, type Adapter, type Arg, type Conn } from "./adapter.js";
import { callAcked, callAckedAll, DurablePool, type Acked, type Durability } from "./durable.js";
import { FlockError, InvalidArgumentError, LockBusyError, LockLostError, LockNotDurableError } from "./errors.js";
import { Election } from "./election.js";
import { Inspection } from "./inspect.js";
import { Lease, type LeaseKind } from "./lease.js";
import { checkKey, checkMany, checkOptions, checkOwner, type AcquireOptions, type ManyOptions } from "./options.js";
import { Watcher } from "./watcher.js";

export type { AcquireOptions, ManyOptions };

const now = () => performance.now();
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, Math.max(0, ms)).unref());

/**
 * Rule 11's "task": the asynchronous context of a withLock() callback (AsyncLocalStorage). Its
 * owner is the one of `reentrant` acquires that name none; its leases are what a nested wait
 * must not wait on.
 */
interface Task {
  owner: string | null;
  leases: Map<string, WeakRef<Lease>>;
}

/*
 * Random owners come from a pool of CSPRNG bytes, each 16 used once: one randomBytes call per 256
 * owners instead of one per lease (the call dominated the client's own cost of a lease).
 */
let ownerPool = Buffer.alloc(0);
let ownerOffset = 0;

/** A random 128-bit owner (rule 7). */
export function randomOwner(): string {
  if (ownerOffset + 16 > ownerPool.length) {
    ownerPool = randomBytes(4096);
    ownerOffset = 0;
  }
  const owner = ownerPool.toString("hex", ownerOffset, ownerOffset + 16);
  ownerPool.fill(0, ownerOffset, ownerOffset + 16); // used: not kept in memory
  ownerOffset += 16;
  return owner;
}

/**
 * The factory over an existing ioredis (`Redis`, `Cluster`) or node-redis (`createClient`,
 * `createCluster`, v4 and v5) client. The client stays the caller's: Flock never closes it.
 */
export class Flock extends Inspection {
  readonly #adapter: Adapter;
  readonly #pool: DurablePool;
  readonly #watcher: Watcher;
  /** Live leases by key and owner (rule 11), weakly: a forgotten lease can still be collected. */
  readonly #held = new Map<string, WeakRef<Lease>>();
  /** Acquires in flight by key and owner (named or per-task owners only): rule 11 for concurrent calls. */
  readonly #pending = new Map<string, Promise<Lease | null>>();
  readonly #tasks = new AsyncLocalStorage<Task>();
  /** Whether the server has WAITAOF (asked once, on the first `fsync` acquire). */
  #hasWaitaof: Promise<boolean> | null = null;

  constructor(client: unknown) {
    const adapter = adapt(client);
    super(adapter.main);
    this.#adapter = adapter;
    this.#pool = new DurablePool(this.#adapter);
    this.#watcher = new Watcher(this.#adapter);
  }

  /** @internal rule 9's watcher (tests: how many leases and connections it has). */
  get _watcher(): Watcher {
    return this.#watcher;
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
    checkKey(key);
    const o = checkOptions(opts);
    const { ttl, bound, durability } = o;
    let wait = o.wait;
    const kind: LeaseKind = o.shared ? "shared" : o.limit !== null ? "permit" : "exclusive";
    const task = this.#tasks.getStore();
    let owner = o.owner;
    if (owner === null && o.reentrant && task) owner = task.owner ??= randomOwner();
    // A random owner is never asked for again: only named and per-task owners are kept.
    const named = owner !== null;
    if (owner !== null) {
      // Rule 11: one grant, one lease object, also for two calls at once (the server would
      // answer both with the same token, G4).
      const inflight = this.#pending.get(heldId(key, owner));
      if (inflight) {
        if (!o.reentrant) {
          throw new LockBusyError(key, `lock ${JSON.stringify(key)} is being acquired by this Flock with owner ${JSON.stringify(owner)} (reentrant: true re-enters it)`);
        }
        await inflight.catch(() => null);
        return this.acquire(key, opts); // now held (re-entered) or free again
      }
      const held = this.#held.get(heldId(key, owner))?.deref();
      if (held?._live) {
        if (!o.reentrant) {
          throw new LockBusyError(key, `lock ${JSON.stringify(key)} is already held by this Flock with owner ${JSON.stringify(owner)} (reentrant: true re-enters it)`);
        }
        held._hold(kind, bound);
        task?.leases.set(key, held._weakRef());
        return held;
      }
    }
    owner ??= randomOwner();
    // Rule 11: a wait on a key this task holds would wait on itself: one try, then LockBusyError.
    // (Not a permit under a permit: other holders' permits may free, as the caller expects.)
    const own = task?.leases.get(key)?.deref();
    const selfWait = wait > 0 && own?._live === true && !(kind === "permit" && own.kind === "permit");
    if (selfWait) wait = 0;
    const pid = named ? heldId(key, owner) : null;
    const pending = (async () => {
      if (durability?.fsync) await this.#requireWaitaof();
      const got = await this.#acquire(key, owner, o.ttl, wait, kind, o.limit, bound, o.renew, durability);
      if (got && pid !== null) this.#held.set(pid, got._weakRef());
      return got;
    })();
    if (pid !== null) {
      this.#pending.set(pid, pending);
      void pending.catch(() => {}).finally(() => this.#pending.delete(pid));
    }
    const lease = await pending;
    if (lease === null && selfWait) {
      throw new LockBusyError(key, `lock ${JSON.stringify(key)} is held by this task's own lease: waiting would wait on itself`);
    }
    if (lease) task?.leases.set(key, lease._weakRef());
    return lease;
  }

  /**
   * Takes several exclusive locks at once, all or nothing (FLOCK.MACQUIRE): one Lease per key, in
   * the order given, or null when not every key was granted (at once, or within `waitMs`, waiting
   * in every key's queue at once with BLOCK). Nothing is taken when null. In a cluster every key
   * must hash to one slot (use a {hash tag}). Each lease is an ordinary one (watchdog, fencing,
   * loss watching); release them all (or use withLocks).
   */
  async acquireMany(keys: string[], opts: ManyOptions): Promise<Lease[] | null> {
    const o = checkMany(keys, opts);
    if (this.#adapter.library.endsWith("-cluster")) {
      const slot = keySlot(o.keys[0]);
      const other = o.keys.find((k) => keySlot(k) !== slot);
      if (other !== undefined) {
        throw new InvalidArgumentError(
          `in a cluster every key must hash to one slot: ${JSON.stringify(o.keys[0])} and ${JSON.stringify(other)} do not (use a {hash tag})`,
        );
      }
    }
    const task = this.#tasks.getStore();
    let wait = o.wait;
    const named = o.owner !== null;
    const owner = o.owner ?? randomOwner();
    if (named) {
      // Rule 11: a key this Flock holds (or is acquiring) with this owner would be granted again
      // under its lease's token (G4): a second lease object for one grant. Refused, as acquire()
      // without `reentrant` refuses it.
      for (const key of o.keys) {
        const id = heldId(key, owner);
        if (this.#pending.has(id) || this.#held.get(id)?.deref()?._live) {
          throw new LockBusyError(key, `lock ${JSON.stringify(key)} is already held (or being acquired) by this Flock with owner ${JSON.stringify(owner)}`);
        }
      }
    }
    // Rule 11: a wait on a key this task holds would wait on itself: one try, then LockBusyError.
    const selfWait = wait > 0 && o.keys.some((k) => task?.leases.get(k)?.deref()?._live === true);
    if (selfWait) wait = 0;
    const pending = (async () => {
      if (o.durability?.fsync) await this.#requireWaitaof();
      const got = await this.#acquireMany(o.keys, owner, o.ttl, wait, o.bound, o.renew, o.durability);
      if (got && named) for (const l of got) this.#held.set(heldId(l.key, owner), l._weakRef());
      return got;
    })();
    if (named) {
      const one = pending.then((ls) => ls?.[0] ?? null);
      for (const key of o.keys) {
        const id = heldId(key, owner);
        this.#pending.set(id, one);
        void one.catch(() => {}).finally(() => {
          if (this.#pending.get(id) === one) this.#pending.delete(id);
        });
      }
    }
    const leases = await pending;
    if (leases === null && selfWait) {
      throw new LockBusyError(o.keys.join(", "), "one of these keys is held by this task's own lease: waiting would wait on itself");
    }
    if (leases) for (const l of leases) task?.leases.set(l.key, l._weakRef());
    return leases;
  }

  async #acquireMany(
    keys: string[], owner: string, ttl: number, wait: number, bound: boolean, renew: boolean, durability: Durability | null,
  ): Promise<Lease[] | null> {
    const base: Arg[] = ["FLOCK.MACQUIRE", keys.length, ...keys, owner, ttl];
    if (bound) base.push("BOUND");
    const route = keys[0]; // numkeys comes first: route on the first key (all share its slot)
    const waitEnd = now() + wait;
    // Bound grants share one connection of their own, closed when the last of their leases ends.
    const hold = bound ? { conn: await this.#adapter.dedicated({ bound: true }) } : null;
    let handedOver = false;
    const make = (tokens: unknown[], sentAt: number): Lease[] => {
      handedOver = true;
      const conn = hold ? sharedConn(hold.conn, keys.length) : this.#adapter.main;
      return keys.map((key, i) => new Lease({
        key, owner, token: toToken(tokens[i]), ttlMs: ttl, sentAt, conn, ownConn: bound, bound, renew, kind: "exclusive",
        durable: durability ? { ...durability, run: (cmd, t) => this.#pool.run(cmd, durability, t) } : null,
        watcher: this.#watcher, onEnd: (k, ow, t) => this.#forget(k, ow, t),
      }));
    };
    const releaseAll = (c: Conn, tokens?: unknown[]) => {
      for (const [i, key] of keys.entries()) {
        const args: Arg[] = ["FLOCK.RELEASE", key, owner];
        if (tokens) args.push(toToken(tokens[i]));
        void c.call(args).catch(() => {});
      }
    };
    try {
      // One try first, without BLOCK (with its WAIT when durable, on a connection of the pool).
      const sent = now();
      const got = durability
        ? await this.#manyDurably(keys, owner, base, durability)
        : await callRetrying(hold?.conn ?? this.#adapter.main, base, () => {
          if (!bound) releaseAll(this.#adapter.main); // a lost reply may have granted them: the owner is ours
        }, route);
      if (got !== null && got !== undefined) return make(tokensOf(got, keys.length), sent);
      if (wait <= 0) return null;
      return await this.#waitBlocked(base, route, waitEnd, hold, async (granted, waitConn) => {
        const tokens = tokensOf(granted, keys.length);
        // Rule 1: the wait may have outlasted the ttl: renew every grant with its token, and
        // count the leases from those RENEWs (pipelined: one round trip, one slot); a durable
        // request's WAIT follows them on that connection (rule 10).
        const renews: Arg[][] = keys.map((key, i) => ["FLOCK.RENEW", key, owner, ttl, toToken(tokens[i])]);
        const renewSent = now();
        let acked: Awaited<ReturnType<typeof callAckedAll>> | null = null;
        let renewed: PromiseSettledResult<unknown>[];
        try {
          if (durability) acked = await callAckedAll(waitConn, renews, durability, durability.timeoutMs, route);
          renewed = acked ? acked.replies : await (hold?.conn ?? this.#adapter.main).pipeline(renews, route);
        } catch (err) {
          releaseAll(this.#adapter.main, tokens); // granted, but never handed over
          throw err;
        }
        if (renewed.every((r) => r.status === "fulfilled" && r.value !== null && r.value !== undefined)) {
          if (acked && durability) await this.#settleMany(keys, owner, tokens, acked, durability);
          return make(tokens, renewSent);
        }
        // Not all confirmed (one revoked or expired meanwhile, or a failure): all or nothing,
        // so give every grant back and keep waiting.
        releaseAll(hold?.conn ?? this.#adapter.main, tokens);
        return undefined;
      });
    } finally {
      if (hold && !handedOver) void hold.conn.close();
    }
  }

  /**
   * A durable MACQUIRE's first try: MACQUIRE + WAIT pipelined on a connection of the pool (a
   * retry of the same owner gets the same tokens back, G4). The tokens, or null when not
   * granted; too few acknowledgements: every key released, then LockNotDurableError.
   */
  async #manyDurably(keys: string[], owner: string, base: Arg[], d: Durability): Promise<unknown[] | null> {
    let delay = 20;
    for (let attempt = 1; ; attempt++) {
      let out: Acked;
      try {
        out = await this.#pool.run(base, d, d.timeoutMs, keys[0]);
      } catch (err) {
        const transient = !isReplyError(err) || ["TRYAGAIN", "LOADING", "CLUSTERDOWN"].includes(replyCode(err));
        if (!transient || attempt >= 4) {
          // A lost reply may have granted them: the owner is this call's own.
          if (!isReplyError(err)) for (const key of keys) void this.#adapter.main.call(["FLOCK.RELEASE", key, owner]).catch(() => {});
          throw err;
        }
        await sleep(delay);
        delay *= 3;
        continue;
      }
      if (out.reply === null || out.reply === undefined) return null;
      const tokens = tokensOf(out.reply, keys.length);
      await this.#settleMany(keys, owner, tokens, out, d);
      return tokens;
    }
  }

  /** Grants whose WAIT fell short (or failed) are all released (token-qualified), then the error is thrown. */
  async #settleMany(keys: string[], owner: string, tokens: unknown[], out: Omit<Acked, "reply">, d: Durability): Promise<void> {
    if (out.ok) return;
    await Promise.all(keys.map((key, i) => this.#adapter.main.call(["FLOCK.RELEASE", key, owner, toToken(tokens[i])]).catch(() => {})));
    if (out.waitError !== undefined) {
      const msg = out.waitError instanceof Error ? out.waitError.message : String(out.waitError);
      throw new FlockError(`the grants of ${JSON.stringify(keys)} were released: ${d.fsync ? "WAITAOF" : "WAIT"} failed: ${msg}`, {
        cause: out.waitError,
      });
    }
    throw new LockNotDurableError({
      key: keys.join(", "), token: toToken(tokens[0]), operation: "acquire", acknowledged: out.acknowledged, asked: d.replicas,
      fsync: d.fsync, fsynced: out.fsynced, timeoutMs: d.timeoutMs,
    });
  }

  /**
   * The BLOCK wait of acquire() and acquireMany() (rules 5, 8): `base` + BLOCK on a connection
   * of its own, or on `hold.conn` for a bound request (replaced by a new one when it fails: the
   * grant binds to the connection that waited), until the server grants it; then `granted(reply,
   * conn)` decides: a result, or undefined to wait again (granted and gone before it could be
   * confirmed). Null when not granted by `waitEnd`. TRYAGAIN (the slot moved while we waited)
   * and a dropped connection (the server drops a waiter that went away) are waited through.
   */
  async #waitBlocked<T>(
    base: Arg[], routeKey: string | undefined, waitEnd: number, hold: { conn: Conn } | null,
    granted: (reply: unknown, conn: Conn) => Promise<T | undefined>,
  ): Promise<T | null> {
    let waitConn = hold ? hold.conn : await this.#adapter.dedicated({ bound: false });
    try {
      let backoff = 10;
      for (;;) {
        const left = waitEnd - now();
        if (left <= 0) return null;
        const blockMs = Number.isFinite(left) ? Math.max(1, Math.ceil(left)) : 0;
        let reply: unknown;
        try {
          reply = await waitConn.call([...base, "BLOCK", blockMs], routeKey);
        } catch (err) {
          if (isReplyError(err) && replyCode(err) !== "TRYAGAIN") throw err;
          if (isClosedClientError(err)) throw err;
          if (hold && !isReplyError(err)) {
            // A bound wait's connection does not reconnect: wait again on a new one.
            void hold.conn.close();
            hold.conn = waitConn = await this.#adapter.dedicated({ bound: true });
          }
          await sleep(Math.min(backoff, Math.max(0, waitEnd - now())));
          backoff = Math.min(backoff * 2, 200);
          continue;
        }
        backoff = 10;
        if (reply === null || reply === undefined) {
          if (waitEnd - now() > 1) continue; // the server timed out early by our clock
          return null;
        }
        const out = await granted(reply, waitConn);
        if (out !== undefined) return out;
      }
    } finally {
      if (!hold) void waitConn.close();
    }
  }

  /**
   * Several locks held for the length of `fn(leases, signal)` (acquireMany, then LockBusyError
   * when not granted); `signal` aborts when any of them is lost. All are released together when
   * fn settles. As withLock: fn's error goes on unchanged; else a loss meanwhile rejects with
   * LockLostError (of the first lease lost).
   */
  async withLocks<T>(
    keys: string[],
    opts: ManyOptions,
    fn: (leases: Lease[], signal: AbortSignal) => Promise<T> | T,
  ): Promise<T> {
    const task = this.#tasks.getStore() ?? { owner: null, leases: new Map() };
    return this.#tasks.run(task, async () => {
      const leases = await this.acquireMany(keys, opts);
      if (leases === null) throw new LockBusyError(keys.join(", "));
      const ctl = new AbortController();
      const onLoss = (l: Lease) => () => ctl.abort(l.signal.reason);
      const unlisten = leases.map((l) => {
        const h = onLoss(l);
        if (l.signal.aborted) h();
        else l.signal.addEventListener("abort", h, { once: true });
        return () => l.signal.removeEventListener("abort", h);
      });
      const releaseAll = () => Promise.all(leases.map((l) => l.release().catch(() => false)));
      let result: T;
      try {
        result = await fn(leases, ctl.signal);
      } catch (err) {
        await releaseAll();
        throw err;
      } finally {
        for (const u of unlisten) u();
      }
      const lost = leases.find((l) => l.lost);
      const released = await releaseAll();
      const gone = lost ?? leases[released.indexOf(false)];
      if (gone) {
        throw gone.signal.reason instanceof LockLostError ? gone.signal.reason : new LockLostError(gone.key, gone.token, "gone");
      }
      return result;
    });
  }

  /**
   * Leader election over `key` (see Election): `campaign()`, `leader()`, `observe()`,
   * `resign()`. `owner` names this candidate (default: random per election).
   */
  election(key: string, ttlMs: number, opts: { owner?: string } = {}): Election {
    checkKey(key);
    if (!opts || typeof opts !== "object") throw new InvalidArgumentError("election(key, ttlMs, { owner })");
    for (const name of Object.keys(opts)) {
      if (name !== "owner") throw new InvalidArgumentError(`unknown option ${JSON.stringify(name)} (known: owner)`);
    }
    if (opts.owner !== undefined) checkOwner(opts.owner);
    return new Election({ adapter: this.#adapter, acquire: (k, o) => this.acquire(k, o) }, key, ttlMs, opts.owner ?? randomOwner());
  }

  /** A lease ended: forget it (only if it is still the one kept for its key and owner). */
  #forget(key: string, owner: string, token: number): void {
    const id = heldId(key, owner);
    const l = this.#held.get(id)?.deref();
    if (!l || l.token === token) this.#held.delete(id);
  }

  async #acquire(
    key: string, owner: string, ttl: number, wait: number, kind: LeaseKind, limit: number | null, bound: boolean,
    renew: boolean, durability: Durability | null,
  ): Promise<Lease | null> {
    const base: Arg[] = ["FLOCK.ACQUIRE", key, owner, ttl];
    if (kind === "shared") base.push("SHARED");
    else if (limit !== null) base.push("LIMIT", limit);
    if (bound) base.push("BOUND");

    const start = now();
    const waitEnd = start + wait;
    // A bound lease lives on a connection of its own, from its ACQUIRE to its RELEASE.
    const hold = bound ? { conn: await this.#adapter.dedicated({ bound: true }) } : null;
    const conn = () => hold?.conn ?? this.#adapter.main;
    let handedOver = false;
    const make = (token: number, sentAt: number): Lease => {
      handedOver = true;
      return new Lease({
        key, owner, token, ttlMs: ttl, sentAt, conn: conn(), ownConn: bound, bound, renew, kind,
        durable: durability ? { ...durability, run: (cmd, t) => this.#pool.run(cmd, durability, t) } : null,
        watcher: this.#watcher,
        onEnd: (k, o, t) => this.#forget(k, o, t),
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
        const tok = await callRetrying(conn(), base, () => {
          // Unsure whether a lost reply granted it: the owner is ours, so give it back.
          if (!bound) void conn().call(["FLOCK.RELEASE", key, owner]).catch(() => {});
        });
        if (tok !== null) return make(toToken(tok), sent);
      }
      if (wait <= 0) return null;

      // Wait with BLOCK on a connection of its own, so the wait holds up no renewal (rule 8).
      return await this.#waitBlocked(base, undefined, waitEnd, hold, async (granted, waitConn) => {
        const token = toToken(granted);
        if (durability) {
          // The RENEW and its WAIT go on the connection that was granted, right after the
          // grant: the WAIT covers both (replication is one stream).
          const got = await this.#renewDurably(key, owner, ttl, token, durability, waitConn);
          return got ? make(token, got.sentAt) : undefined; // granted and gone again: keep waiting
        }
        // The wait may have been longer than the ttl: renew at once with the token and count
        // the lease from that RENEW (rule 1).
        const renewSent = now();
        const r = await callRetrying(conn(), ["FLOCK.RENEW", key, owner, ttl, token], () => {
          // Granted, but never counted as held: give it back to the next waiter.
          void conn().call(["FLOCK.RELEASE", key, owner, token]).catch(() => {});
        });
        // Granted and gone again before we could renew it (revoked, or expired): keep waiting.
        return r !== null ? make(token, renewSent) : undefined;
      });
    } finally {
      if (hold && !handedOver) void hold.conn.close();
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
    // fn runs in a task of its own (rule 11), or in the task of the withLock it is nested in.
    const task = this.#tasks.getStore() ?? { owner: null, leases: new Map() };
    return this.#tasks.run(task, () => this.#withLock(key, opts, fn));
  }

  async #withLock<T>(
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
        : new LockLostError(key, lease.token, "gone");
    }
    return result;
  }
}

const heldId = (key: string, owner: string) => `${owner}\0${key}`;

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

/** FLOCK.MACQUIRE's reply: one token per key. */
function tokensOf(reply: unknown, n: number): unknown[] {
  if (!Array.isArray(reply) || reply.length !== n) throw new TypeError(`unexpected FLOCK.MACQUIRE reply ${String(reply)}`);
  return reply;
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
async function callRetrying(conn: Conn, args: Arg[], onGiveUp?: () => void, routeKey?: string): Promise<unknown> {
  let delay = 20;
  for (let attempt = 1; ; attempt++) {
    try {
      return await conn.call(args, routeKey);
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

/**
 * One bound connection shared by the `n` leases of one MACQUIRE BOUND: each lease closes it as
 * its own (ownConn), and only the last close closes it, so that releasing one lease does not end
 * the others' bound grants.
 */
function sharedConn(conn: Conn, n: number): Conn {
  let refs = n;
  return {
    call: (args, routeKey) => conn.call(args, routeKey),
    pipeline: (cmds, routeKey) => conn.pipeline(cmds, routeKey),
    onDown: (cb) => conn.onDown(cb),
    close: async () => {
      if (--refs === 0) await conn.close();
    },
  };
}
