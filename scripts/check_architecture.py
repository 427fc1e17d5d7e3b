#!/usr/bin/env python3
"""ARCHITECTURE.md's "Must never depend on" rules, checked against `cargo metadata`.

Each `### ` heading of the doc's "## Code map" names paths in backticks
(`crates/drove-seed`, `services/coordinator`, `Cargo.toml`, `bench/`,
`crates/*/tests/`); every path must exist (a glob: match something), and a
path that is a package's folder or its `Cargo.toml` makes the entry that
package's (any other backticked word of the heading must be that package's
name). An entry may hold one line

    Must never depend on: `drove-comm`, `tokio`; prose, unchecked...

whose backticked names, comma-separated up to the first `;` or `.`, are Cargo
packages, of the workspace or not. Exit status 1, each problem named, if:

- a package reaches a name of its rule, through normal or build dependencies at
  any depth (printed with the path that reaches it);
- the workspace's packages depend on each other in a cycle, dev-dependencies
  included (printed as the cycle);
- a heading names a path that is gone, a rule stands in an entry that is no
  package, a rule names a package that no metadata read here knows (a typo
  would make a rule that always holds), or a workspace member has no entry.

What "reaches" means: the graph is the resolve of `cargo metadata --locked
--all-features`, so a rule must hold with every feature of every workspace
member on. That resolve unifies features across the workspace: a package's
resolved features are the union of what every member (with all its features,
its dev-dependencies' included) and every platform asks of it. If drove-a turns
on a feature of `foo` that pulls in `bar`, drove-b, which uses `foo` without
it, is seen to reach `bar` too. The check is therefore conservative: it may
report a path that `cargo tree -p drove-b` alone would not show, never passes
one that a real build of drove-b, with any features on any platform, has.
Worse than unification: the resolve is the lock file's, which also holds a
registry package's optional dependencies that only a weak feature (`dep?/feat`)
names (burn lists burn-candle, burn-train, ...), with the features they ask of
others. The checker follows an optional dependency's edge only where one of the
package's resolved features turns it on (`dep:name`, `name/feat`, the implicit
feature `name`), which drops those packages; the features they asked for stay
(burn-train asks burn-core for `dataset`, so drove-bert is seen to reach
rusqlite through burn-dataset, which `cargo tree -p drove-bert` does not show).
A rule can only name what is not reached even so. Dev-dependencies are followed
by the cycle check only: a test's dependency is not the crate's, and a
dependency's are never built. A build-dependency counts (the crate cannot be
built without it).

A folder with a `Cargo.toml` of another workspace (python/, excluded from the
root one) is read with `cargo metadata --manifest-path FOLDER/Cargo.toml`.

Usage: scripts/check_architecture.py [--metadata FILE]... [ROOT]   (default ROOT: the repository)
  --metadata FILE  read `cargo metadata --format-version 1 --all-features`'s output from
                   FILE instead of running cargo; one per workspace the rules need, the
                   first the root's (ROOT defaults to its workspace_root)
"""
import json
import re
import subprocess
import sys
from collections import deque
from pathlib import Path

DOC = "ARCHITECTURE.md"
RULE = "Must never depend on:"
NAME = re.compile(r"[A-Za-z0-9_-]+$")


class Problem(Exception):
    """The doc cannot be read as the checker needs it."""


