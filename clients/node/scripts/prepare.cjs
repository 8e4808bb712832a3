#!/usr/bin/env node
// `prepare`: compiles src/ to dist/ (JS + .d.ts). When this folder is installed by path from
// another project (`npm install ./clients/node`) its devDependencies are not installed, so the
// compiler is fetched first, from the npm registry, exactly as package-lock.json pins it.
"use strict";
const { execFileSync, execSync } = require("node:child_process");
const { join } = require("node:path");

const root = join(__dirname, "..");
function tscPath() {
  try {
    return require.resolve("typescript/bin/tsc", { paths: [root] });
  } catch {
    return null;
  }
}
let tsc = tscPath();
if (!tsc) {
  console.error("redis-flock: installing the TypeScript compiler to build dist/ (npm ci --ignore-scripts)");
  execSync("npm ci --ignore-scripts --no-audit --no-fund", { cwd: root, stdio: "inherit" });
  tsc = tscPath();
  if (!tsc) throw new Error("redis-flock: typescript is still missing after npm ci");
}
execFileSync(process.execPath, [tsc, "-p", "tsconfig.json"], { cwd: root, stdio: "inherit" });
