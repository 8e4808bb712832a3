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

function ioredisLib(name: string, Redis: any, IoCluster: any): Lib {
  return {
  name,
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
}

export const ioredis = ioredisLib("ioredis", Redis, IoCluster);
const io6 = req("ioredis6");
export const ioredis6 = ioredisLib("ioredis v6", io6.Redis ?? io6.default, io6.Cluster);

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
export const nodeRedis6 = nodeRedis("node-redis v6", "redis6");
export const libs: Record<string, Lib> = {
  ioredis, "ioredis-v6": ioredis6, "node-redis-v5": nodeRedis5, "node-redis-v4": nodeRedis4, "node-redis-v6": nodeRedis6,
};