class Graph:
    """One workspace's packages and their resolved edges, from its metadata."""

    def __init__(self, meta):
        self.root = Path(meta["workspace_root"]).resolve()
        self.packages = {p["id"]: p for p in meta["packages"]}
        self.members = list(meta["workspace_members"])
        self.by_manifest = {Path(p["manifest_path"]).resolve(): i for i, p in self.packages.items()}
        self.names = {p["name"] for p in self.packages.values()}
        self.nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}

    def name(self, pid):
        return self.packages[pid]["name"]

    def turned_on(self, pid, dep, kind, target):
        """Whether `pid`'s resolved features turn on its dependency `dep` of this kind and platform."""
        pkg, features = self.packages[pid], set(self.nodes[pid]["features"])
        decls = [d for d in pkg["dependencies"] if d["name"] == self.name(dep) and d["kind"] == kind]
        decls = [d for d in decls if d.get("target") == target] or decls
        if not decls:
            return True  # nothing to judge by: follow it (conservative)
        for d in decls:
            key = d.get("rename") or d["name"]
            if not d["optional"] or key in features:
                return True
            if any(v == f"dep:{key}" or v.startswith(f"{key}/")
                   for f in features for v in pkg["features"].get(f, [])):
                return True
        return False

    def edges(self, pid, kinds):
        """[(dependency id, its kinds among `kinds`)] of `pid`'s turned-on dependencies."""
        out = []
        for dep in self.nodes[pid]["deps"]:
            on = sorted({k["kind"] or "normal" for k in dep["dep_kinds"]
                         if k["kind"] in kinds and self.turned_on(pid, dep["pkg"], k["kind"], k["target"])})
            if on:
                out.append((dep["pkg"], on))
        return out

    def reached(self, pid):
        """{package id: the id it was first reached from} over normal and build edges (breadth first)."""
        parent, todo = {pid: None}, deque([pid])
        while todo:
            here = todo.popleft()
            for dep, _ in self.edges(here, (None, "build")):
                if dep not in parent:
                    parent[dep] = here
                    todo.append(dep)
        return parent

    def path(self, parent, pid):
        hops = []
        while pid is not None:
            hops.append(self.name(pid))
            pid = parent[pid]
        return " -> ".join(reversed(hops))

    def cycles(self):
        """One cycle (as text) per strongly connected set of workspace members, dev-dependencies included."""
        members = set(self.members)
        succ = {m: {d: kinds for d, kinds in self.edges(m, (None, "build", "dev")) if d in members}
                for m in members}
        reaches = {}
        for m in members:
            seen, todo = {m}, [m]
            while todo:
                new = set(succ[todo.pop()]) - seen
                seen |= new
                todo += new
            reaches[m] = seen
        found = []
        for scc in {frozenset(o for o in reaches[m] if m in reaches[o]) for m in members}:
            if len(scc) < 2:
                continue
            start = min(scc, key=self.name)
            parent, todo = {start: None}, deque([start])
            while todo:  # the shortest way back to `start` inside the set
                here = todo.popleft()
                if start in succ[here]:
                    break
                for dep in succ[here]:
                    if dep in scc and dep not in parent:
                        parent[dep] = here
                        todo.append(dep)
            hops, node = [], here
            while node is not None:
                hops.append(node)
                node = parent[node]
            hops.reverse()
            text = self.name(start)
            for a, b in zip(hops, hops[1:] + [start]):
                kinds = succ[a][b]
                text += f" -> {self.name(b)}" + ("" if "normal" in kinds or "build" in kinds else " [dev]")
            found.append(text)
        return sorted(found)


class Entry:
    """One code-map entry: its heading, the paths and words it names, its rule."""

    def __init__(self, line, heading):
        self.line, self.heading = line, heading
        ticks = re.findall(r"`([^`]+)`", heading)
        self.paths = [t for t in ticks if "/" in t or t.endswith("Cargo.toml")]
        self.words = [t for t in ticks if t not in self.paths]
        self.rule = None  # (line, [names])

    def add_rule(self, line, text):
        if self.rule is not None:
            raise Problem(f"{DOC}:{line}: a second '{RULE}' line in the entry of line {self.line}")
        self.rule = (line, parse_rule(line, text))


def parse_rule(line, text):
    """The package names of a rule's list: backticked, comma-separated, up to `;`, `.` or the line's end."""
    names, rest = [], text
    while True:
        m = re.match(r"\s*`([^`]+)`\s*(,|;|\.|$)", rest)
        if not m or not NAME.match(m.group(1)):
            raise Problem(f"{DOC}:{line}: '{RULE}' must be followed by `package`, `package`, ... "
                          f"(then `;` or `.` before any prose): {text.strip()!r}")
        names.append(m.group(1))
        rest = rest[m.end():]
        if m.group(2) != ",":
            return names


def code_map(text):
    """The entries of the doc's "## Code map" section."""
    entries, inside, fenced = [], False, False
    for number, raw in enumerate(text.splitlines(), 1):
        if raw.startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        if raw.startswith("## "):
            inside = raw.strip() == "## Code map"
        elif inside and raw.startswith("### "):
            entries.append(Entry(number, raw[4:].strip()))
        elif inside and raw.startswith(RULE):
            if not entries:
                raise Problem(f"{DOC}:{number}: a rule before the first entry")
            entries[-1].add_rule(number, raw[len(RULE):])
    if not entries:
        raise Problem(f"{DOC}: no '## Code map' section with '### ' entries")
    return entries


def cargo_metadata(cwd, manifest=None):
    cmd = ["cargo", "metadata", "--format-version", "1", "--locked", "--all-features"]
    if manifest:
        cmd += ["--manifest-path", str(manifest)]
    run = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if run.returncode != 0:
        raise Problem(f"{' '.join(cmd)} failed:\n{run.stderr.strip()}")
    return json.loads(run.stdout)


