/*
 * One adapter per client library, chosen at run time by the shape of the client object, so that
 * neither ioredis nor redis (node-redis) is a hard dependency. Every flock command has its key as
 * the first argument after the command name; cluster adapters route on it.
 */

export type Arg = string | number;

/** A connection (or a cluster client) that flock commands can be sent on. */
export interface Conn {
  /**
   * Sends `args` (command name first, key second) and resolves with the reply. `routeKey`: on a
   * cluster, send it to the master of that key's slot instead (FLOCK.WATCH, whose first key is
   * its third argument, and CLIENT ID/UNBLOCK, which name no key).
   */
  call(args: Arg[], routeKey?: string): Promise<unknown>;
  /** Closes a connection this client opened (a duplicate). */
  close(): Promise<void>;
  /** Calls `cb` once when the connection fails or closes (BOUND leases); returns an unsubscribe. */
  onDown(cb: (err?: unknown) => void): () => void;
  /**
   * Sends `cmds` back to back on one connection, before any reply (pipelined), so that each runs
   * right after the one before on the same server connection: on a cluster, the connection to
   * the master of the first command's key (its second argument, or `routeKey`: a FLOCK.MACQUIRE
   * names numkeys first), following a slot move before any reply counts. Resolves with each
   * command's outcome, in order.
   */
  pipeline(cmds: Arg[][], routeKey?: string): Promise<PromiseSettledResult<unknown>[]>;
}

export interface Adapter {
  readonly library: "ioredis" | "ioredis-cluster" | "node-redis" | "node-redis-cluster";
  /** The caller's client. */
  readonly main: Conn;
  /**
   * A new connection of its own (rule 8): a duplicate() of the client, connected. `noResend`:
   * commands in flight when the connection drops fail rather than being sent again on the next
   * connection (ioredis' autoResendUnfulfilledCommands), so a pipeline never straddles two.
   */
  dedicated(opts: { bound: boolean; noResend?: boolean; unref?: boolean; name?: string }): Promise<Conn>;
  /**
   * A connection of its own to the server that serves `key` (rule 9's watching connection):
   * outside a cluster a duplicate of the client; in a cluster one connection to the master of
   * the key's slot (a duplicate of the cluster's own client for that node), not a whole cluster
   * client. Named `name`, unref'd, commands in flight never resent after a reconnection.
   */
  nodeConn(key: string, name: string): Promise<Conn>;
}

import { createRequire } from "node:module";
import { join } from "node:path";

type AnyClient = Record<string, any>;

/** True for an error that the server answered (as opposed to a connection or client failure). */
export function isReplyError(err: unknown): boolean {
  if (!(err instanceof Error)) return false;
  for (let p: any = err; p && p !== Error.prototype; p = Object.getPrototypeOf(p)) {
    const n = p.constructor?.name;
    if (n === "ReplyError" || n === "ErrorReply" || n === "SimpleError" || n === "BlobError") return true;
  }
  return false;
}

/** The reply-error prefix (`FENCED`, `TRYAGAIN`, `ERR` ...), or "" for non-reply errors. */
export function replyCode(err: unknown): string {
  if (!isReplyError(err)) return "";
  const m = /^([A-Z]+)\b/.exec((err as Error).message);
  return m ? m[1] : "";
}

/** True when the client was closed by its owner: retrying cannot help. */
export function isClosedClientError(err: unknown): boolean {
  if (!(err instanceof Error)) return false;
  const n = err.constructor?.name;
  return n === "ClientClosedError" || /The client is closed/.test(err.message);
}

// ---- CRC16 (XMODEM) hash slots, for routing ioredis Cluster module commands ----
const CRC_TABLE = (() => {
  const t = new Uint16Array(256);
  for (let i = 0; i < 256; i++) {
    let c = i << 8;
    for (let j = 0; j < 8; j++) c = c & 0x8000 ? ((c << 1) ^ 0x1021) & 0xffff : (c << 1) & 0xffff;
    t[i] = c;
  }
  return t;
})();

export function keySlot(key: string): number {
  let buf = Buffer.from(key);
  const open = buf.indexOf(0x7b); // {
  if (open >= 0) {
    const close = buf.indexOf(0x7d, open + 1); // }
    if (close > open + 1) buf = buf.subarray(open + 1, close);
  }
  let crc = 0;
  for (const b of buf) crc = ((crc << 8) & 0xffff) ^ CRC_TABLE[((crc >> 8) ^ b) & 0xff];
  return crc & 0x3fff;
}

// ---------------------------------------------------------------- ioredis
function isIoredis(c: AnyClient): boolean {
  return typeof c.call === "function" && typeof c.sendCommand === "function" && typeof c.duplicate === "function";
}

