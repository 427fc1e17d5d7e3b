#!/usr/bin/env python3
"""File-level import cycles inside each crate of the workspace.

For each crate root (src/lib.rs, src/main.rs, src/bin/*.rs of the root package,
crates/* and services/*), builds the graph "file A uses an item defined in file
B" between the crate's files and prints its strongly connected components of
more than one file, with the names behind each edge; exit status 1 if any.
Names resolve roughly as rustc does: `mod x;` (x.rs, x/mod.rs, y.rs + y/),
inline `mod x {}`, `use` trees and `crate::`/`super::`/`self::`/child-module
paths in code. A name leads to the file that defines it; a re-export is
followed to that file, so a module root that only declares modules and
re-exports is never a target, and a `use` makes an edge only where the file's
code names what it imports. `#[cfg(test)]` items and tests.rs are left out;
method calls into an `impl` elsewhere and macro expansions are not seen.

Usage: scripts/module_cycles.py [--json] [WORKSPACE]   (default: .)
"""
import json
import re
import sys
from pathlib import Path

# Comments, raw strings, strings and char literals (lifetimes stay).
LITERALS = re.compile(
    r"//[^\n]*|/\*.*?\*/|(?<!\w)b?r(#*)\".*?\"\1|(?<!\w)b?\"(?:\\.|[^\"\\])*\""
    r"|'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^\\'\n])'",
    re.S,
)
TOKEN = re.compile(r"'[A-Za-z_]\w*|[A-Za-z_]\w*|::|\S")
IDENT = re.compile(r"[A-Za-z_]\w*$")
TEST_ATTR = re.compile(r"#\s*\[\s*cfg\s*\(\s*(?:test|all\s*\(\s*test\b[^\]]*)\)\s*\]")
ITEMS = {"struct", "enum", "union", "trait", "type", "fn", "const", "static", "macro_rules"}


def drop_tests(text):
    """`text` without the items under `#[cfg(test)]` (each up to its `;` or `}`)."""
    while m := TEST_ATTR.search(text):
        i, depth = m.end(), 0
        while i < len(text):
            c, i = text[i], i + 1
            depth += (c in "([{") - (c in ")]}")
            if depth == 0 and c in ";}":
                break
        text = text[: m.start()] + " " + text[i:]
    return text


class Module:
    """One module: where it is written, what it declares, imports and names."""

    def __init__(self, path, file):
        self.path, self.file = path, file
        self.children, self.defs = set(), set()
        self.uses, self.globs = {}, []  # local name -> path; paths of `use x::*`
        self.imports = []  # (local name or "*", path, is `pub`)
        self.chains = []  # `a::b::c` paths in code


def parse_use(toks, i, prefix, out):
    """Reads the use tree at toks[i] into `out` as (local name or '*', path); the next index."""
    path = list(prefix)
    while i < len(toks):
        t = toks[i]
        if t == "{":
            i += 1
            while toks[i] != "}":
                i = parse_use(toks, i, path, out)
                i += toks[i] == ","
            return i + 1
        if t == "*" or (t == "self" and path):
            out.append(("*" if t == "*" else path[-1], path))
            return i + 1
        path.append(t)
        i += 1
        if i < len(toks) and toks[i] == "::":
            i += 1
        elif i < len(toks) and toks[i] == "as":
            out.append((toks[i + 1], path))
            return i + 2
        else:
            out.append((t, path))
            return i
    return i


def parse_file(file, modpath, modules, idents):
    """Reads `file` as module `modpath`; returns the (parent, name) of its `mod x;` lines."""
    text = drop_tests(LITERALS.sub(" ", file.read_text(encoding="utf-8")))
    toks = TOKEN.findall(text)
    stack, depth, declared, i = [(modules.setdefault(modpath, Module(modpath, file)), 0)], 0, [], 0
    while i < len(toks):
        t, mod, top = toks[i], stack[-1][0], depth == stack[-1][1]
        nxt, prev = toks[i + 1] if i + 1 < len(toks) else "", toks[i - 1] if i else ""
        if t in "{}":
            depth += 1 if t == "{" else -1
            if len(stack) > 1 and depth < stack[-1][1]:
                stack.pop()
        elif t == "use" and nxt != "<" and prev != "::":  # not `impl Trait + use<'a>`
            public = prev == "pub" or (prev == ")" and "pub" in toks[max(0, i - 6) : i])
            out = []
            i = parse_use(toks, i + 1, [], out)
            mod.imports += [(name, path, public) for name, path in out]
            mod.globs += [path for name, path in out if name == "*"]
            mod.uses.update((name, path) for name, path in out if name != "*")
            continue
        elif t == "mod" and top and IDENT.match(nxt) and i + 2 < len(toks):
            mod.children.add(nxt)
            if toks[i + 2] == "{":
                inner = mod.path + (nxt,)
                stack.append((modules.setdefault(inner, Module(inner, file)), depth + 1))
                depth += 1
            else:
                declared.append((mod.path, nxt))
            i += 3
            continue
        elif top and t in ITEMS:
            name = toks[i + 2] if nxt == "!" and i + 2 < len(toks) else nxt
            if IDENT.match(name) and name != "fn":  # `const fn f` is found at `fn`
                mod.defs.add(name)
        elif IDENT.match(t) and nxt == "::" and prev != "::":
            chain = [t]
            while i + 2 < len(toks) and toks[i + 1] == "::" and IDENT.match(toks[i + 2]):
                chain.append(toks[i + 2])
                i += 2
            mod.chains.append(chain)
            idents.update(chain)
        if IDENT.match(t):
            idents.add(t)
        i += 1
    return declared


