"""Names in the index that code is made of (spec §6.2, §7): FX pastes node names, call targets,
attribute paths and keyword names into the Python code it generates for the rebuilt module, so
each is a name and nothing else. ``codec.targets`` applies the same two name rules before it
resolves a target (and then judges what it resolves to by its effects, §7.3).
"""

from __future__ import annotations

import re
from typing import Any

from reproarchive.errors import Rule, UnsafeArchiveError
from reproarchive.format.schema import MAX_ATTRIBUTE_PATH_LENGTH, MAX_TARGET_LENGTH

IDENTIFIER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DEVICE_RE = re.compile(r"^[a-z][a-z0-9_]*(?::[0-9]{1,4})?$")
_QUALIFIED_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*$")

#: (1.7) What text pasted into generated code as a comment may not hold: control characters but
#: the tab (``\r`` and ``\n`` end a line of Python), and the Unicode line and paragraph separators.
LINE_BREAKING = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")

HOSTILE = "the archive is hostile or damaged; refusing to build its graph"


def function_name_problem(name: object) -> str | None:
    """Why a call_function target is not a qualified name (dotted identifiers, no dunder
    segment after the first, at most 300 characters), or None."""
    if not isinstance(name, str) or len(name) > MAX_TARGET_LENGTH or not _QUALIFIED_RE.match(name):
        return "not a qualified name"
    if any(p.startswith("__") for p in name.split(".")[1:]):
        return "malformed or dunder name"
    return None


def method_name_problem(name: object) -> str | None:
    """Why a call_method target is not a method name (an identifier), or None."""
    return None if isinstance(name, str) and IDENTIFIER_RE.match(name) else "malformed method name"


def check_attribute_path(path: Any) -> str:
    """get_attr / call_module targets and module-state paths: dotted identifiers, no dunders."""
    ok = isinstance(path, str) and 0 < len(path) <= MAX_ATTRIBUTE_PATH_LENGTH and all(
        (p.isdigit() or IDENTIFIER_RE.match(p)) and not p.startswith("__") for p in path.split("."))
    if not ok:
        raise UnsafeArchiveError(f"attribute path {str(path)[:120]!r} is malformed", HOSTILE, rule=Rule.STATE_PATH)
    return path