function ioredisDown(emitter: AnyClient, events: string[]): Conn["onDown"] {
  return (cb) => {
    let fired = false;
    const h = (err?: unknown) => {
      if (fired) return;
      fired = true;
      cb(err);
    };
    for (const e of events) emitter.on(e, h);
    return () => {
      for (const e of events) emitter.off(e, h);
    };
  };
}

/**
 * Sends each of `cmds` through `send` on the ioredis connection `c` with its socket corked, so
 * that the commands leave in one write: ioredis writes each command to the socket as it is sent,
 * and a WAIT written apart from its ACQUIRE reaches the server in a packet of its own, to be
 * read, and its replica asked, on another pass of the server's event loop. A connection that is
 * not ready queues the commands in order instead (nothing to cork).
 */
function ioredisCorked(c: AnyClient, cmds: Arg[][], send: (args: Arg[]) => Promise<unknown>): Promise<unknown>[] {
  const s = c.status === "ready" ? c.stream : null;
  const cork = s && typeof s.cork === "function" && typeof s.uncork === "function";
  if (cork) s.cork();
  try {
    return cmds.map(send);
  } finally {
    if (cork) s.uncork();
  }
}

function ioredisConn(c: AnyClient, owned: boolean): Conn {
  return {
    call: (args) => c.call(...(args as [string, ...Arg[]])),
    // Written in one go to the one stream (or queued in order while it connects).
    pipeline: (cmds) => Promise.allSettled(ioredisCorked(c, cmds, (args) => c.call(...(args as [string, ...Arg[]])))),
    close: async () => {
      if (owned) c.disconnect();
    },
    onDown: ioredisDown(c, ["close", "end"]),
  };
}

/**
 * ioredis' Command class, from the copy of ioredis that made this Cluster (found from the
 * application's entry point or working directory, and only used when the cluster is an
 * instance of that copy's Cluster), or null.
 */
const ioCommands = new WeakMap<object, any>();
function ioredisCommandClass(c: AnyClient): any {
  if (ioCommands.has(c)) return ioCommands.get(c);
  let found: any = null;
  // The loaded copy of ioredis whose Cluster made this client (several versions may be loaded).
  for (const m of Object.values(require.cache)) {
    const e = m?.exports;
    for (const x of [e, e?.default]) {
      if (x && (typeof x === "object" || typeof x === "function")) {
        if (typeof x.Cluster === "function" && typeof x.Command === "function" && c instanceof x.Cluster) found = x.Command;
      }
    }
    if (found) break;
  }
  if (found) {
    ioCommands.set(c, found);
    return found;
  }
  const bases = [require.main?.filename, join(process.cwd(), "index.js"), __filename];
  for (const base of bases) {
    if (!base) continue;
    try {
      const io = createRequire(base)("ioredis");
      const ClusterClass = io.Cluster ?? io.default?.Cluster;
      const CommandClass = io.Command ?? io.default?.Command;
      if (ClusterClass && CommandClass && c instanceof ClusterClass) {
        found = CommandClass;
        break;
      }
    } catch {
      /* not resolvable from there */
    }
  }
  ioCommands.set(c, found);
  return found;
}

function ioredisClusterConn(c: AnyClient, owned: boolean): Conn {
  const call = (args: Arg[], routeKey?: string): Promise<unknown> => {
    // ioredis does not know the key position of module commands and would send them to a
    // random node (then follow MOVED). Give the command its slot so it goes to the right master.
    const Command = ioredisCommandClass(c);
    if (!Command) return c.call(...(args as [string, ...Arg[]]));
    const [name, ...rest] = args;
    const cmd = new Command(String(name), rest, { replyEncoding: "utf8" });
    cmd.slot = keySlot(routeKey ?? String(rest[0]));
    return c.sendCommand(cmd);
  };
  return {
    call,
    // On the node connection itself: the cluster client would follow a MOVED for the first
    // command and leave the second on the old node.
    pipeline: (cmds, routeKey) =>
      clusterPipeline(cmds, routeKey, call, async (key) => {
        const nodeKey = c.slots?.[keySlot(key)]?.[0];
        return nodeKey ? (c.connectionPool?.getInstanceByKey?.(nodeKey) ?? null) : null;
      }, (node, cmds) => ioredisCorked(node, cmds, (args) => node.call(...(args as [string, ...Arg[]])))),
    close: async () => {
      if (owned) c.disconnect();
    },
    onDown: ioredisDown(c, ["-node", "node error", "close", "end"]),
  };
}

