// Node 20.x before 20.4 lacks Symbol.asyncDispose (explicit resource management); TypeScript's
// `await using` and the Lease class look it up at run time, so give them the registered symbol
// that Node itself uses.
const S = Symbol as { asyncDispose?: symbol; dispose?: symbol };
if (typeof S.asyncDispose !== "symbol") {
  Object.defineProperty(Symbol, "asyncDispose", { value: Symbol.for("nodejs.asyncDispose") });
}
if (typeof S.dispose !== "symbol") {
  Object.defineProperty(Symbol, "dispose", { value: Symbol.for("nodejs.dispose") });
}
export {};
