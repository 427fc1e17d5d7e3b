#!/usr/bin/env python3
"""One name for each type across the workspace.

Lists every `struct`, `enum`, `trait`, `union` and `type` defined in the
Rust files under crates/, services/ and examples/ (tests/ folders,
`#[cfg(test)]` items and tests.rs left out; drove's protobuf code is generated
into OUT_DIR, so none is read), and reports:

- a name that two public (`pub`) definitions share: exit status 1;
- a crate-private definition (no `pub`, or `pub(crate)`, `pub(super)`, ...)
  whose name a public one has: reported, exit status 1 only with --strict.

`pub type X = path::X;` (an alias under the same name, as drove-device's
`cuda::Cuda` for drove-kernels' type) is the same type re-exported, not a
second one, and is not counted; nor is an associated `type` in an `impl`.

Usage: scripts/type_names.py [--strict] [WORKSPACE]   (default: .)
"""
import re
import sys
from collections import defaultdict
from pathlib import Path

DEFINITION = re.compile(
    r"^(?P<indent>\s*)(?P<vis>pub(?:\([^)]*\))?\s+)?(?:struct|enum|trait|union|type)\s+(?P<name>[A-Z]\w*)"
    r"(?P<rest>.*)$"
)
SAME_NAME_ALIAS = re.compile(r"^\s*(?:<[^=]*>)?\s*=\s*(?:[\w:]+::)(?P<target>[A-Z]\w*)\s*(?:<.*>)?\s*;")
TEST_ITEM = re.compile(r"^\s*#\[cfg\(test\)\]")


def definitions(path: Path):
    """(name, public, line) for each definition in `path`, outside test items."""
    skip_depth = None
    depth = 0
    pending_test = False
    in_impl = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        code = line.split("//", 1)[0]
        if skip_depth is None and TEST_ITEM.match(code):
            pending_test = True
        m = DEFINITION.match(code)
        if m and skip_depth is None and not pending_test:
            vis = (m.group("vis") or "").strip()
            name = m.group("name")
            alias = SAME_NAME_ALIAS.match(m.group("rest"))
            associated = bool(in_impl) and code.lstrip().startswith("type ")
            if not associated and not (alias and alias.group("target") == name):
                yield name, vis == "pub", number
        opened, closed = code.count("{"), code.count("}")
        if pending_test and opened:
            skip_depth = depth
            pending_test = False
        elif pending_test and code.strip().endswith(";"):
            pending_test = False
        if re.match(r"^\s*(?:unsafe\s+)?impl\b", code) and opened:
            in_impl.append(depth)
        depth += opened - closed
        while in_impl and depth <= in_impl[-1]:
            in_impl.pop()
        if skip_depth is not None and depth <= skip_depth:
            skip_depth = None


def rust_files(root: Path):
    for top in ("crates", "services", "examples"):
        for path in sorted((root / top).rglob("*.rs")):
            parts = path.relative_to(root).parts
            if "tests" in parts or "target" in parts or path.name == "tests.rs":
                continue
            yield path


def main(argv):
    strict = "--strict" in argv
    args = [a for a in argv if a != "--strict"]
    root = Path(args[0] if args else ".")
    public, private = defaultdict(list), defaultdict(list)
    for path in rust_files(root):
        for name, is_public, number in definitions(path):
            where = f"{path.relative_to(root)}:{number}"
            (public if is_public else private)[name].append(where)
    shared = {n: w for n, w in public.items() if len(w) > 1}
    repeats = {n: w for n, w in private.items() if n in public}
    for name, where in sorted(shared.items()):
        print(f"public name defined {len(where)} times: {name}: {', '.join(where)}")
    for name, where in sorted(repeats.items()):
        print(f"crate-private {name} ({', '.join(where)}) repeats the public one at {', '.join(public[name])}")
    print(
        f"{sum(len(w) for w in public.values())} public type definitions, "
        f"{len(shared)} names shared, {len(repeats)} crate-private repeats"
    )
    return 1 if shared or (strict and repeats) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