/**
 * A pipeline on the connection to the master of the first command's key. A MOVED or ASK for the
 * first command (the slot moved, or is moving) is followed by a routed FLOCK.CHECK, which lets
 * the cluster client learn the slot's owner, and the whole pipeline goes again there.
 */
async function clusterPipeline(
  cmds: Arg[][],
  routeKey: string | undefined,
  routed: (args: Arg[]) => Promise<unknown>,
  nodeOf: (key: string) => Promise<any>,
  sendAll: (node: any, cmds: Arg[][]) => Promise<unknown>[],
): Promise<PromiseSettledResult<unknown>[]> {
  const key = routeKey ?? String(cmds[0][1]);
  let delay = 10;
  for (let attempt = 1; ; attempt++) {
    let node = await nodeOf(key);
    if (!node) {
      await routed(["FLOCK.CHECK", key, 1]); // connects, or throws why it cannot
      node = await nodeOf(key);
      if (!node) throw new Error(`no connection to the master of slot ${keySlot(key)}`);
    }
    const out = await Promise.allSettled(sendAll(node, cmds));
    const first = out[0];
    const redirected = first.status === "rejected" && /^(MOVED|ASK) /.test(String((first.reason as Error)?.message));
    if (!redirected || attempt >= 8) return out;
    await routed(["FLOCK.CHECK", key, 1]).catch(() => {});
    await new Promise<void>((r) => setTimeout(r, delay).unref());
    delay = Math.min(delay * 2, 200);
  }
}

// ---------------------------------------------------------------- node-redis (v4, v5)
function isNodeRedis(c: AnyClient): boolean {
  return typeof c.sendCommand === "function" && typeof c.connect === "function" && typeof c.duplicate === "function";
}

function isNodeRedisCluster(c: AnyClient): boolean {
  return isNodeRedis(c) && typeof c.getSlotMaster === "function";
}

const str = (args: Arg[]) => args.map((a) => (typeof a === "string" ? a : String(a)));

async function nodeRedisClose(c: AnyClient): Promise<void> {
  try {
    if (typeof c.destroy === "function") c.destroy(); // v5
    else await c.disconnect(); // v4
  } catch {
    /* already closed */
  }
}

function nodeRedisDown(c: AnyClient, events: string[]): Conn["onDown"] {
  return (cb) => {
    let fired = false;
    const h = (err?: unknown) => {
      if (fired) return;
      fired = true;
      cb(err);
    };
    for (const e of events) c.on(e, h);
    return () => {
      for (const e of events) c.off(e, h);
    };
  };
}

function nodeRedisConn(c: AnyClient, owned: boolean): Conn {
  return {
    call: (args) => c.sendCommand(str(args)),
    pipeline: (cmds) => Promise.allSettled(cmds.map((args) => c.sendCommand(str(args)))),
    close: async () => {
      if (owned) await nodeRedisClose(c);
    },
    onDown: nodeRedisDown(c, ["end", "error"]),
  };
}

function nodeRedisClusterConn(c: AnyClient, owned: boolean): Conn {
  const call = (args: Arg[], routeKey?: string): Promise<unknown> =>
    c.sendCommand(routeKey ?? String(args[1]), false, str(args));
  return {
    call,
    pipeline: (cmds, routeKey) =>
      clusterPipeline(cmds, routeKey, call, async (key) => {
        const master = c.getSlotMaster(keySlot(key));
        return master ? ((await c.nodeClient(master)) ?? null) : null;
      }, (node, cmds) => cmds.map((args) => node.sendCommand(str(args)))),
    close: async () => {
      if (owned) await nodeRedisClose(c);
    },
    onDown: nodeRedisDown(c, ["node-error", "node-disconnect", "error", "end"]),
  };
}

/*
 * A connection that only watches (FLOCK.WATCH) must not keep the process alive by itself, as the
 * watchdog's timers do not: its sockets are unref'd, on every (re)connection.
 */
function ioredisUnref(d: AnyClient): void {
  const unrefAll = () => {
    d.stream?.unref?.();
    for (const n of typeof d.nodes === "function" ? d.nodes("all") : []) n.stream?.unref?.();
  };
  unrefAll();
  d.on("connect", unrefAll);
  d.on("ready", unrefAll);
  d.on("+node", (n: AnyClient) => {
    n.stream?.unref?.();
    n.on?.("connect", () => n.stream?.unref?.());
  });
}

function nodeRedisUnref(d: AnyClient): void {
  if (typeof d.unref === "function") {
    d.unref();
    d.on("connect", () => d.unref());
  }
}

export function adapt(client: unknown): Adapter {
  const a = adaptLibrary(client);
  return { ...a, nodeConn: (key, name) => nodeConn(a, client as AnyClient, key, name) };
}

