/*
 * Rule 9 (docs/CLIENTS.md): a loss is heard from the server, not found at the next renewal.
 * One FLOCK.WATCH names the (key, token) pairs of the live leases a Flock holds on a server node
 * (in a cluster: of one slot, WATCH's rule) and answers the moment one of those grants ends. It
 * runs on a connection of its own (a duplicate of the caller's client), so renewals, waits and
 * releases never queue behind it: one such connection per node outside a cluster, one per slot
 * with watched leases in a cluster, and one more per further 64 leases (WATCH's most pairs).
 *
 * Adding a lease re-arms the waiting WATCH with CLIENT UNBLOCK (its reply is nil, then the loop
 * sends the new set). Adding is deferred by ARM_DELAY_MS so that a lease released within it (a
 * short critical section) costs no round trip at all; the delay is what a loss in those first
 * milliseconds waits longer (a WATCH naming a grant that already ended answers `gone` at once).
 * A lease's own release needs nothing: its `released` event wakes the WATCH, which then leaves it
 * out. The watcher holds leases weakly: it never keeps a forgotten lease alive (rule 11).
 */
import { performance } from "node:perf_hooks";
import { isClosedClientError, isReplyError, keySlot, replyCode, type Adapter, type Arg, type Conn } from "./adapter.js";

/** The events of a WATCH reply for a watched grant (SPEC "WATCH and WAITERS"). */
export type WatchEvent = "released" | "expired" | "revoked" | "closed" | "lost" | "gone";

/** What the watcher tells a lease. */
export interface Watched {
  /** @internal the server says the grant ended (WATCH's event). */
  _serverEnded(event: WatchEvent): void;
  /** @internal a WeakRef to it, which the watcher keeps once the lease is in a WATCH. */
  _weakRef(): WeakRef<Watched>;
}

/** WATCH's most key/token pairs. */
export const MAX_PAIRS = 64;
/** How long a new lease waits before it is added to the WATCH (see above). */
export const ARM_DELAY_MS = 5;
/** CLIENT SETNAME of the watching connections: what CLIENT LIST shows an operator. */
export const WATCH_CONN_NAME = "flock-watch";
/** A watching connection with nothing to watch is closed after this long. */
const IDLE_CLOSE_MS = 2000;

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, Math.max(0, ms)).unref());

interface Entry {
  key: string;
  token: number;
  /** Until the lease joins a WATCH (ARM_DELAY_MS): held strongly, no WeakRef made for leases that end sooner. */
  lease: Watched | null;
  ref: WeakRef<Watched> | null;
  /** performance.now() when added: only entries ARM_DELAY_MS old start or wake a WATCH. */
  addedAt: number;
}

/** One watching connection and the up to 64 leases it watches. */
class Line {
  readonly entries = new Map<string, Entry>();
  conn: Conn | null = null;
  connId: number | null = null;
  /** The ids of the pairs the WATCH in flight names; null when none is in flight. */
  inFlight: Set<string> | null = null;
  gen = 0;
  running = false;
  armTimer: NodeJS.Timeout | null = null;
  idleTimer: NodeJS.Timeout | null = null;
  constructor(readonly group: string) {}
}

const idOf = (key: string, token: number) => `${token}\0${key}`;

export class Watcher {
  readonly #adapter: Adapter;
  readonly #cluster: boolean;
  readonly #groups = new Map<string, Line[]>();
  readonly #lineOf = new Map<string, Line>();
  #closed = false;
  #unDown: (() => void) | null = null;
  /** Why watching stopped for good (the server refused WATCH: an old module, an ACL), or null. */
  disabled: string | null = null;

  constructor(adapter: Adapter) {
    this.#adapter = adapter;
    this.#cluster = adapter.library.endsWith("-cluster");
  }

  /** The number of leases watched or about to be (tests, diagnostics). */
  get size(): number {
    return this.#lineOf.size;
  }

