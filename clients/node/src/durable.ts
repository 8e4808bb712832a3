/*
 * Durable grants (docs/CLIENTS.md rule 10): a grant or renewal counts only once `replicas`
 * replicas (WAIT) or, with `fsync`, the AOF (WAITAOF) acknowledged it. The WAIT goes right after
 * the write on the same connection (pipelined), so it waits for that write's offset on the key's
 * node. Those connections are Flock's own (a small pool of duplicates), never the caller's: a
 * WAIT that times out holds its connection for `durableTimeoutMs`, and that must not hold up
 * other leases' renewals or the application's commands (rule 8).
 */
import { isReplyError, type Adapter, type Arg, type Conn } from "./adapter.js";

/** What a durable lease asks for. */
export interface Durability {
  /** Replicas that must acknowledge (WAIT n; with fsync, WAITAOF 1 n). */
  replicas: number;
  /** The master's AOF must have it on disk (WAITAOF). */
  fsync: boolean;
  /** How long to wait for the acknowledgements (WAIT's timeout), ms, at least 1. */
  timeoutMs: number;
}

/** The outcome of a write followed by its WAIT. */
export interface Acked {
  /** The write's reply. */
  reply: unknown;
  /** Why the WAIT gave no count (a connection error, or the server refused WAITAOF). */
  waitError?: unknown;
  /** Replicas that acknowledged. */
  acknowledged: number;
  /** With fsync: the local AOF had it on disk. */
  fsynced: boolean;
  /** Enough acknowledged. */
  ok: boolean;
}

/** WAIT n timeout, or WAITAOF 1 n timeout with fsync. `timeoutMs` is at least 1 (0 means forever). */
export function waitCommand(d: Durability, timeoutMs: number): Arg[] {
  const t = Math.max(1, Math.floor(timeoutMs));
  return d.fsync ? ["WAITAOF", 1, d.replicas, t] : ["WAIT", d.replicas, t];
}

function parseAck(d: Durability, reply: unknown): { acknowledged: number; fsynced: boolean; ok: boolean } {
  if (d.fsync) {
    const a = reply as unknown[];
    if (!Array.isArray(a) || a.length < 2) throw new TypeError(`unexpected WAITAOF reply ${String(reply)}`);
    const local = Number(a[0]);
    const acknowledged = Number(a[1]);
    return { acknowledged, fsynced: local >= 1, ok: local >= 1 && acknowledged >= d.replicas };
  }
  const acknowledged = Number(reply);
  if (!Number.isInteger(acknowledged)) throw new TypeError(`unexpected WAIT reply ${String(reply)}`);
  return { acknowledged, fsynced: false, ok: acknowledged >= d.replicas };
}

/**
 * Sends `cmd` then its WAIT, pipelined on `conn` (on a cluster, to the master of `routeKey`'s
 * slot when given). Throws what the write threw; a failed WAIT comes back as `waitError` (the
 * write may have been applied: the caller decides).
 */
export async function callAcked(conn: Conn, cmd: Arg[], d: Durability, timeoutMs: number, routeKey?: string): Promise<Acked> {
  const { replies, ...ack } = await callAckedAll(conn, [cmd], d, timeoutMs, routeKey);
  if (replies[0].status === "rejected") throw replies[0].reason;
  return { reply: replies[0].value, ...ack };
}

/**
 * Several writes (the RENEWs of a FLOCK.MACQUIRE's keys) then one WAIT, pipelined on `conn`:
 * each write's outcome, and what the WAIT answered (`reply` unused).
 */
export async function callAckedAll(
  conn: Conn, cmds: Arg[][], d: Durability, timeoutMs: number, routeKey?: string,
): Promise<Omit<Acked, "reply"> & { replies: PromiseSettledResult<unknown>[] }> {
  const out = await conn.pipeline([...cmds, waitCommand(d, timeoutMs)], routeKey);
  const a = out.pop()!;
  if (a.status === "rejected") return { replies: out, waitError: a.reason, acknowledged: 0, fsynced: false, ok: false };
  return { replies: out, ...parseAck(d, a.value) };
}

const IDLE_MAX = 4;
const IDLE_CLOSE_MS = 5000;

/**
 * Flock's own connections for writes followed by a WAIT: borrowed for one pipeline, given back
 * idle, at most IDLE_MAX kept, all closed once the pool went IDLE_CLOSE_MS unused or when the
 * caller's client goes down (so none outlives it).
 */
export class DurablePool {
  readonly #adapter: Adapter;
  #idle: Conn[] = [];
  #timer: NodeJS.Timeout | null = null;
  /** When a connection was last given back (performance.now()). */
  #lastUsed = 0;
  #unDown: (() => void) | null = null;

  constructor(adapter: Adapter) {
    this.#adapter = adapter;
  }

  /** Runs `cmd` + WAIT on a connection of the pool (routed as `callAcked`). */
  async run(cmd: Arg[], d: Durability, timeoutMs: number, routeKey?: string): Promise<Acked> {
    const conn = this.#idle.pop() ?? (await this.#open());
    let healthy = false;
    try {
      const out = await callAcked(conn, cmd, d, timeoutMs, routeKey);
      healthy = out.waitError === undefined || isReplyError(out.waitError);
      return out;
    } catch (err) {
      healthy = isReplyError(err);
      throw err;
    } finally {
      this.#giveBack(conn, healthy);
    }
  }

  /** Closes the idle connections (borrowed ones close when given back). */
  closeIdle(): void {
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
    for (const c of this.#idle.splice(0)) void c.close();
  }

  async #open(): Promise<Conn> {
    if (!this.#unDown) this.#watchMain();
    return this.#adapter.dedicated({ bound: false, noResend: true });
  }

  /** When the caller's client closes or fails, the idle connections go too. */
  #watchMain(): void {
    this.#unDown = this.#adapter.main.onDown(() => {
      this.#unDown = null;
      this.closeIdle();
    });
  }

  #giveBack(conn: Conn, healthy: boolean): void {
    if (!healthy || this.#idle.length >= IDLE_MAX || !this.#unDown) {
      void conn.close();
      return;
    }
    this.#idle.push(conn);
    // One timer for the pool, not one per round trip: it looks at the last give-back when it
    // fires, and waits again for what is left of IDLE_CLOSE_MS when the pool was used since.
    this.#lastUsed = performance.now();
    if (!this.#timer) this.#arm(IDLE_CLOSE_MS);
  }

  #arm(ms: number): void {
    this.#timer = setTimeout(() => {
      this.#timer = null;
      const left = this.#lastUsed + IDLE_CLOSE_MS - performance.now();
      if (left > 0 && this.#idle.length > 0) this.#arm(left);
      else this.closeIdle();
    }, ms);
    this.#timer.unref();
  }
}