async function nodeConn(a: Omit<Adapter, "nodeConn">, c: AnyClient, key: string, name: string): Promise<Conn> {
  if (a.library === "ioredis" || a.library === "node-redis") return a.dedicated({ bound: false, noResend: true, unref: true, name });
  const slot = keySlot(key);
  for (let attempt = 0; ; attempt++) {
    if (a.library === "ioredis-cluster") {
      const nodeKey = c.slots?.[slot]?.[0];
      const node = nodeKey ? c.connectionPool?.getInstanceByKey?.(nodeKey) : null;
      if (node) {
        const d = node.duplicate({ lazyConnect: false, autoResendUnfulfilledCommands: false, connectionName: name });
        d.on("error", () => {});
        ioredisUnref(d);
        return ioredisConn(d, true);
      }
    } else {
      const master = c.getSlotMaster?.(slot);
      const node = master ? await c.nodeClient(master) : null;
      if (node) {
        const d = node.duplicate({ name });
        d.on("error", () => {});
        await d.connect();
        nodeRedisUnref(d);
        return nodeRedisConn(d, true);
      }
    }
    if (attempt >= 3) throw new Error(`no connection to the master of slot ${slot}`);
    await a.main.call(["FLOCK.CHECK", key, 1]); // lets the cluster client learn the slot's owner
  }
}

function adaptLibrary(client: unknown): Omit<Adapter, "nodeConn"> {
  if (client === null || typeof client !== "object") throw new TypeError("Flock needs an ioredis or node-redis client");
  const c = client as AnyClient;

  if (isIoredis(c) && c.isCluster === true) {
    return {
      library: "ioredis-cluster",
      main: ioredisClusterConn(c, false),
      async dedicated({ bound, noResend, unref, name }) {
        const d = name
          ? c.duplicate([], { redisOptions: { ...(c.options?.redisOptions ?? {}), autoResendUnfulfilledCommands: false, connectionName: name } })
          : bound
          ? c.duplicate([], {
              clusterRetryStrategy: () => null,
              redisOptions: { ...(c.options?.redisOptions ?? {}), retryStrategy: () => null, autoResendUnfulfilledCommands: false },
            })
          : noResend
            ? c.duplicate([], { redisOptions: { ...(c.options?.redisOptions ?? {}), autoResendUnfulfilledCommands: false } })
            : c.duplicate();
        d.on("error", () => {});
        if (unref) ioredisUnref(d);
        return ioredisClusterConn(d, true);
      },
    };
  }
  if (isIoredis(c)) {
    return {
      library: "ioredis",
      main: ioredisConn(c, false),
      async dedicated({ bound, noResend, unref, name }) {
        const d = name
          ? c.duplicate({ lazyConnect: false, autoResendUnfulfilledCommands: false, connectionName: name })
          : bound
          ? c.duplicate({ retryStrategy: () => null, autoResendUnfulfilledCommands: false, lazyConnect: false })
          : c.duplicate({ lazyConnect: false, ...(noResend ? { autoResendUnfulfilledCommands: false } : {}) });
        d.on("error", () => {});
        if (unref) ioredisUnref(d);
        return ioredisConn(d, true);
      },
    };
  }
  if (isNodeRedisCluster(c)) {
    return {
      library: "node-redis-cluster",
      main: nodeRedisClusterConn(c, false),
      async dedicated({ bound, unref, name }) {
        let d: AnyClient;
        const o = c.options ?? c._options ?? {};
        const defaults = o.defaults ?? {};
        if (bound) {
          d = c.duplicate({ defaults: { ...defaults, socket: { ...(defaults.socket ?? {}), reconnectStrategy: false } } });
        } else if (name) d = c.duplicate({ defaults: { ...defaults, name } });
        else d = c.duplicate();
        d.on("error", () => {});
        await d.connect();
        if (unref) nodeRedisUnref(d);
        return nodeRedisClusterConn(d, true);
      },
    };
  }
  if (isNodeRedis(c)) {
    return {
      library: "node-redis",
      main: nodeRedisConn(c, false),
      async dedicated({ bound, unref, name }) {
        let d: AnyClient;
        if (bound) {
          const o = c.options ?? {};
          d = c.duplicate({ socket: { ...(o.socket ?? {}), reconnectStrategy: false } });
        } else if (name) d = c.duplicate({ name });
        else d = c.duplicate();
        d.on("error", () => {});
        await d.connect();
        if (unref) nodeRedisUnref(d);
        return nodeRedisConn(d, true);
      },
    };
  }
  throw new TypeError("Flock needs an ioredis (Redis, Cluster) or node-redis (createClient, createCluster) client");
}
