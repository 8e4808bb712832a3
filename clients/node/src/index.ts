import "./polyfill.js";

export { Flock, randomOwner, type AcquireOptions, type ManyOptions } from "./flock.js";
export { Lease, type LeaseKind } from "./lease.js";
export type { LockInfo, Holder, Waiter, FlockStats } from "./inspect.js";
export {
  FlockError,
  InvalidArgumentError,
  LockBusyError,
  LockLostError,
  LeaseTooShortError,
  FencedError,
  LockNotDurableError,
  type LossReason,
} from "./errors.js";
export { keySlot } from "./adapter.js";
export type { Durability } from "./durable.js";
export type { WatchEvent } from "./watcher.js";
export { Election, LeaderObserver, type Leader } from "./election.js";
