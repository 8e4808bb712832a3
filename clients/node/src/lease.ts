import "./polyfill.js";
import { performance } from "node:perf_hooks";
import type { Arg, Conn } from "./adapter.js";
import { isClosedClientError, isReplyError, replyCode } from "./adapter.js";
import type { Acked, Durability } from "./durable.js";
import { FencedError, FlockError, InvalidArgumentError, LeaseTooShortError, LockLostError, LockNotDurableError, type LossReason } from "./errors.js";
import { checkTtl } from "./options.js";
import type { Watched, Watcher, WatchEvent } from "./watcher.js";

const now = () => performance.now();
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, Math.max(0, ms)).unref());

/** The kind of a grant (SPEC "Lock kinds"). */
export type LeaseKind = "exclusive" | "shared" | "permit";

/** @internal what a Flock hands to a new Lease. */
export interface LeaseInit {
  key: string;
  owner: string;
  token: number;
  ttlMs: number;
  /** performance.now() when the request that granted (or last renewed) it was sent. */
  sentAt: number;
  conn: Conn;
  /** A connection of the lease's own (BOUND), closed when the lease ends. */
  ownConn: boolean;
  bound: boolean;
  renew: boolean;
  kind: LeaseKind;
  /** Durable renewals (rule 10): RENEW + WAIT through `run`, on a connection of Flock's pool. */
  durable?: (Durability & { run(cmd: Arg[], timeoutMs: number): Promise<Acked> }) | null;
  /** Rule 9: the Flock's watcher, told of the lease now and of its end. */
  watcher?: Watcher | null;
  /** Called once when the lease ends (released, lost, or collected): the Flock forgets it. */
  onEnd?: ((key: string, owner: string, token: number) => void) | null;
}

/** A server event (WATCH) as the loss reason of rule 12. */
const EVENT_REASON: Record<WatchEvent, LossReason> = {
  released: "revoked", // released by someone else with our owner (our own release is not a loss)
  revoked: "revoked",
  expired: "expired",
  closed: "closed",
  lost: "lost",
  gone: "gone",
};

/** How long a bound lease told `gone` waits for its connection's close event (reason `closed`). */
const GONE_GRACE_MS = 20;

/** What releasing a forgotten lease needs, without the lease (which is gone by then). */
interface Forgotten {
  key: string;
  owner: string;
  token: number;
  conn: Conn;
  ownConn: boolean;
  watcher: Watcher | null;
  watchId: string | null;
  onEnd: LeaseInit["onEnd"];
}

/*
 * Rule 11: a lease dropped without release (its last reference gone) stops renewing and is
 * released. From its first renewal on, its timers and listeners hold it only through a WeakRef
 * (and the watcher from when it joins the WATCH), so it can be collected; then this releases its
 * grant with its token (and closes a bound lease's connection, which ends the grant on the server
 * by itself). Before the first renewal they hold it strongly: a short lease, acquired and
 * released within a third of its ttl (the common case), costs neither a WeakRef nor a
 * registration, and a forgotten one is collected a third of a ttl later.
 */
const forgotten = new FinalizationRegistry<Forgotten>((f) => {
  if (f.watchId !== null) f.watcher?.remove(f.watchId);
  f.onEnd?.(f.key, f.owner, f.token);
  if (f.ownConn) void f.conn.close();
  else void f.conn.call(["FLOCK.RELEASE", f.key, f.owner, f.token]).catch(() => {});
});

/**
 * One grant of a lock: its key, owner and fencing token, a local lease clock that always ends
 * before the server's (rule 1), and a watchdog that renews it at a third of the ttl (rule 2).
 * Loss is loud (rule 3): `lost`, `signal` (an AbortSignal aborted with a LockLostError) and
 * `waitLost()`.
 */
export class Lease implements AsyncDisposable, Watched {
  readonly key: string;
  readonly owner: string;
  readonly token: number;
  readonly kind: LeaseKind;
  readonly bound: boolean;
  /** Aborted (reason: a LockLostError) the moment the lease is known to be lost. */

