"""Unit tests of the ARCHITECTURE.md rule checker (`check_architecture.py`), on
small fake workspaces written to a temp folder: an ARCHITECTURE.md, the
members' folders, and `cargo metadata --all-features` output built here (three
members `a`, `b`, `c` and registry packages `x`, `y`, `z`): a rule broken
through a dependency's dependency is named with its path, a dev-dependency
cycle between members is named, a dev-dependency and an optional dependency
that no feature turns on are not followed, and a true doc passes.

Standard library only:  python3 -m unittest discover -s scripts -p 'test_check_architecture.py'
"""

import contextlib
import io
import json
import os
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_architecture  # noqa: E402

MEMBERS = ("a", "b", "c")


def metadata(root, deps, features=None, resolved=None):
    """`cargo metadata` output: `deps` maps a package to (dependency, kind, optional) triples;
    `features` to its feature table, `resolved` to its resolved features."""
    names = sorted(set(deps) | {d for ds in deps.values() for d, _, _ in ds})
    ident = {n: f"path+file://{root}/crates/{n}#{n}@0.1.0" if n in MEMBERS
             else f"registry+https://github.com/rust-lang/crates.io-index#{n}@1.0.0" for n in names}
    manifest = {n: f"{root}/crates/{n}/Cargo.toml" if n in MEMBERS else f"/registry/{n}-1.0.0/Cargo.toml"
                for n in names}
    features, resolved = features or {}, resolved or {}
    return {
        "workspace_root": str(root),
        "workspace_members": [ident[n] for n in names if n in MEMBERS],
        "packages": [{
            "id": ident[n], "name": n, "manifest_path": manifest[n], "features": features.get(n, {}),
            "dependencies": [{"name": d, "kind": kind, "optional": opt, "target": None, "rename": None}
                             for d, kind, opt in deps.get(n, [])],
        } for n in names],
        "resolve": {"root": None, "nodes": [{
            "id": ident[n], "features": resolved.get(n, []),
            "deps": [{"name": d, "pkg": ident[d], "dep_kinds": [{"kind": kind, "target": None}]}
                     for d, kind, _ in deps.get(n, [])],
        } for n in names]},
    }


def doc(rules, extra=""):
    """An ARCHITECTURE.md with one entry per member, `rules` its rule lines."""
    text = "# Architecture\n\n## Code map\n\n"
    for n in MEMBERS:
        text += f"### `crates/{n}`\nWhat {n} is for.\n"
        if n in rules:
            text += f"Must never depend on: {rules[n]}\n"
        text += "\n"
    return text + extra + "## Invariants\n\nMust never depend on: not a rule, outside the code map.\n"


class CheckArchitecture(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name).resolve()
        for n in MEMBERS:
            (self.root / "crates" / n).mkdir(parents=True)
            (self.root / "crates" / n / "Cargo.toml").write_text(f'[package]\nname = "{n}"\n')

    def tearDown(self):
        self.tmp.cleanup()

    def run_check(self, text, meta):
        (self.root / "ARCHITECTURE.md").write_text(text)
        (self.root / "metadata.json").write_text(json.dumps(meta))
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            status = check_architecture.main(["--metadata", str(self.root / "metadata.json"), str(self.root)])
        return status, out.getvalue().splitlines()

    def test_a_violation_is_named_with_its_path(self):
        # a -> b -> x -(build)-> y: a reaches x and, through a build-dependency, y.
        deps = {"a": [("b", None, False)], "b": [("x", None, False)], "x": [("y", "build", False)]}
        status, out = self.run_check(doc({"a": "`y`, `z`; `x` after the semicolon is prose.", "c": "`a`."}),
                                     metadata(self.root, deps | {"c": [], "z": []}))
        self.assertEqual(status, 1)
        self.assertEqual(out, ["ARCHITECTURE.md: a must never depend on y, but reaches it via a -> b -> x -> y"])

    def test_a_cycle_through_a_dev_dependency_is_named(self):
        deps = {"a": [("b", None, False)], "b": [("c", None, False)], "c": [("a", "dev", False)]}
        status, out = self.run_check(doc({}), metadata(self.root, deps))
        self.assertEqual(status, 1)
        self.assertEqual(out, ["ARCHITECTURE.md: the workspace's packages depend on each other in a cycle: "
                               "a -> b -> c -> a [dev]"])

    def test_a_true_doc_passes(self):
        # a dev-depends on x; b's optional y is named only by a weak feature (`y?/std`), which
        # turns nothing on; c's optional z is on (feature `full` = `dep:z`), and no rule names it.
        deps = {"a": [("b", None, False), ("x", "dev", False)], "b": [("y", None, True)],
                "c": [("z", None, True)], "x": [], "y": []}
        features = {"b": {"std": ["y?/std"]}, "c": {"full": ["dep:z"]}}
        resolved = {"b": ["std"], "c": ["full"]}
        status, out = self.run_check(doc({"a": "`x`, `y`, `c`", "b": "`y`.", "c": "`a`, `b`"}),
                                     metadata(self.root, deps, features, resolved))
        self.assertEqual((status, out), (0, [
            "ARCHITECTURE.md: 6 rules over 3 packages checked, and no dependency cycle among the 3 workspace packages"
        ]))
        # The same optional dependency turned on by a resolved feature is followed.
        resolved["b"].append("y")
        status, out = self.run_check(doc({"b": "`y`"}), metadata(self.root, deps, features, resolved))
        self.assertEqual(out, ["ARCHITECTURE.md: b must never depend on y, but reaches it via b -> y"])

    def test_the_doc_must_match_the_tree(self):
        gone = "### `crates/gone` and `crates/b`\nMust never depend on: `zz`\n\n"
        text = doc({"a": "`x`"}, extra=gone).replace("### `crates/c`", "### `crates/c` (`not-c`)")
        status, out = self.run_check(text, metadata(self.root, {"a": [], "b": [], "c": [], "x": []}))
        self.assertEqual(status, 1)
        self.assertEqual(sorted(out), sorted([
            "ARCHITECTURE.md:12: the heading says `not-c`, but its package is `c`",
            "ARCHITECTURE.md:15: `crates/gone` does not exist",
            "ARCHITECTURE.md:16: `zz` is no package cargo metadata knows",
            "ARCHITECTURE.md: workspace package b has 2 entries (lines [9, 15])",
        ]))
        status, out = self.run_check(doc({}).replace("### `crates/a`", "### Not a package"),
                                     metadata(self.root, {"a": [], "b": [], "c": []}))
        self.assertEqual((status, out), (1, ["ARCHITECTURE.md: workspace package a has no code-map entry"]))
        status, _ = self.run_check(doc({"a": "x, y"}), metadata(self.root, {"a": [], "b": [], "c": []}))
        self.assertEqual(status, 1)  # a rule's names must be backticked


if __name__ == "__main__":
    unittest.main()
