/** Base class of every error this client raises on its own account. */
export class FlockError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/**
 * The client's own check of an argument failed (docs/CLIENTS.md rule 12): a bad key, ttl, owner,
 * wait, limit, an unknown option or a combination that excludes itself. Nothing was sent.
 */
export class InvalidArgumentError extends FlockError {}

/** The lock was not granted within `waitMs` (only `withLock` raises it; `acquire` returns null). */
export class LockBusyError extends FlockError {
  readonly key: string;
  constructor(key: string, message = `lock ${JSON.stringify(key)} was not granted in time`) {
    super(message);
    this.key = key;
  }
}

/**
 * Why a lease was lost (docs/CLIENTS.md rule 12), or `released` from ensure()/renew()/fenced()
 * on a lease that was released cleanly (which is not a loss).
 */
export type LossReason =
  | "revoked" // FLOCK.REVOKE ended the grant, or another process released it with our owner
  | "expired" // the server says the grant's ttl ran out
  | "closed" // the connection of a BOUND lease closed (the server says so, or we saw it fail)
  | "lost" // the server ended the grant any other way: DEL, UNLINK, FLUSHALL, eviction
  | "gone" // the server no longer knows the grant (WATCH gone, CHECK 0, a first RELEASE 0)
  | "renew-refused" // a token-qualified RENEW answered nil
  | "deadline-passed" // the local deadline passed before a renewal was answered (rule 1)
  | "fenced-refused" // FLOCK.FENCED refused the token as stale
  | "released"; // not a loss: ensure()/renew()/fenced() on a released lease

/** The lease is lost (or released, for ensure()). */
export class LockLostError extends FlockError {
  readonly key: string;
  readonly token: number;
  readonly reason: LossReason;
  constructor(key: string, token: number, reason: LossReason, message?: string) {
    super(message ?? `lease of ${JSON.stringify(key)} (token ${token}) is lost: ${reason}`);
    this.key = key;
    this.token = token;
    this.reason = reason;
  }
}

/** ensure(minMs) on a live lease with less than minMs left. The lease is unchanged. */
export class LeaseTooShortError extends LockLostError {
  readonly remainingMs: number;
  readonly minMs: number;
  constructor(key: string, token: number, remainingMs: number, minMs: number) {
    super(
      key,
      token,
      "deadline-passed",
      `lease of ${JSON.stringify(key)} (token ${token}) has ${remainingMs} ms left, less than the ${minMs} ms asked for`,
    );
    this.remainingMs = remainingMs;
    this.minMs = minMs;
  }
}

/** FLOCK.FENCED refused the lease's token as stale; the lease is marked lost. */
export class FencedError extends FlockError {
  readonly key: string;
  readonly token: number;
  constructor(key: string, token: number, cause: unknown) {
    super(cause instanceof Error ? cause.message : String(cause), { cause });
    this.key = key;
    this.token = token;
  }
}

/**
 * A durable grant or renewal (`replicas`, `fsync`) fell short: fewer replicas than asked (or,
 * with `fsync`, not the local AOF) acknowledged it within `durableTimeoutMs`. From `acquire` the
 * grant was released before this was thrown; from `lease.renew()` the lease is still live with
 * the deadline it had before (the renewal did not extend what the client believes).
 */
export class LockNotDurableError extends FlockError {
  readonly key: string;
  readonly token: number;
  /** "acquire": the grant was released; "renew": the lease keeps its earlier deadline. */
  readonly operation: "acquire" | "renew";
  /** Replicas that acknowledged the write (WAIT's reply; WAITAOF's second number with fsync). */
  readonly acknowledged: number;
  /** Replicas asked for (the `replicas` option). */
  readonly asked: number;
  /** Whether the local AOF fsync was asked for (`fsync: true`). */
  readonly fsync: boolean;
  /** With `fsync`: whether the master's own AOF had it on disk (WAITAOF's first number). */
  readonly fsynced: boolean;
  readonly timeoutMs: number;
  constructor(init: {
    key: string;
    token: number;
    operation: "acquire" | "renew";
    acknowledged: number;
    asked: number;
    fsync: boolean;
    fsynced: boolean;
    timeoutMs: number;
  }) {
    const parts: string[] = [];
    if (init.asked > 0 && init.acknowledged < init.asked) {
      parts.push(`${init.acknowledged} of ${init.asked} replica${init.asked === 1 ? "" : "s"} acknowledged it`);
    }
    if (init.fsync && !init.fsynced) parts.push("the AOF fsync did not complete");
    const what = init.operation === "acquire" ? "grant" : "renewal";
    const then =
      init.operation === "acquire" ? "the grant was released" : "the lease keeps the deadline of its last durable renewal";
    super(
      `${what} of ${JSON.stringify(init.key)} (token ${init.token}) is not durable: ` +
        `${parts.join(" and ") || "not acknowledged"} within ${init.timeoutMs} ms; ${then}`,
    );
    this.key = init.key;
    this.token = init.token;
    this.operation = init.operation;
    this.acknowledged = init.acknowledged;
    this.asked = init.asked;
    this.fsync = init.fsync;
    this.fsynced = init.fsynced;
    this.timeoutMs = init.timeoutMs;
  }
}
