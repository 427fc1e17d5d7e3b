"""Unit tests of the one-name-a-type check (`type_names.py`), on a fake
workspace written to a temp folder: two crates that define the same public
name, an alias that re-exports a type under its own name, a crate-private
repeat, and definitions the check must not count (a test module, a tests/
folder, an associated type).

Standard library only:  python3 -m unittest discover -s scripts -p 'test_type_names.py'
"""

import contextlib
import io
import os
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import type_names  # noqa: E402

FILES = {
    "crates/one/src/lib.rs": """
        /// Public here.
        pub struct Shared;
        /// The same type as two's, re-exported under its name.
        pub type Backend = two::Backend;
        /// Private, and a public name elsewhere.
        pub(crate) enum Quiet { A }
        impl Iterator for Shared {
            type Item = u8;
            fn next(&mut self) -> Option<u8> { None }
        }
        #[cfg(test)]
        mod tests {
            pub struct Only;
        }
    """,
    "crates/two/src/lib.rs": """
        /// Public here too.
        pub struct Shared;
        /// A backend.
        pub struct Backend;
        /// Public.
        pub struct Quiet;
        /// Counted once, by the test module of one.
        pub struct Only;
        /// Also an associated name of one's impl, which is not a type of its own.
        pub struct Item;
    """,
    "crates/two/tests/it.rs": """
        pub struct Shared;
    """,
}


def run(root, *flags):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = type_names.main([*flags, str(root)])
    return code, out.getvalue()


class TypeNames(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.root = Path(self.dir.name)
        for rel, text in FILES.items():
            path = self.root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text))

    def tearDown(self):
        self.dir.cleanup()

    def test_a_public_name_defined_twice_fails(self):
        code, out = run(self.root)
        self.assertEqual(code, 1)
        self.assertIn("public name defined 2 times: Shared: crates/one/src/lib.rs:3, crates/two/src/lib.rs:3", out)

    def test_aliases_test_items_and_associated_types_are_not_definitions(self):
        _, out = run(self.root)
        shared = [line for line in out.splitlines() if line.startswith("public name defined")]
        self.assertEqual(len(shared), 1, out)
        for name in ("Backend", "Only", "Item"):
            self.assertNotIn(name, out, name)
        self.assertEqual(out.splitlines()[-1], "6 public type definitions, 1 names shared, 1 crate-private repeats")

    def test_a_private_repeat_is_reported_and_fails_only_when_strict(self):
        (self.root / "crates/two/src/lib.rs").write_text("pub struct Quiet;\n")
        (self.root / "crates/one/src/lib.rs").write_text("pub(crate) enum Quiet { A }\n")
        code, out = run(self.root)
        self.assertEqual(code, 0)
        self.assertIn("crate-private Quiet (crates/one/src/lib.rs:1) repeats the public one at crates/two/src/lib.rs:1", out)
        self.assertEqual(run(self.root, "--strict")[0], 1)


if __name__ == "__main__":
    unittest.main()