  #conn: Conn;
  #ownConn: boolean;
  #ttl: number;
  #deadline: number;
  #watchdog: boolean;
  /** Made when `signal` is first read (most leases never need one: it costs a microsecond). */
  #ctl: AbortController | null = null;
  #lostReason: LossReason | null = null;
  /** The server told us the grant is gone (nothing left to release). */
  #gone = false;
  #released = false;
  #releasing: Promise<boolean> | null = null;
  #renewTimer: NodeJS.Timeout | null = null;
  #expiryTimer: NodeJS.Timeout | null = null;
  #renewSeq = 0;
  #appliedSeq = 0;
  #unDown: (() => void) | null = null;
  #durable: LeaseInit["durable"];
  /** A renewal that fell short still renewed on the master: its grant outlives our deadline. */
  #serverAhead = false;
  /** Reentrant holds (rule 11): release() sends RELEASE only on the last. */
  #holds = 1;
  #weak: WeakRef<Lease> | null = null;
  #registered = false;
  #watcher: Watcher | null;
  #onEnd: LeaseInit["onEnd"];
  #ended = false;
  #watchId: string | null = null;

  /** @internal use Flock.acquire() */
  constructor(init: LeaseInit) {
    this.key = init.key;
    this.owner = init.owner;
    this.token = init.token;
    this.kind = init.kind;
    this.bound = init.bound;
    this.#conn = init.conn;
    this.#ownConn = init.ownConn;
    this.#ttl = init.ttlMs;
    this.#deadline = init.sentAt + init.ttlMs;
    this.#watchdog = init.renew;
    this.#durable = init.durable ?? null;
    this.#watcher = init.watcher ?? null;
    this.#onEnd = init.onEnd ?? null;
    if (init.bound) this.#listenDown();
    this.#watchId = this.#watcher?.add(this.key, this.token, this) ?? null;
    this.#armExpiry();
    this.#scheduleRenew();
  }

  /** @internal a WeakRef to this lease (one, made when first needed). */
  _weakRef(): WeakRef<Lease> {
    return (this.#weak ??= new WeakRef(this));
  }

  /** Whatever holds the lease from here on (timers, listeners) holds it weakly once it renewed. */
  #handle(): () => Lease | undefined {
    return this.#weak ? weakHandle(this.#weak) : strongHandle(this);
  }

