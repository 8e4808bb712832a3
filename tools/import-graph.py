#!/usr/bin/env python3
"""The import graph of the module crate (src/) and of flock-core, and any circle in it.

    python3 tools/import-graph.py [--files]

Nodes are the layers of src/ (its folders: ffi, server, store, waiting, peers, commands,
registration) and the modules of flock-core (one per file, `engine` with its children); with
--files, every file of src/ is a node. An edge A -> B means a file of A names B (`use
crate::B`, `crate::B::...`, or `super::B` resolved). A module's own children (tests included)
are part of it; test-only modules (`tests.rs`, `tests/`, `test_*.rs`) are left out. Exits 1
when a circle is found, printing it.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def modules_of(base, depth):
    """Map each .rs file under `base` to its module path (a tuple), cut to `depth` parts."""
    out = {}
    for dirpath, _, files in os.walk(base):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), base)
            parts = rel[:-3].split(os.sep)
            # Test code (`tests.rs`, `tests/`, `test_states.rs`: cfg(test) only) may use any
            # module; the layering is about what the product is built from.
            if any(p == "tests" or p.startswith("test_") for p in parts):
                continue
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            out[os.path.join(dirpath, f)] = tuple(parts)
    return out


def refs(text):
    """Module paths a file names through crate::."""
    found = set()
    for m in re.finditer(r"\bcrate::((?:[a-z_][a-z0-9_]*::)*[a-z_][a-z0-9_]*)", text):
        found.add(tuple(m.group(1).split("::")))
    # use crate::{a, b::c}
    for m in re.finditer(r"use crate::\{([^}]*)\}", text, re.S):
        for item in m.group(1).split(","):
            item = item.strip().split("::")[0].strip()
            if re.match(r"^[a-z_][a-z0-9_]*$", item):
                found.add((item,))
    return found


def super_refs(text, me):
    found = set()
    for m in re.finditer(r"\bsuper::((?:super::)*)((?:[a-z_][a-z0-9_]*::)*[a-z_][a-z0-9_]*)", text):
        ups = 1 + m.group(1).count("super::")
        base = me[: max(0, len(me) - ups)]
        found.add(base + tuple(m.group(2).split("::")))
    for m in re.finditer(r"use super::\{([^}]*)\}", text, re.S):
        for item in m.group(1).split(","):
            item = item.strip().split("::")[0].strip()
            if re.match(r"^[a-z_][a-z0-9_]*$", item):
                found.add(me[:-1] + (item,))
    return found


def graph(base, node_of):
    files = modules_of(base, None)
    known = set(files.values())
    edges = {}
    for path, mod in files.items():
        text = open(path, encoding="utf-8").read()
        # Drop comments (doc links name modules without importing them).
        text = re.sub(r"//[^\n]*", "", text)
        src = node_of(mod)
        targets = refs(text) | super_refs(text, mod)
        for t in targets:
            # The longest known module prefix of the path named.
            for n in range(len(t), 0, -1):
                if t[:n] in known or (t[:n] + ("mod",)) in known:
                    dst = node_of(t[:n])
                    break
            else:
                continue
            if dst != src and src is not None and dst is not None:
                edges.setdefault(src, set()).add(dst)
    return edges


def find_cycle(edges):
    color = {}
    stack = []

    def visit(n):
        color[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if color.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if color.get(m) is None:
                c = visit(m)
                if c:
                    return c
        stack.pop()
        color[n] = 2
        return None

    for n in sorted(edges):
        if color.get(n) is None:
            c = visit(n)
            if c:
                return c
    return None


def show(title, edges):
    print(f"## {title}")
    nodes = sorted(set(edges) | {d for ds in edges.values() for d in ds})
    for n in nodes:
        print(f"  {n:<28} -> {', '.join(sorted(edges.get(n, ()))) or '(nothing)'}")
    cycle = find_cycle(edges)
    print(f"  circle: {' -> '.join(cycle)}" if cycle else "  no circle")
    return cycle is None


def main():
    files = "--files" in sys.argv
    src_node = (lambda m: "/".join(m) or "lib") if files else (lambda m: m[0] if m else None)
    core_node = lambda m: m[0] if m else None
    ok = show("src/ (the module crate)" + (" by file" if files else " by folder"),
              graph(os.path.join(ROOT, "src"), src_node))
    ok &= show("crates/flock-core/src", graph(os.path.join(ROOT, "crates/flock-core/src"), core_node))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
