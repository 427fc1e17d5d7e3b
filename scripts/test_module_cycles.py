"""Unit tests of the file-level import-cycle checker (`module_cycles.py`), on a
fake workspace written to a temp folder: one crate whose files `a.rs` and
`b.rs` use each other, around an acyclic rest (a lib.rs and a mod.rs that only
declare and re-export, an `x.rs` + `x/` module, an inline module, a glob, a
test module and a tests.rs that would close cycles if they were counted), and
one crate with no cycle at all.

Standard library only:  python3 -m unittest discover -s scripts -p 'test_module_cycles.py'
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
import module_cycles  # noqa: E402

CYCLIC = {
    "src/lib.rs": """
        //! Declares and re-exports only: `crate::A` elsewhere leads to a.rs.
        pub mod a;
        mod b;
        mod c;
        mod layers;
        pub use a::A;
        pub use b::B;
        pub use c::{D, E};
        #[cfg(test)]
        mod tests;
    """,
    # The cycle: a.rs -> b.rs (a `use` in braces) and b.rs -> a.rs (a path in code, through the re-export).
    "src/a.rs": """
        use crate::{b::{self, B}, layers::Low};
        /// An item.
        pub struct A(pub B, pub Low);
        pub fn make() -> A { A(b::make_b(), Low) }
        #[cfg(test)]
        mod tests {
            use crate::c::D; // test code: no edge
            fn t() -> D { D }
        }
    """,
    "src/b.rs": """
        /// "use crate::c::D;" in a string, and in a comment: use crate::c::D;
        pub struct B;
        pub fn make_b() -> B { let _ = crate::A::size(); B }
        impl crate::A { pub fn size() -> usize { 1 } }
    """,
    # mod.rs that only declares and re-exports: d.rs -> e.rs passes through it, no cycle.
    "src/c/mod.rs": "mod d;\nmod e;\npub use d::D;\npub use e::E;\n",
    "src/c/d.rs": "use super::E;\npub struct D;\npub fn e() -> E { E::new() }\n",
    "src/c/e.rs": "use crate::layers::*;\npub struct E(Low);\nimpl E { pub fn new() -> E { E(Low) } }\n",
    # x.rs + x/ layout, an inline module and a glob of an enum: all acyclic.
    "src/layers.rs": """
        mod deep;
        pub use deep::Low;
        pub mod inline {
            pub enum Kind { One, Two }
        }
        fn kinds() { use inline::Kind::*; let _ = [One, Two]; }
    """,
    "src/layers/deep.rs": "pub struct Low;\n",
    # Test-only file: using a.rs here must not count.
    "src/tests.rs": "use crate::c::D;\nuse crate::a::make;\n",
}

ACYCLIC = {
    "src/lib.rs": "mod top;\nmod bottom;\npub use top::run;\n",
    "src/top.rs": "use crate::bottom::Base;\npub fn run() -> Base { Base }\n",
    "src/bottom.rs": "pub struct Base;\n#[cfg(test)]\nmod tests { use crate::top::run; }\n",
}


def write(root, package, files, name=None):
    folder = root / package
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Cargo.toml").write_text(f'[package]\nname = "{name or folder.name}"\n')
    for path, text in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)


def run(root, *flags):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = module_cycles.main([*flags, str(root)])
    return status, out.getvalue()


class ModuleCycles(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name).resolve()

    def tearDown(self):
        self.tmp.cleanup()

    def test_finds_exactly_the_cycle(self):
        write(self.root, "crates/cyclic", CYCLIC)
        write(self.root, "crates/acyclic", ACYCLIC)
        status, out = run(self.root, "--json")
        self.assertEqual(status, 1)
        cycles = json.loads(out)["cycles"]
        self.assertEqual(len(cycles), 1, out)
        self.assertEqual(cycles[0]["crate"], "cyclic")
        self.assertEqual(cycles[0]["files"], ["crates/cyclic/src/a.rs", "crates/cyclic/src/b.rs"])
        edges = {(e["from"].split("/")[-1], e["to"].split("/")[-1]): e["names"] for e in cycles[0]["edges"]}
        self.assertEqual(set(edges), {("a.rs", "b.rs"), ("b.rs", "a.rs")})
        self.assertIn("B", edges[("a.rs", "b.rs")])
        self.assertIn("crate::A::size", edges[("b.rs", "a.rs")])

    def test_acyclic_edges_are_seen_but_make_no_cycle(self):
        write(self.root, "crates/cyclic", CYCLIC)
        crate = module_cycles.Crate(self.root / "crates/cyclic/src/lib.rs")
        edges = {(a.relative_to(self.root / "crates/cyclic/src").as_posix(),
                  b.relative_to(self.root / "crates/cyclic/src").as_posix()) for a, b in crate.edges()}
        self.assertEqual(edges, {
            ("a.rs", "b.rs"), ("b.rs", "a.rs"), ("a.rs", "layers/deep.rs"),
            ("c/d.rs", "c/e.rs"), ("c/e.rs", "layers.rs"),
        })
        self.assertNotIn(self.root / "crates/cyclic/src/tests.rs", crate.idents)

    def test_no_cycle_exits_zero(self):
        write(self.root, "crates/acyclic", ACYCLIC)
        write(self.root, ".", {"src/lib.rs": "pub fn f() {}\n"}, name="facade")
        self.assertEqual(run(self.root), (0, "no file cycles\n"))
        self.assertEqual(run(self.root, "--json"), (0, json.dumps({"cycles": []}, indent=2) + "\n"))


if __name__ == "__main__":
    unittest.main()