  #listenDown(): void {
    this.#unDown?.();
    const get = this.#handle();
    this.#unDown = this.#conn.onDown(() => {
      const l = get();
      if (l && !l.#released && !l.#releasing) l.#lose("closed", true);
    });
  }

  /** From the first renewal on: held weakly, released when collected (see `forgotten`). */
  #goWeak(): void {
    if (this.#registered) return;
    this.#registered = true;
    this._weakRef();
    forgotten.register(this, {
      key: this.key, owner: this.owner, token: this.token, conn: this.#conn, ownConn: this.#ownConn,
      watcher: this.#watcher, watchId: this.#watchId, onEnd: this.#onEnd,
    }, this);
    if (this.bound) this.#listenDown();
  }

  /** Aborted (reason: a LockLostError) the moment the lease is known to be lost. */
  get signal(): AbortSignal {
    if (!this.#ctl) {
      this.#ctl = new AbortController();
      if (this.#lostReason !== null) this.#ctl.abort(new LockLostError(this.key, this.token, this.#lostReason));
    }
    return this.#ctl.signal;
  }

  /** Holds of a reentrant lease (rule 11): 1, plus one per reentrant acquire not yet released. */
  get holds(): number {
    return this.#releasing ? 0 : this.#holds;
  }

  /** @internal a reentrant acquire of the same grant (rule 11). */
  _hold(kind: LeaseKind, bound: boolean): void {
    if (kind !== this.kind || bound !== this.bound) {
      throw new InvalidArgumentError(
        `a reentrant acquire of ${JSON.stringify(this.key)} asked for a ${bound ? "bound " : ""}${kind} lease, ` +
          `but the lease held is a ${this.bound ? "bound " : ""}${this.kind} one`,
      );
    }
    this.#holds++;
  }

  /** @internal whether the lease is live for rule 11 (neither released nor lost). */
  get _live(): boolean {
    return !this.released && !this.lost;
  }

  /** @internal rule 9: the server's WATCH says the grant ended. */
  _serverEnded(event: WatchEvent): void {
    if (this.#released || this.#releasing) return; // our own release
    if (event === "gone" && this.bound) {
      // Ended before the WATCH named it: for a bound lease most likely its connection closed,
      // whose close event says so (`closed`) a moment later; give it that moment.
      const get = this.#handle();
      setTimeout(() => {
        const l = get();
        if (l && !l.#released && !l.#releasing) l.#lose("gone", true);
      }, GONE_GRACE_MS).unref();
      return;
    }
    this.#lose(EVENT_REASON[event] ?? "gone", true);
  }

  /** Why the lease was lost (rule 12), or null while it is not. */
  get lostReason(): LossReason | null {
    return this.lost ? this.#lostReason : null;
  }

  /** FLOCK.HOLDERS of this lease's key: every live grant, oldest first. */
  async holders(): Promise<Array<{ owner: string; token: number; ttlMs: number }>> {
    const r = await this.#conn.call(["FLOCK.HOLDERS", this.key]);
    return parseHolders(r);
  }

  /** The ttl that renewals ask for (the last one given). */
  get ttlMs(): number {
    return this.#ttl;
  }

  /** True once the lease is lost: renewal refused, local deadline passed, token fenced off... */
  get lost(): boolean {
    if (this.#lostReason === null && !this.#released && !this.#releasing && now() >= this.#deadline) {
      this.#lose("deadline-passed", false);
    }
    return this.#lostReason !== null;
  }

  /** True once release() was called. */
  get released(): boolean {
    return this.#released || this.#releasing !== null;
  }

  /**
   * Milliseconds left by the local clock, counted from the send time of the request that
   * granted or last renewed the lease, so never more than the server's CHECK; 0 once lost or
   * released.
   */
  remainingMs(): number {
    if (this.lost || this.released) return 0;
    return Math.max(0, Math.floor(this.#deadline - now()));
  }

  /**
   * "Is there enough lease left for the critical step?" From the local clock, no round trip.
   * Throws LockLostError when lost (or released), LeaseTooShortError when live with less than
   * `minMs` left. Changes nothing.
   */
  ensure(minMs = 0): void {
    if (this.lost) throw this.#lostError();
    if (this.released) throw new LockLostError(this.key, this.token, "released");
    const left = Math.max(0, Math.floor(this.#deadline - now()));
    if (left < minMs || left <= 0) throw new LeaseTooShortError(this.key, this.token, left, minMs);
  }

  /** Resolves true when the lease is lost within `timeoutMs` (Infinity: no limit), false else. */
  waitLost(timeoutMs = Infinity): Promise<boolean> {
    if (this.lost) return Promise.resolve(true);
    if (this.released) return Promise.resolve(false);
    return new Promise((resolve) => {
      let timer: NodeJS.Timeout | undefined;
      const onAbort = () => {
        if (timer) clearTimeout(timer);
        resolve(true);
      };
      this.signal.addEventListener("abort", onAbort, { once: true });
      if (Number.isFinite(timeoutMs)) {
        timer = setTimeout(() => {
          this.signal.removeEventListener("abort", onAbort);
          resolve(this.lost);
        }, Math.max(0, timeoutMs));
      }
    });
  }

  /** FLOCK.CHECK key token: the server's remaining lease in ms, 0 when the grant is gone (then lost). */
  async check(): Promise<number> {
    const sent = now();
    const r = Number(await this.#conn.call(["FLOCK.CHECK", this.key, this.token]));
    if (r > 0) {
      // The server counted r from a moment after `sent`: sent + r never overshoots its deadline.
      if (sent + r < this.#deadline) {
        this.#deadline = sent + r;
        this.#armExpiry();
      }
    } else if (!this.#released && !this.#releasing) {
      this.#lose("gone", true);
    }
    return r;
  }

  /**
   * Renews now with a token-qualified RENEW (`ttlMs` becomes the ttl of later renewals too).
   * Throws LockLostError when the lease is lost or the server refuses.
   */
  async renew(ttlMs?: number): Promise<void> {
    if (ttlMs !== undefined) checkTtl(ttlMs);
    if (this.lost) throw this.#lostError();
    if (this.released) throw new LockLostError(this.key, this.token, "released");
    if (ttlMs !== undefined) this.#ttl = ttlMs;
    const r = await this.#renewOnce(this.#ttl);
    if (r === false) throw this.#lostError();
    // A durable renewal that fell short: the lease is live, with the deadline it had.
    if (r !== true) throw r;
    this.#scheduleRenew();
  }

  /** The durability of this lease's grant and renewals (rule 10), or null for a plain lease. */
  get durability(): Readonly<Durability> | null {
    const d = this.#durable;
    return d ? { replicas: d.replicas, fsync: d.fsync, timeoutMs: d.timeoutMs } : null;
  }

  /**
   * Runs `command` through FLOCK.FENCED with this lease's token (rule 6). The server refuses it
   * when the token is not live; then this throws FencedError and the lease is lost. Sent even
   * when the local clock already says lost: the server is the judge of the write.
   */
  async fenced(...command: Array<string | number>): Promise<unknown> {
    if (command.length === 0) throw new InvalidArgumentError("fenced() needs a command");
    if (this.released) throw new LockLostError(this.key, this.token, "released");
    try {
      return await this.#conn.call(["FLOCK.FENCED", this.key, this.token, ...command]);
    } catch (err) {
      if (replyCode(err) === "FENCED") {
        this.#lose("fenced-refused", true);
        throw new FencedError(this.key, this.token, err);
      }
      throw err;
    }
  }

  /**
   * Ends the lease: stops the watchdog, then FLOCK.RELEASE key owner token (rule 4), retried on
   * connection errors (a retry answered 0 counts as released). Resolves true when released,
   * false when the grant had already ended before (the lease was lost). Idempotent.
   */
  release(): Promise<boolean> {
    if (this.#releasing) return this.#releasing;
    if (this.#holds > 1) {
      // Rule 11: not the last hold of a reentrant lease; the grant stays.
      this.#holds--;
      return Promise.resolve(true);
    }
    this.#stopTimers();
    if (this.#registered) forgotten.unregister(this);
    this.#end();
    this.#releasing = this.#doRelease().finally(() => {
      this.#released = true;
      this.#unDown?.();
      if (this.#ownConn) void this.#conn.close();
    });
    return this.#releasing;
  }

  /** `await using lease = await flock.acquire(...)`: releases; throws LockLostError if it was lost. */
  async [Symbol.asyncDispose](): Promise<void> {
    const wasLost = this.lost;
    const ok = await this.release();
    if (wasLost || !ok) throw this.#lostError();
  }

  // ------------------------------------------------------------------ internals

  async #doRelease(): Promise<boolean> {
    if (this.#gone) return false;
    const args = ["FLOCK.RELEASE", this.key, this.owner, this.token];
    let retried = false;
    let delay = 10;
    for (;;) {
      try {
        const r = Number(await this.#conn.call(args));
        if (r === 1) return true;
        if (retried) return true; // rule 4: a retry answered 0 counts as released
        if (this.#lostReason === null) this.#lose("gone", true);
        return false;
      } catch (err) {
        if (isReplyError(err) && replyCode(err) !== "TRYAGAIN") throw err;
        if (this.bound && !isReplyError(err)) {
          // A bound lease's connection failed (it never reconnects): the server ends the grant
          // when that connection closes, as on expiry, so nothing is left to release and the
          // lease was lost. Retrying would only wait for the deadline on a dead connection.
          this.#lose("closed", true);
          return false;
        }
        // A connection error: the RELEASE may or may not have run. Retry while the grant can
        // still be live; past the deadline (no RENEW is sent any more) it has ended by itself.
        if (isClosedClientError(err) || now() >= this.#deadline) {
          if (now() >= this.#deadline) return true;
          throw err;
        }
        retried = true;
        await sleep(Math.min(delay, this.#deadline - now()));
        delay = Math.min(delay * 2, 200);
      }
    }
  }

  #lostError(): LockLostError {
    return new LockLostError(this.key, this.token, this.#lostReason ?? "deadline-passed");
  }

  /** The lease is over for the Flock: forget it, watch it no more (once). */
  #end(): void {
    if (this.#ended) return;
    this.#ended = true;
    if (this.#watchId !== null) this.#watcher?.remove(this.#watchId);
    this.#onEnd?.(this.key, this.owner, this.token);
  }

  #lose(reason: LossReason, confirmed: boolean): void {
    if (confirmed) this.#gone = true;
    if (this.#lostReason !== null) return;
    this.#lostReason = reason;
    this.#stopTimers();
    this.#end();
    if (confirmed && this.#registered) forgotten.unregister(this);
    if (reason === "deadline-passed" && this.#serverAhead && !this.#gone && !this.released) {
      // A renewal that fell short extended the grant on the master past the deadline we kept:
      // hand it back rather than leave the key held by nobody.
      void this.#conn.call(["FLOCK.RELEASE", this.key, this.owner, this.token]).catch(() => {});
    }
    this.#ctl?.abort(new LockLostError(this.key, this.token, reason));
  }

  #stopTimers(): void {
    if (this.#renewTimer) clearTimeout(this.#renewTimer);
    if (this.#expiryTimer) clearTimeout(this.#expiryTimer);
    this.#renewTimer = this.#expiryTimer = null;
  }

  #armExpiry(): void {
    if (this.#expiryTimer) clearTimeout(this.#expiryTimer);
    this.#expiryTimer = null;
    if (this.#lostReason !== null || this.released) return;
    const get = this.#handle();
    this.#expiryTimer = setTimeout(() => {
      const l = get();
      if (!l) return;
      l.#expiryTimer = null;
      if (now() >= l.#deadline) {
        if (!l.released) l.#lose("deadline-passed", false);
      } else l.#armExpiry();
    }, Math.max(0, Math.ceil(this.#deadline - now())));
    this.#expiryTimer.unref();
  }

  #scheduleRenew(inMs = Math.floor(this.#ttl / 3)): void {
    if (!this.#watchdog || this.#lostReason !== null || this.released) return;
    if (this.#renewTimer) clearTimeout(this.#renewTimer);
    // Once renewed, through a WeakRef: a pending renewal must not keep a forgotten lease alive.
    const get = this.#handle();
    this.#renewTimer = setTimeout(() => {
      const l = get();
      if (!l) return;
      l.#renewTimer = null;
      void l.#watchdogTick();
    }, Math.max(1, Math.floor(inMs)));
    this.#renewTimer.unref();
  }

  async #watchdogTick(): Promise<void> {
    this.#goWeak();
    const started = now();
    const r = await this.#renewOnce(this.#ttl);
    if (r === true) this.#scheduleRenew();
    else if (r !== false) {
      // A durable renewal fell short: the deadline stays where it was; try again a renewal
      // period after this one was sent (at once when the WAIT took that long). The lease is
      // lost when the deadline comes first.
      this.#scheduleRenew(Math.floor(this.#ttl / 3) - (now() - started));
    }
  }

  /**
   * One token-qualified RENEW, retried on connection errors but never sent at or past the local
   * deadline. Resolves true when renewed, false when the lease is (now) lost. A durable renewal
   * is RENEW + WAIT (WAITAOF), its WAIT no longer than the time left; when too few acknowledged
   * it resolves with a LockNotDurableError and leaves the deadline where it was.
   */
  async #renewOnce(ttl: number): Promise<boolean | LockNotDurableError | FlockError> {
    let delay = Math.max(5, Math.min(50, Math.floor(ttl / 10)));
    for (;;) {
      if (this.#lostReason !== null || this.released) return false;
      const sent = now();
      if (sent >= this.#deadline) {
        this.#lose("deadline-passed", false);
        return false;
      }
      const seq = ++this.#renewSeq;
      try {
        const cmd: Arg[] = ["FLOCK.RENEW", this.key, this.owner, ttl, this.token];
        const d = this.#durable;
        let acked: Acked | null = null;
        let r: unknown;
        if (d) {
          acked = await d.run(cmd, Math.min(d.timeoutMs, Math.max(1, Math.floor(this.#deadline - now()))));
          // A WAIT lost with its connection counted nothing: try again (the RENEW is idempotent;
          // it renewed on the master, though, past the deadline we keep).
          if (acked.waitError !== undefined && !isReplyError(acked.waitError)) {
            if (acked.reply !== null && acked.reply !== undefined) this.#serverAhead = true;
            throw acked.waitError;
          }
          r = acked.reply;
        } else {
          r = await this.#conn.call(cmd);
        }
        if (this.released) return false;
        if (r === null || r === undefined) {
          this.#lose("renew-refused", true);
          return false;
        }
        if (this.#lostReason !== null) {
          // Renewed on the server after the local clock had given the lease up: hand it back
          // rather than hold a lock nobody uses (the lease stays lost: loss is final).
          void this.#conn.call(["FLOCK.RELEASE", this.key, this.owner, this.token]).catch(() => {});
          return false;
        }
        if (acked && !acked.ok) {
          this.#serverAhead = true;
          if (acked.waitError !== undefined) {
            const msg = acked.waitError instanceof Error ? acked.waitError.message : String(acked.waitError);
            return new FlockError(`the server refused ${d!.fsync ? "WAITAOF" : "WAIT"} after RENEW: ${msg}`, { cause: acked.waitError });
          }
          return new LockNotDurableError({
            key: this.key, token: this.token, operation: "renew", acknowledged: acked.acknowledged,
            asked: d!.replicas, fsync: d!.fsync, fsynced: acked.fsynced, timeoutMs: d!.timeoutMs,
          });
        }
        if (seq > this.#appliedSeq) {
          this.#appliedSeq = seq;
          this.#deadline = sent + ttl;
          this.#armExpiry();
        }
        return true;
      } catch (err) {
        if (this.bound && !isReplyError(err)) {
          // A bound grant dies with its connection: no retry can save it.
          this.#lose("closed", true);
          return false;
        }
        // A connection error (or a transient server error: LOADING, TRYAGAIN...): retry, but
        // never past the local deadline (rule 2).
        const left = this.#deadline - now();
        if (left <= 0) {
          this.#lose("deadline-passed", false);
          return false;
        }
        await sleep(Math.min(delay, left));
        delay = Math.min(delay * 2, 250);
      }
    }
  }
}

export { checkTtl };

// Made outside the class on purpose: a closure made in a method shares its context with every
// other closure of that method, and one that uses `this` would hold the lease through it.
function weakHandle(w: WeakRef<Lease>): () => Lease | undefined {
  return () => w.deref();
}
function strongHandle(l: Lease): () => Lease | undefined {
  return () => l;
}

/** FLOCK.HOLDERS' `[owner, token, ttl]` triples as records. */
export function parseHolders(r: unknown): Array<{ owner: string; token: number; ttlMs: number }> {
  if (!Array.isArray(r)) return [];
  return r.map((t) => {
    const [owner, token, ttl] = t as [unknown, unknown, unknown];
    return { owner: String(owner), token: Number(token), ttlMs: Number(ttl) };
  });
}
