/*
 * What any process may ask or do about a key without holding it (docs/CLIENTS.md "The API"):
 * inspection (info, holders, waiters, locked, check, stats), each one read-only command, and
 * takeover by a supervisor (release, revoke: rule 7). Flock extends this class.
 */
import type { Arg, Conn } from "./adapter.js";
import { InvalidArgumentError } from "./errors.js";
import { parseHolders } from "./lease.js";
import { checkKey, checkOwner } from "./options.js";

/** FLOCK.INFO of a key (SPEC "Commands"), with its field names. */
export interface LockInfo {
  /** The oldest live holder, or null. */
  owner: string | null;
  token: number | null;
  /** ms left of that grant. */
  ttl: number | null;
  waiters: number;
  mode: string;
  holders: number;
  limit: number;
  delayed: number;
  [field: string]: unknown;
}

export interface Holder {
  owner: string;
  token: number;
  ttlMs: number;
}

export interface Waiter {
  owner: string;
  mode: "exclusive" | "shared" | "permit";
  waitedMs: number;
}

/** FLOCK.STATS GET (SPEC "TTL sizing"): per lock class, the figures the server keeps. */
export interface FlockStats {
  classes: Record<string, Record<string, unknown>>;
  overflow: number;
}

/**
 * A map reply as an object: RESP2 gives a flat array of names and values, RESP3 a Map (or an
 * object, as node-redis maps it). Nested maps (`nested` names them) are converted too.
 */
function toObject(r: unknown, nested: (name: string) => boolean = () => false): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  const put = (k: unknown, v: unknown) => {
    const name = String(k);
    out[name] = nested(name) && v !== null && v !== undefined ? toObject(v) : normal(v);
  };
  if (Array.isArray(r)) for (let i = 0; i + 1 < r.length; i += 2) put(r[i], r[i + 1]);
  else if (r instanceof Map) for (const [k, v] of r) put(k, v);
  else if (r && typeof r === "object") for (const [k, v] of Object.entries(r)) put(k, v);
  return out;
}

/** Integers as numbers, nil as null, buffers as strings; arrays element by element. */
function normal(v: unknown): unknown {
  if (v === undefined || v === null) return null;
  if (Buffer.isBuffer(v)) return v.toString();
  if (Array.isArray(v)) return v.map(normal);
  return v;
}

export class Inspection {
  readonly #main: Conn;

  /** @internal */
  constructor(main: Conn) {
    this.#main = main;
  }

  /** FLOCK.INFO key: an object with INFO's field names, or null when nobody holds, waits for or delays it. */
  async info(key: string): Promise<LockInfo | null> {
    checkKey(key);
    const r = await this.#main.call(["FLOCK.INFO", key]);
    if (r === null || r === undefined) return null;
    const o = toObject(r);
    for (const f of ["token", "ttl", "waiters", "holders", "limit", "delayed"]) {
      if (o[f] !== null && o[f] !== undefined) o[f] = Number(o[f]);
    }
    if (o.owner !== null && o.owner !== undefined) o.owner = String(o.owner);
    return o as LockInfo;
  }

  /** FLOCK.HOLDERS key: every live grant, oldest first. */
  async holders(key: string): Promise<Holder[]> {
    checkKey(key);
    return parseHolders(await this.#main.call(["FLOCK.HOLDERS", key]));
  }

  /** FLOCK.WAITERS key [COUNT n]: the waiting requests, first in line first. */
  async waiters(key: string, count?: number): Promise<Waiter[]> {
    checkKey(key);
    const args: Arg[] = ["FLOCK.WAITERS", key];
    if (count !== undefined) {
      if (!Number.isSafeInteger(count) || count < 1) throw new InvalidArgumentError(`count must be a positive integer, got ${String(count)}`);
      args.push("COUNT", count);
    }
    const r = await this.#main.call(args);
    if (!Array.isArray(r)) return [];
    return r.map((t) => {
      const [owner, mode, waited] = t as [unknown, unknown, unknown];
      return { owner: String(owner), mode: String(mode) as Waiter["mode"], waitedMs: Number(waited) };
    });
  }

  /** Whether any live grant holds `key` (FLOCK.INFO's holders). */
  async locked(key: string): Promise<boolean> {
    const i = await this.info(key);
    return i !== null && i.holders > 0;
  }

  /** FLOCK.CHECK key token: remaining ms of that grant, 0 when it is not live. */
  async check(key: string, token: number): Promise<number> {
    checkKey(key);
    if (!Number.isSafeInteger(token) || token < 1) throw new InvalidArgumentError(`token must be a positive integer, got ${String(token)}`);
    return Number(await this.#main.call(["FLOCK.CHECK", key, token]));
  }

  /**
   * FLOCK.STATS GET [class ...]: per lock class (`lock:orders:#`) its counts and hold, ttl and
   * wait percentiles (null while there is nothing to measure). Outside a cluster only: on a
   * cluster client it goes to one node (the one of the first class name, or a random one).
   */
  async stats(...classes: string[]): Promise<FlockStats> {
    for (const c of classes) checkKey(c);
    const route = classes[0] ?? "stats";
    const r = await this.#main.call(["FLOCK.STATS", "GET", ...classes], route);
    const top = toObject(r);
    const classesOut: Record<string, Record<string, unknown>> = {};
    const raw = top.classes;
    // Each class's figures are a map whose hold_ms, ttl_ms and wait_ms are maps again.
    const pairs: Array<[unknown, unknown]> = Array.isArray(raw)
      ? Array.from({ length: Math.floor(raw.length / 2) }, (_, i) => [raw[2 * i], raw[2 * i + 1]])
      : raw instanceof Map ? [...raw.entries()] : Object.entries((raw as object) ?? {});
    for (const [name, v] of pairs) classesOut[String(name)] = toObject(v, (n) => n === "hold_ms" || n === "ttl_ms" || n === "wait_ms");
    return { classes: classesOut, overflow: Number(top.overflow ?? 0) };
  }

  /**
   * FLOCK.RELEASE key owner [token] from any process (rule 7: a supervisor releasing a named
   * owner's grant). True when a live grant was released.
   */
  async release(key: string, owner: string, token?: number | null): Promise<boolean> {
    checkKey(key);
    checkOwner(owner);
    const args: Arg[] = ["FLOCK.RELEASE", key, owner];
    if (token !== undefined && token !== null) args.push(token);
    return Number(await this.#main.call(args)) === 1;
  }

  /** FLOCK.REVOKE key [owner]: ends the key's grants (or only `owner`'s); the number ended. */
  async revoke(key: string, owner?: string | null): Promise<number> {
    checkKey(key);
    const args: Arg[] = ["FLOCK.REVOKE", key];
    if (owner !== undefined && owner !== null) {
      checkOwner(owner);
      args.push(owner);
    }
    return Number(await this.#main.call(args));
  }
}
