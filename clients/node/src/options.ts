/*
 * The client's own argument checks (docs/CLIENTS.md rule 12), the same in every flock client:
 * each refuses with InvalidArgumentError before anything is sent, never as a server error.
 */
import type { Durability } from "./durable.js";
import { InvalidArgumentError } from "./errors.js";

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
  /**
   * The owner: a non-empty string of at most 256 bytes; default a random 128-bit hex string per
   * lease (rule 7), or with `reentrant` one per asynchronous context (rule 11).
   */
  owner?: string;
  /**
   * Rule 11: acquiring a key this Flock already holds with the same owner returns that same
   * lease with one more hold (released on the last release) instead of throwing LockBusyError.
   */
  reentrant?: boolean;
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

const KNOWN = new Set([
  "ttlMs", "waitMs", "shared", "limit", "bound", "renew", "owner", "reentrant", "replicas", "fsync", "durableTimeoutMs",
]);

/** The checked form of AcquireOptions. */
export interface Checked {
  ttl: number;
  wait: number;
  shared: boolean;
  limit: number | null;
  bound: boolean;
  renew: boolean;
  owner: string | null;
  reentrant: boolean;
  durability: Durability | null;
}

export function checkKey(key: unknown): asserts key is string {
  if (typeof key !== "string" || key.length === 0) {
    throw new InvalidArgumentError(`key must be a non-empty string, got ${describe(key)}`);
  }
}

export function checkTtl(ttlMs: unknown, name = "ttlMs"): asserts ttlMs is number {
  if (typeof ttlMs !== "number" || !Number.isSafeInteger(ttlMs) || ttlMs < 1) {
    throw new InvalidArgumentError(`${name} must be a positive integer of milliseconds, got ${describe(ttlMs)}`);
  }
}

export function checkOwner(owner: unknown): asserts owner is string {
  if (typeof owner !== "string" || owner.length === 0 || Buffer.byteLength(owner, "utf8") > 256) {
    throw new InvalidArgumentError(`owner must be a non-empty string of at most 256 bytes, got ${describe(owner)}`);
  }
}

function checkBool(opts: Record<string, unknown>, name: string): boolean {
  const v = opts[name];
  if (v === undefined || v === null) return false;
  if (typeof v !== "boolean") throw new InvalidArgumentError(`${name} must be a boolean, got ${describe(v)}`);
  return v;
}

/** Checks `opts` of acquire()/withLock(): every rule-12 check, in one place. */
export function checkOptions(opts: unknown): Checked {
  if (!opts || typeof opts !== "object" || Array.isArray(opts)) {
    throw new InvalidArgumentError("acquire(key, { ttlMs, ... }): options must be an object");
  }
  const o = opts as Record<string, unknown>;
  for (const name of Object.keys(o)) {
    if (!KNOWN.has(name)) {
      throw new InvalidArgumentError(`unknown option ${JSON.stringify(name)} (known: ${[...KNOWN].join(", ")})`);
    }
  }
  checkTtl(o.ttlMs);
  const wait = o.waitMs ?? 0;
  if (typeof wait !== "number" || Number.isNaN(wait) || wait < 0) {
    throw new InvalidArgumentError(`waitMs must be 0 or more (Infinity: no limit), got ${describe(o.waitMs)}`);
  }
  const shared = checkBool(o, "shared");
  const limit = o.limit ?? null;
  if (limit !== null && (typeof limit !== "number" || !Number.isSafeInteger(limit) || limit < 1)) {
    throw new InvalidArgumentError(`limit must be a positive integer, got ${describe(limit)}`);
  }
  if (shared && limit !== null) throw new InvalidArgumentError("shared and limit exclude each other");
  const owner = o.owner ?? null;
  if (owner !== null) checkOwner(owner);
  const bound = checkBool(o, "bound");
  const renew = o.renew === undefined || o.renew === null ? true : checkBool(o, "renew");
  const reentrant = checkBool(o, "reentrant");
  return {
    ttl: o.ttlMs, wait, shared, limit: limit as number | null, bound, renew, owner: owner as string | null, reentrant,
    durability: checkDurability(o, o.ttlMs, bound),
  };
}

/**
 * The options of acquireMany()/withLocks(): MACQUIRE grants exclusive leases only, and there is
 * no `reentrant` (a key this Flock holds with the same owner is LockBusyError, rule 11).
 */
