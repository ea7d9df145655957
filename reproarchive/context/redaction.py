"""Replacing the recording machine's paths (home, cwd, dump folders, its Python, caches and
temporary folder) and its user name in recorded text, the same way for every capture path.

``redacted`` is the one pass the one capture writer (``archive.writing.write_capture``, which
every capture source writes through) runs over the records it is about to store: failure
message and traceback, config values, environment values, the system and source records.
Replay loses nothing by it: settings and variables that hold paths are machine specific and
never applied (``context.config``, ``context.environment.plan``).
"""

from __future__ import annotations

import dataclasses
import getpass
import importlib.util
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from reproarchive.compat.inductor import cache_dir
from reproarchive.format.plain import from_plain, to_plain

# ---------------------------------------------------------------------------------------------
# Path redaction
# ---------------------------------------------------------------------------------------------

_PATH_END = r"(?![\w.\-+@])"  # "/home/ann" must not match inside "/home/anna"


def _prefix_variants(prefix: str) -> list[str]:
    out = []
    for p in (prefix, os.path.realpath(prefix)):
        p = p.rstrip("/\\")
        if len(p) > 1 and p not in out:
            out.append(p)
    return out


def redact_paths(
    text: str,
    prefixes: Iterable[str | os.PathLike] | Mapping[str, str] = (),
    *,
    home: bool = True,
) -> str:
    """Replace machine-specific absolute path prefixes in ``text``.

    The home directory becomes ``~`` (it names the user). ``prefixes`` adds other directories:
    as a mapping ``{prefix: replacement}`` (e.g. ``{save_dir: "<save_dir>", cwd: "."}``) or as a
    plain list, whose entries become ``<path>``. Both the given and the symlink-resolved
    spelling of each prefix are replaced; a prefix only matches at a path-component boundary,
    and longer prefixes win over shorter ones (so a cwd inside the home directory is replaced
    as the cwd, not as ``~/...``).
    """
    if not isinstance(text, str) or not text:
        return text
    return _replaced(text, _pairs(prefixes, home))


def _pairs(prefixes: Iterable[str | os.PathLike] | Mapping[str, str], home: bool) -> list[tuple[str, str]]:
    """``redact_paths``' prefixes as (spelling, replacement), longest first: found once for all
    the strings of a record (each spelling resolves symlinks on the file system)."""
    pairs: dict[str, str] = {}
    items = prefixes.items() if isinstance(prefixes, Mapping) else ((p, "<path>") for p in prefixes)
    for prefix, repl in items:
        for variant in _prefix_variants(os.fspath(prefix)):
            pairs.setdefault(variant, repl)
    if home:
        home_dir = os.path.expanduser("~")
        if home_dir not in ("~", "/", ""):
            for variant in _prefix_variants(home_dir):
                pairs.setdefault(variant, "~")
    return sorted(pairs.items(), key=lambda pair: len(pair[0]), reverse=True)


def _replaced(text: str, pairs: list[tuple[str, str]]) -> str:
    for prefix, repl in pairs:
        if prefix in text:  # most strings name no path: no pattern is run on them
            text = re.sub(re.escape(prefix) + _PATH_END, lambda _m, r=repl: r, text)
    return text


def machine_prefixes() -> dict[str, str]:
    """Directories of this machine that compiler messages and tracebacks name, each with the
    label that replaces it: the Python installation and its site-packages, reproarchive
    itself, inductor's and Triton's caches and the temporary folder (the home folder is
    ``redact_paths``' own). Every capture path redacts with these plus its own folders."""

    prefixes: dict[str, str] = {}
    for path in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        prefixes[path] = "<python>"

    found = importlib.util.find_spec("torch")  # where it is, without importing it (a guardian has not)
    if found is not None and found.origin:
        prefixes[str(Path(found.origin).resolve().parent.parent)] = "<site-packages>"
    prefixes[str(Path(__file__).resolve().parent.parent)] = "<reproarchive>"
    for label, path in (("<inductor-cache>", _inductor_cache_dir()),
                        ("<triton-cache>", os.environ.get("TRITON_CACHE_DIR"))):
        if path:
            prefixes[path] = label
    prefixes.setdefault(tempfile.gettempdir(), "<tmp>")
    return prefixes


