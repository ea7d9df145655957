"""``bisect torch --torch-nightly FROM..TO``: the nightly builds of a date range, as torch specs.

A regression found on a nightly is narrowed by hand today: install the nightly of one day,
replay, pick another day. PyTorch publishes one build a day, versioned with its date
(``2.16.0.dev20261104+cpu``), on an index pip reads (``--extra-index-url``). The range is
resolved by asking pip which versions the indexes serve (``pip index versions torch --pre``,
so the user's own pip configuration applies, as it does to the builds), keeping those dated
within it, oldest first; each becomes an exact spec (``torch==2.16.0.dev20261104+cpu``) that
``torch_builds`` makes an environment of, with ``--pre`` and the same index.
"""

from __future__ import annotations

import datetime
import re
import subprocess
import sys

from reproarchive.errors import ReproArchiveError

_DEV_DATE = re.compile(r"\.dev(\d{8})")
_TIMEOUT = 300


def parse_range(text: str) -> tuple[datetime.date, datetime.date]:
    """``2026-11-01..2026-11-20`` -> (first day, last day), both included."""
    first, sep, last = text.partition("..")
    try:
        if not sep:
            raise ValueError
        start, end = datetime.date.fromisoformat(first.strip()), datetime.date.fromisoformat(last.strip())
    except ValueError:
        raise ReproArchiveError(f"--torch-nightly {text!r} is not a date range",
                                "give FROM..TO as dates, e.g. 2026-11-01..2026-11-20") from None
    if end < start:
        raise ReproArchiveError(f"--torch-nightly {text!r} ends before it starts", "give the earlier date first")
    return start, end


def pip_options(index_url: str | None) -> tuple[str, ...]:
    """What pip needs to see nightlies: pre-releases, and the index that serves them."""
    return ("--pre", *(("--extra-index-url", index_url) if index_url else ()))


def nightly_specs(text: str, index_url: str | None = None) -> tuple[str, ...]:
    """The torch specs of the nightlies dated within the range ``text``, oldest first."""
    start, end = parse_range(text)
    dated = []
    for version in served_versions(index_url):
        found = _DEV_DATE.search(version)
        if found is None:
            continue
        try:
            day = datetime.datetime.strptime(found.group(1), "%Y%m%d").date()
        except ValueError:
            continue
        if start <= day <= end:
            dated.append((day, version))
    if not dated:
        where = index_url or "the indexes pip is configured with"
        raise ReproArchiveError(f"no torch nightly dated {start}..{end} on {where}",
                                "widen the range, or give --index-url (e.g. https://download.pytorch.org/whl/"
                                "nightly/cpu)")
    return tuple(f"torch=={version}" for _, version in sorted(dated))


def pip_said(done: subprocess.CompletedProcess) -> str:
    """The line of a failed pip (or venv) run that says why: its last, warnings left out."""
    lines = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip() and "WARNING" not in ln]
    return (lines or ["no output"])[-1].strip()[:300]


def served_versions(index_url: str | None) -> list[str]:
    """Every torch version pip finds for this interpreter (pre-releases included)."""
    argv = [sys.executable, "-m", "pip", "index", "versions", "torch", "--disable-pip-version-check",
            *pip_options(index_url)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=_TIMEOUT,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ReproArchiveError(f"pip could not list torch's versions: {exc}", "check pip and the index") from None
    listed = next((line.partition(":")[2] for line in done.stdout.splitlines()
                   if line.startswith("Available versions:")), None)
    if done.returncode != 0 or listed is None:
        raise ReproArchiveError(f"pip could not list torch's versions: {pip_said(done)}",
                                "check the index URL and that it serves torch for this Python")
    return [v.strip() for v in listed.split(",") if v.strip()]