export interface ManyOptions {
  /** Lease length in ms of every key's lease. Required. */
  ttlMs: number;
  /** How long to wait for all the keys at once (BLOCK): undefined/null/0 = one try, Infinity = no limit. */
  waitMs?: number | null;
  /** Every grant bound to one connection of their own (SPEC "BOUND"), lost when it closes. */
  bound?: boolean;
  /** Run each lease's watchdog. Default true. */
  renew?: boolean;
  /** The owner of every grant; default a random 128-bit hex string per call (rule 7). */
  owner?: string;
  /**
   * Durable grants (rule 10): hand the leases over only once this many replicas acknowledged the
   * MACQUIRE (WAIT); too few, and every key is released (LockNotDurableError). Not with `bound`.
   */
  replicas?: number;
  /** Durable grants: only once the master's AOF has them on disk (WAITAOF). Not with `bound`. */
  fsync?: boolean;
  /** How long to wait for the acknowledgements of `replicas`/`fsync`, ms. Default a third of the ttl. */
  durableTimeoutMs?: number;
}

/** FLOCK.MACQUIRE's numkeys limit (SPEC "MACQUIRE"). */
export const MAX_KEYS = 64;
const MANY_KNOWN = new Set(["ttlMs", "waitMs", "bound", "renew", "owner", "replicas", "fsync", "durableTimeoutMs"]);

/** Checks acquireMany()'s keys and options (rule 12): a list of 1 to 64 distinct keys. */
export function checkMany(keys: unknown, opts: unknown): Checked & { keys: string[] } {
  if (!Array.isArray(keys)) throw new InvalidArgumentError(`keys must be an array of keys, got ${describe(keys)}`);
  if (keys.length === 0 || keys.length > MAX_KEYS) {
    throw new InvalidArgumentError(`keys must hold 1 to ${MAX_KEYS} keys, got ${keys.length}`);
  }
  const seen = new Set<string>();
  for (const k of keys) {
    checkKey(k);
    if (seen.has(k)) throw new InvalidArgumentError(`key ${describe(k)} is given twice`);
    seen.add(k);
  }
  if (!opts || typeof opts !== "object" || Array.isArray(opts)) {
    throw new InvalidArgumentError("acquireMany(keys, { ttlMs, ... }): options must be an object");
  }
  for (const name of Object.keys(opts)) {
    if (!MANY_KNOWN.has(name)) {
      throw new InvalidArgumentError(`unknown option ${JSON.stringify(name)} for several keys (known: ${[...MANY_KNOWN].join(", ")})`);
    }
  }
  return { ...checkOptions(opts), keys: keys as string[] };
}

/** The durability asked for, checked; null for a plain lease. */
function checkDurability(o: Record<string, unknown>, ttl: number, bound: boolean): Durability | null {
  const replicas = o.replicas ?? 0;
  if (typeof replicas !== "number" || !Number.isSafeInteger(replicas) || replicas < 0) {
    throw new InvalidArgumentError(`replicas must be a non-negative integer, got ${describe(o.replicas)}`);
  }
  const fsync = checkBool(o, "fsync");
  const timeoutMs = o.durableTimeoutMs ?? Math.max(1, Math.floor(ttl / 3));
  if (typeof timeoutMs !== "number" || !Number.isSafeInteger(timeoutMs) || timeoutMs < 1) {
    throw new InvalidArgumentError(`durableTimeoutMs must be a positive integer of milliseconds, got ${describe(o.durableTimeoutMs)}`);
  }
  if (replicas === 0 && !fsync) return null;
  if (bound) {
    throw new InvalidArgumentError(
      "bound excludes replicas and fsync: a bound grant ends at any promotion by design, so it cannot be durable",
    );
  }
  return { replicas, fsync, timeoutMs };
}

function describe(v: unknown): string {
  if (typeof v === "string") return JSON.stringify(v.length > 40 ? `${v.slice(0, 40)}...` : v);
  if (typeof v === "bigint") return `${v}n`;
  if (Buffer.isBuffer(v)) return "a Buffer";
  if (v !== null && typeof v === "object") return Array.isArray(v) ? "an array" : "an object";
  return String(v);
}
