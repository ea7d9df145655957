"""One place to check and regenerate spec/ after a format change.

A version bump, a new record or a changed report must be followed by every file spec/ derives
from the code; with one command per generator it was easy to run five of six and ship a spec
that says something the code does not. The golden vectors stay frozen (spec/FORMAT.md §10): an
existing one is never rewritten. The vector generators are scripts of the checkout (spec/ is not
in the wheel), so this runs from a source checkout only.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import types
from pathlib import Path

from reproarchive.format import schema_cddl, schema_check

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "spec"
WRITE = "python -m reproarchive.spec_files --write"


def _script(name: str) -> types.ModuleType:
    """A generator of spec/vectors, imported by the name the tests import it by (its custom op is
    registered once per process), without writing bytecode into the tree."""
    full = f"spec.vectors.{name}"
    if full not in sys.modules:
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        before, sys.dont_write_bytecode = sys.dont_write_bytecode, True
        try:
            importlib.import_module(full)
        finally:
            sys.dont_write_bytecode = before
    return sys.modules[full]


def generators() -> list[types.ModuleType]:
    """Every generator of spec/, each with ``check(spec_dir) -> list[str]`` (one line per stale
    file, naming it) and ``write(spec_dir) -> list[Path]`` (the files it changed), in the order
    ``--write`` runs them: the invalid vectors and the example are made from golden vectors."""
    from reproarchive import documents

    return [schema_check, schema_cddl, documents,
            *(_script(name) for name in ("make_vectors", "make_invalid", "make_example"))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reproarchive.spec_files", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true",
                      help="exit 1 naming each generated file that is not what its generator makes now")
    mode.add_argument("--write", action="store_true", help="regenerate every generated file that is not")
    parser.add_argument("--spec", type=Path, default=SPEC, metavar="DIR",
                        help="the spec folder to check or write (default: the checkout's)")
    opts = parser.parse_args(argv)
    if not (SPEC / "vectors" / "make_vectors.py").is_file():
        print("python -m reproarchive.spec_files must run from a source checkout: "
              "spec/ and its generators are not installed with the package", file=sys.stderr)
        return 2
    spec = opts.spec.resolve()
    found = generators()
    for fname, why in _script("make_vectors").not_rebuilt(spec).items():
        print(f"note: {fname} not built here: {why}")
    if opts.write:
        bump = schema_check.pending_bump(spec)
        if bump is not None:
            print(f"nothing written: {bump}", file=sys.stderr)
            return 1
        written = [path for generator in found for path in generator.write(spec)]
        for path in written:
            print(f"{'wrote' if path.exists() else 'removed'} {path}")
        print(f"{len(written)} file(s) written" if written else "every generated file was current")
        return 0
    stale = [line for generator in found for line in generator.check(spec)]
    for line in stale:
        print(f"stale: {line}")
    if not stale:
        print("every generated file is current")
        return 0
    first = "" if schema_check.pending_bump(spec) is None else "bump FORMAT_VERSION (spec/FORMAT.md §10), then "
    print(f"{len(stale)} stale file(s): {first}run `{WRITE}`")
    return 1


if __name__ == "__main__":
    sys.exit(main())