def check(root, graphs, load=None):
    """Every problem, as lines, and the summary; `graphs[0]` is the root workspace's."""
    problems, rules, owners, named, checked = [], 0, {}, [], 0
    entries = code_map((root / DOC).read_text(encoding="utf-8"))
    for entry in entries:
        where = f"{DOC}:{entry.line}"
        owned, unread = [], False  # (graph, package id); a package no metadata read here holds
        for path in entry.paths:
            full = root / path.rstrip("/")
            if any(c in path for c in "*?["):
                if not list(root.glob(path.rstrip("/"))):
                    problems.append(f"{where}: `{path}` matches nothing")
                continue
            if not full.exists():
                problems.append(f"{where}: `{path}` does not exist")
                continue
            manifest = full if full.name == "Cargo.toml" else full / "Cargo.toml"
            if not manifest.is_file():
                continue
            manifest = manifest.resolve()
            graph = next((g for g in graphs if manifest in g.by_manifest), None)
            if graph is None and entry.rule and load:
                graphs.append(graph := Graph(load(manifest)))
            if graph is None:
                if entry.rule:
                    problems.append(f"{where}: no metadata holds {manifest} (pass --metadata)")
                    unread = True
                continue
            owned.append((graph, graph.by_manifest[manifest]))
        if len({pid for _, pid in owned}) > 1:
            problems.append(f"{where}: names {len(owned)} packages; an entry is one package or none")
            continue
        for word in entry.words:
            if owned and word != owned[0][0].name(owned[0][1]):
                problems.append(f"{where}: the heading says `{word}`, but its package is "
                                f"`{owned[0][0].name(owned[0][1])}`")
        if owned:
            owners.setdefault(owned[0][1], []).append(entry.line)
        if entry.rule is None or unread:
            continue
        line, names = entry.rule
        if not owned:
            problems.append(f"{DOC}:{line}: a rule in an entry that names no package (`### {entry.heading}`)")
            continue
        graph, pid = owned[0]
        me = graph.name(pid)
        named += [(line, name) for name in names]
        parent = graph.reached(pid)
        for name in names:
            rules += 1
            hit = next((p for p in parent if graph.name(p) == name and p != pid), None)
            if hit is not None:
                via = graph.path(parent, hit)
                problems.append(f"{DOC}: {me} must never depend on {name}, but reaches it via {via}")
        checked += 1
    known = set().union(*(g.names for g in graphs))
    problems += [f"{DOC}:{line}: `{name}` is no package cargo metadata knows" for line, name in named
                 if name not in known]
    for pid in graphs[0].members:
        lines = owners.get(pid, [])
        name = graphs[0].name(pid)
        if not lines:
            problems.append(f"{DOC}: workspace package {name} has no code-map entry")
        elif len(lines) > 1:
            problems.append(f"{DOC}: workspace package {name} has {len(lines)} entries (lines {lines})")
    for cycle in graphs[0].cycles():
        problems.append(f"{DOC}: the workspace's packages depend on each other in a cycle: {cycle}")
    summary = (f"{DOC}: {rules} rules over {checked} packages checked, and no dependency cycle "
               f"among the {len(graphs[0].members)} workspace packages")
    return problems, summary


def main(argv):
    files, args = [], []
    it = iter(argv)
    for a in it:
        if a == "--metadata":
            files.append(next(it, None))
        elif a.startswith("--metadata="):
            files.append(a.split("=", 1)[1])
        else:
            args.append(a)
    if None in files or len(args) > 1 or any(a.startswith("-") for a in args):
        print(next(line for line in __doc__.splitlines() if line.startswith("Usage:")), file=sys.stderr)
        return 2
    try:
        graphs = [Graph(json.loads(Path(f).read_text())) for f in files]
        root = Path(args[0]) if args else graphs[0].root if graphs else Path(__file__).resolve().parent.parent
        root = root.resolve()
        load = None if files else (lambda manifest: cargo_metadata(root, manifest))
        if not graphs:
            graphs = [Graph(cargo_metadata(root))]
        problems, summary = check(root, graphs, load)
    except Problem as e:
        print(e, file=sys.stderr)
        return 1
    for p in problems:
        print(p)
    if problems:
        print(f"{DOC}: {len(problems)} problem{'' if len(problems) == 1 else 's'}", file=sys.stderr)
        return 1
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
