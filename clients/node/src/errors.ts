/** Base class of every error this client raises on its own account. */
export class FlockError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** The lock was not granted within `waitMs` (only `withLock` raises it; `acquire` returns null). */
export class LockBusyError extends FlockError {
  readonly key: string;
  constructor(key: string, message = `lock ${JSON.stringify(key)} was not granted in time`) {
    super(message);
    this.key = key;
  }
}

/** Why a lease was lost. */
export type LossReason =
  | "expired" // the local deadline passed without a renewal (rule 2)
  | "renew-refused" // a token-qualified RENEW answered nil: the grant is gone (revoked, expired)
  | "check-refused" // FLOCK.CHECK answered 0
  | "fenced-refused" // FLOCK.FENCED refused the token as stale
  | "release-refused" // the first RELEASE answered 0: the grant had ended before it
  | "connection-closed" // the connection of a BOUND lease closed
  | "released"; // ensure() on a lease that was released

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
      "expired",
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
