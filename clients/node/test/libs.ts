// The client libraries under test, behind one small interface.
import Redis, { Cluster as IoCluster } from "ioredis";
import { createRequire } from "node:module";

const req = createRequire(__filename);

export interface Lib {
  name: string;
  /** A connected client on one node (named `name` on the server, for CLIENT LIST). */
  client(port: number, name?: string): Promise<any>;
  /** A connected cluster client given one node. */
  cluster(port: number): Promise<any>;
  /** One raw command on that client. */
  raw(client: any, args: Array<string | number>): Promise<any>;
  close(client: any): Promise<void>;
}

export const ioredis: Lib = {
  name: "ioredis",
  async client(port, name) {
    const c = new Redis({ port, host: "127.0.0.1", ...(name ? { connectionName: name } : {}) });
    c.on("error", () => {});
    await c.ping();
    return c;
  },
  async cluster(port) {
    const c = new IoCluster([{ host: "127.0.0.1", port }]);
    c.on("error", () => {});
    await c.ping();
    return c;
  },
  raw: (c, args) => c.call(...(args as [string, ...Array<string | number>])),
  async close(c) {
    c.disconnect();
  },
};

function nodeRedis(name: string, pkg: string): Lib {
  const { createClient, createCluster } = req(pkg);
  return {
    name,
    async client(port, name) {
      const c = createClient({ socket: { port, host: "127.0.0.1" }, ...(name ? { name } : {}) });
      c.on("error", () => {});
      await c.connect();
      return c;
    },
    async cluster(port) {
      const c = createCluster({ rootNodes: [{ socket: { port, host: "127.0.0.1" } }] });
      c.on("error", () => {});
      await c.connect();
      return c;
    },
    raw: (c, args) => c.sendCommand(args.map(String)),
    async close(c) {
      try {
        if (typeof c.destroy === "function") c.destroy();
        else await c.disconnect();
      } catch {
        /* closed */
      }
    },
  };
}

export const nodeRedis5 = nodeRedis("node-redis v5", "redis");
export const nodeRedis4 = nodeRedis("node-redis v4", "redis4");
export const libs: Record<string, Lib> = { ioredis, "node-redis-v5": nodeRedis5, "node-redis-v4": nodeRedis4 };