class Crate:
    """The modules of one crate root, and the edges between their files."""

    def __init__(self, root):
        self.modules, self.idents = {}, {}  # idents: file -> names its code uses
        todo = [(root, ())]
        while todo:
            file, path = todo.pop()
            self.idents[file] = set()
            for parent, name in parse_file(file, path, self.modules, self.idents[file]):
                flat = file == root or file.name == "mod.rs"
                base = file.parent if flat else file.with_suffix("")
                for found in (base / f"{name}.rs", base / name / "mod.rs"):
                    if found.exists() and found.name != "tests.rs":
                        todo.append((found, parent + (name,)))
                        break

    @staticmethod
    def absolute(context, raw):
        """The path from the crate root of `raw`, written in module `context`."""
        if raw and raw[0] == "crate":
            return list(raw[1:])
        base, raw = list(context), list(raw[1:] if raw and raw[0] == "self" else raw)
        while raw and raw[0] == "super":
            base, raw = base[:-1], raw[1:]
        return base + raw

    def lookup(self, path, name, seen):
        """`name` in module `path`: ('mod', path), ('file', file), or None (not this crate's)."""
        mod = self.modules.get(tuple(path))
        key = (tuple(path), name)
        if mod is None or key in seen:
            return None
        if name in mod.children or name in mod.defs:
            return ("mod", tuple(path) + (name,)) if name in mod.children else ("file", mod.file)
        if name in mod.uses:
            return self.resolve(self.absolute(path, mod.uses[name]), seen | {key})
        for glob in mod.globs:  # only a module's glob brings in its names
            target = self.resolve(self.absolute(path, glob), seen | {key})
            if target and target[0] == "mod" and (r := self.lookup(target[1], name, seen | {key})):
                return r
        return None

    def resolve(self, segments, seen=frozenset()):
        """The module or file a path from the root leads to (an item ends it: `Enum::Variant`)."""
        path = ()
        for seg in segments:
            r = self.lookup(path, seg, seen)
            if r is None or r[0] == "file":
                return r
            path = r[1]
        return ("mod", path)

    def edges(self):
        """{(from file, to file): the names behind the edge}."""
        out = {}

        def add(src, target, name):
            if target and target[0] == "mod":  # a whole module (a glob): its file, if it defines
                mod = self.modules[target[1]]
                target = ("file", mod.file) if mod.defs else None
            if target and target[1] != src:
                out.setdefault((src, target[1]), set()).add(name)

        for mod in self.modules.values():
            for name, raw, public in mod.imports:
                target = self.resolve(self.absolute(mod.path, raw))
                if name == "*" and not public:
                    add(mod.file, target, "*")
                elif name in self.idents[mod.file] and target and target[0] == "file":
                    add(mod.file, target, name)
            for chain in mod.chains:
                if chain[0] in ("crate", "self", "super") or chain[0] in mod.children | mod.uses.keys():
                    add(mod.file, self.resolve(self.absolute(mod.path, chain)), "::".join(chain))
        return out


def components(nodes, edges):
    """The strongly connected components of more than one node (by reachability: small graphs)."""
    succ = {n: {b for (a, b) in edges if a == n} for n in nodes}

    reaches = {}
    for n in nodes:
        seen, todo = {n}, [n]
        while todo:
            new = succ[todo.pop()] - seen
            seen |= new
            todo += new
        reaches[n] = seen
    sccs = {frozenset(m for m in reaches[n] if n in reaches[m]) for n in nodes}
    return sorted(sorted(s) for s in sccs if len(s) > 1)


def crate_roots(workspace):
    """(package name, crate root file) for every package of the workspace."""
    for pkg in [workspace, *sorted(workspace.glob("crates/*")), *sorted(workspace.glob("services/*"))]:
        src, manifest = pkg / "src", pkg / "Cargo.toml"
        if not manifest.exists() or not src.is_dir():
            continue
        name = re.search(r'^name\s*=\s*"([^"]+)"', manifest.read_text(), re.M).group(1)
        bins = sorted(src.glob("bin/*.rs")) + sorted(src.glob("bin/*/main.rs"))
        for root in [src / "lib.rs", src / "main.rs", *bins]:
            if root.exists():
                yield name, root


def cycles(workspace):
    """Every cycle of the workspace, as dicts (crate, root, files, edges)."""
    report = []
    for name, root in crate_roots(workspace):
        crate = Crate(root)
        edges = crate.edges()
        rel = lambda f: str(f.relative_to(workspace))  # noqa: E731
        for scc in components(set(crate.idents), edges):
            inside = sorted(e for e in edges if e[0] in scc and e[1] in scc)
            report.append({
                "crate": name, "root": rel(root), "files": [rel(f) for f in scc],
                "edges": [{"from": rel(a), "to": rel(b), "names": sorted(edges[(a, b)])} for a, b in inside],
            })
    return report


def main(argv):
    args = [a for a in argv if a != "--json"]
    report = cycles(Path(args[0] if args else ".").resolve())
    if "--json" in argv:
        print(json.dumps({"cycles": report}, indent=2))
        return 1 if report else 0
    for cycle in report:
        print(f"{cycle['crate']} ({cycle['root']}): {len(cycle['files'])} files in a cycle")
        for e in cycle["edges"]:
            print(f"  {e['from']} -> {e['to']}: {', '.join(e['names'])}")
    if not report:
        print("no file cycles")
    return 1 if report else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