  /** The number of watching connections open. */
  get connections(): number {
    let n = 0;
    for (const lines of this.#groups.values()) for (const l of lines) if (l.conn) n++;
    return n;
  }

  /** @internal whether a WATCH naming this grant is waiting on the server (tests). */
  _watching(key: string, token: number): boolean {
    const line = this.#lineOf.get(idOf(key, token));
    return !!line && line.connId !== null && !!line.inFlight?.has(idOf(key, token));
  }

  /** Watches a lease from ARM_DELAY_MS on; the id to remove() it with, or null when not watching. */
  add(key: string, token: number, lease: Watched): string | null {
    if (this.#closed || this.disabled !== null) return null;
    if (!this.#unDown) {
      // The caller's client closing ends watching: no connection of ours outlives it.
      this.#unDown = this.#adapter.main.onDown(() => this.#onMainDown());
    }
    const group = this.#cluster ? String(keySlot(key)) : "";
    let lines = this.#groups.get(group);
    if (!lines) this.#groups.set(group, (lines = []));
    let line = lines.find((l) => l.entries.size < MAX_PAIRS);
    if (!line) lines.push((line = new Line(group)));
    const id = idOf(key, token);
    line.entries.set(id, { key, token, lease, ref: null, addedAt: performance.now() });
    this.#lineOf.set(id, line);
    // (An idle timer left running finds the line busy again and leaves it: no timer churn.)
    if (!line.armTimer) this.#schedule(line, ARM_DELAY_MS);
    return id;
  }

  #schedule(line: Line, ms: number): void {
    line.armTimer = setTimeout(() => {
      line.armTimer = null;
      this.#arm(line);
    }, Math.max(1, Math.ceil(ms)));
    line.armTimer.unref();
  }

  /** The lease ended on our side (released, lost, collected): watch it no more. */
  remove(id: string): void {
    const line = this.#lineOf.get(id);
    if (!line) return;
    this.#lineOf.delete(id);
    line.entries.delete(id);
    // The WATCH in flight still names it; its `released` event (or the next change) re-arms it.
    if (line.entries.size === 0 && !line.running) this.#idle(line);
  }

  /**
   * Starts or wakes the WATCH for the entries not in it that are ARM_DELAY_MS old; younger ones
   * wait for their turn (a short critical section that started meanwhile costs nothing).
   */
  #arm(line: Line): void {
    if (this.#closed || line.entries.size === 0) return;
    const now = performance.now();
    let due = false;
    let nextDue = Infinity;
    for (const [id, e] of line.entries) {
      if (line.inFlight?.has(id)) continue;
      const at = e.addedAt + ARM_DELAY_MS;
      if (at <= now + 0.5) {
        due = true;
        break;
      }
      nextDue = Math.min(nextDue, at);
    }
    if (!due) {
      if (Number.isFinite(nextDue) && !line.armTimer) this.#schedule(line, nextDue - now);
      return;
    }
    if (!line.running) void this.#run(line);
    else if (line.inFlight) void this.#unblock(line);
  }

  /** Wakes the line's WATCH (nil reply) so that it is sent again with the new set. */
  async #unblock(line: Line): Promise<void> {
    const gen = line.gen;
    const route = line.entries.values().next().value?.key;
    // The CLIENT ID and the WATCH may not have reached the server yet: try again shortly.
    for (let attempt = 0; attempt < 200; attempt++) {
      if (line.gen !== gen || !line.inFlight || this.#closed) return;
      if (line.connId !== null) {
        try {
          if (Number(await this.#adapter.main.call(["CLIENT", "UNBLOCK", line.connId], route)) === 1) return;
        } catch {
          return; // the WATCH goes on with the old set; the next change tries again
        }
      }
      await sleep(2);
    }
  }

  async #run(line: Line): Promise<void> {
    line.running = true;
    let backoff = 10;
    try {
      while (!this.#closed && line.entries.size > 0) {
        const entries = [...line.entries.entries()].slice(0, MAX_PAIRS);
        const route = entries[0][1].key;
        const args: Arg[] = ["FLOCK.WATCH", 0];
        for (const [, e] of entries) {
          args.push(e.key, e.token);
          if (e.lease) {
            e.ref = e.lease._weakRef();
            e.lease = null;
          }
        }
        let reply: unknown;
        try {
          const conn = line.conn ?? (line.conn = await this.#adapter.nodeConn(route, WATCH_CONN_NAME));
          if (this.#closed) break;
          // CLIENT ID right before the WATCH on the same connection: the id that CLIENT UNBLOCK
          // needs, current after any reconnection, at no added latency.
          const idP = conn.call(["CLIENT", "ID"], route);
          const watchP = conn.call(args, route);
          line.gen++;
          line.connId = null;
          line.inFlight = new Set(entries.map(([id]) => id));
          idP.then((id) => (line.connId = Number(id)), () => (line.connId = null));
          reply = await watchP;
        } catch (err) {
          line.inFlight = null;
          if (this.#closed) break;
          if (isReplyError(err)) {
            const code = replyCode(err);
            if (code === "WRONGTYPE") {
              await this.#sortWrongType(line, entries.map(([, e]) => e));
            } else if (["TRYAGAIN", "MOVED", "ASK"].includes(code) && this.#cluster && line.conn) {
              // The slot moved: watch on its new master (a connection to the old one is of no use).
              void line.conn.close();
              line.conn = null;
              void this.#adapter.main.call(["FLOCK.CHECK", route, 1]).catch(() => {}); // learn the new owner
            } else if (!["TRYAGAIN", "UNBLOCKED", "LOADING", "CLUSTERDOWN", "MOVED", "ASK", "MASTERDOWN"].includes(code)) {
              // Refused for good (no FLOCK.WATCH on this server, an ACL): renewals find losses.
              this.disabled = (err as Error).message;
              break;
            }
          } else if ((isClosedClientError(err) || this.#cluster) && line.conn) {
            // (In a cluster a node connection that failed may belong to a node that is gone.)
            void line.conn.close();
            line.conn = null;
          }
          await sleep(backoff);
          backoff = Math.min(backoff * 2, 500);
          continue;
        }
        line.inFlight = null;
        backoff = 10;
        if (!Array.isArray(reply)) continue; // nil: unblocked to re-arm
        const [key, event, , token] = reply as [unknown, unknown, unknown, unknown];
        this.#fire(line, idOf(String(key), Number(token)), String(event) as WatchEvent);
      }
    } finally {
      line.running = false;
      line.inFlight = null;
      if (this.#closed || this.disabled !== null) this.#closeLine(line);
      else if (line.entries.size === 0) this.#idle(line);
    }
  }

  #fire(line: Line, id: string, event: WatchEvent): void {
    const entry = line.entries.get(id);
    if (!entry) return; // released meanwhile (our own release's `released` event)
    line.entries.delete(id);
    this.#lineOf.delete(id);
    (entry.lease ?? entry.ref?.deref())?._serverEnded(event);
  }

  /** WATCH said WRONGTYPE: a value of another type replaced one of the keys. Which one? */
  async #sortWrongType(line: Line, entries: Entry[]): Promise<void> {
    for (const e of entries) {
      try {
        const left = Number(await this.#adapter.main.call(["FLOCK.CHECK", e.key, e.token]));
        if (left === 0) this.#fire(line, idOf(e.key, e.token), "gone");
      } catch (err) {
        if (replyCode(err) === "WRONGTYPE") this.#fire(line, idOf(e.key, e.token), "lost");
      }
    }
  }

  #idle(line: Line): void {
    if (line.idleTimer || !line.conn) return;
    line.idleTimer = setTimeout(() => {
      line.idleTimer = null;
      if (line.entries.size === 0 && !line.running) this.#closeLine(line);
    }, IDLE_CLOSE_MS);
    line.idleTimer.unref();
  }

  #closeLine(line: Line): void {
    if (line.conn) void line.conn.close();
    line.conn = null;
    const lines = this.#groups.get(line.group);
    if (lines && line.entries.size === 0) {
      const i = lines.indexOf(line);
      if (i >= 0) lines.splice(i, 1);
      if (lines.length === 0) this.#groups.delete(line.group);
    }
  }

  /**
   * The caller's client closed or failed: close the watching connections too (none outlives
   * it). Leases still held open new ones at their next WATCH; when the client is gone for good
   * their renewals fail, they are lost at their deadlines, and nothing is left to watch.
   */
  #onMainDown(): void {
    this.#unDown = null;
    for (const lines of this.#groups.values()) {
      for (const l of lines) {
        if (l.conn) void l.conn.close();
        l.conn = null;
      }
    }
  }

  /** Stops watching for good and closes the watching connections. */
  close(): void {
    this.#closed = true;
    this.#unDown?.();
    this.#onMainDown();
    for (const lines of this.#groups.values()) {
      for (const l of lines) {
        if (l.armTimer) clearTimeout(l.armTimer);
        if (l.idleTimer) clearTimeout(l.idleTimer);
      }
    }
  }
}