def _inductor_cache_dir() -> str | None:
    if "torch" not in sys.modules:  # not loaded for this (the spool's guardian): the default is under <tmp>
        return os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    try:
        return cache_dir()
    except Exception:
        return os.environ.get("TORCHINDUCTOR_CACHE_DIR")


_ABS_PATH = re.compile(r"(?:^|[\s=:'\"(\[,])(?:/[\w.\-+@~]+|[A-Za-z]:\\)")


def _looks_like_path(value: Any) -> bool:
    if isinstance(value, str):
        return bool(_ABS_PATH.search(value))
    if isinstance(value, (list, tuple)):
        return any(_looks_like_path(v) for v in value)
    if isinstance(value, dict):
        return any(_looks_like_path(v) for v in value.values())
    return False


def _redact_value(value: Any, prefixes: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return redact_paths(value, prefixes)
    if isinstance(value, list):
        return [_redact_value(v, prefixes) for v in value]
    if isinstance(value, dict):
        return {k: _redact_value(v, prefixes) for k, v in value.items()}
    return value


# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Every record an archive gets from a capture
# ---------------------------------------------------------------------------------------------

#: The sections that hold what the machine said about itself; the others (backend, parent,
#: minify, metadata ...) are the tool's or the user's own words.
RECORD_SECTIONS = ("config", "environment", "system", "failure", "source")


def working_folder() -> dict[str, str]:
    """The prefix table a capture redacts with unless told otherwise: the folder the program
    runs in, written ``.`` (an archive is read on other machines, from other folders)."""
    return {os.getcwd(): "."}


def redacted(records: Any, prefixes: Mapping[str, str] | None = None) -> Any:
    """A ``format.schema.Records`` with its ``RECORD_SECTIONS`` redacted (``redacted_records``)."""

    sections = {name: getattr(records, name) for name in RECORD_SECTIONS}
    return dataclasses.replace(records, **redacted_records(sections, prefixes))


def redacted_records(records: Mapping[str, Any], prefixes: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``records`` (section name -> record or plain data, as ``pack`` takes them) with every
    string value redacted: this machine's directories (``machine_prefixes``), the home folder
    (``~``), ``prefixes`` (the caller's own folders, which win over the machine's), and the
    user name where a path spells it (``torchinductor_ann`` -> ``torchinductor_<user>``).
    Keys are left alone: they are setting and variable names, not machine facts."""

    text = text_redactor(prefixes)

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            return text(value)
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(walk(v) for v in value)
        return value

    out: dict[str, Any] = {}
    for name, record in records.items():
        if record is None:
            out[name] = None
        elif dataclasses.is_dataclass(record):
            out[name] = from_plain(type(record), walk(to_plain(record)))
        else:
            out[name] = walk(record)
    return out


def text_redactor(prefixes: Mapping[str, str] | None = None) -> Callable[[str], str]:
    """The redaction ``redacted_records`` runs on each string, for text outside the records (a
    graph's stack frames): this machine's directories, the home folder, ``prefixes`` (which win)
    and the user name where a path spells it. The prefix table is found once."""
    pairs = _pairs({**machine_prefixes(), **(prefixes or {})}, home=True)
    user = _user_name()

    def text(value: str) -> str:
        value = _replaced(value, pairs)
        if user and ("/" in value or "\\" in value):
            value = re.sub(r"(?<=[/\\_\-])" + re.escape(user) + r"(?![\w.\-])", "<user>", value)
        return value

    return text


def _user_name() -> str | None:
    try:
        name = getpass.getuser()
    except Exception:  # no user database entry (a container's random uid)
        return None
    return name if len(name) >= 3 else None  # "a" would mask half of every path
