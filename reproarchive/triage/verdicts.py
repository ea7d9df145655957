"""Verdicts, the environments they were reached in, and the cache that keeps them.

Replaying and minifying a fleet costs minutes per archive; a triage run that is interrupted, or
rerun by a teammate, must not pay twice. So every verdict is stored, keyed by what decides it:
the archive (its index digest), the action, and the environment (``Environment``: the torch
build, the devices, the replay settings and the variables that steer torch). A run looks its
tasks up first and submits only the missing ones; a verdict is written the moment it arrives,
so a run killed midway leaves every finished verdict behind.

The cache is a ``Store`` (``reproarchive.store.backend``): the team store the archives came from
(keys under ``verdicts/``, spec §11.5), or for a folder of archives a local store in
``<folder>/.reproarchive-triage``. A verdict object is small JSON, written whole
(``Store.write``): two workers that reach one verdict write the same facts, and the last wins.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
from typing import Any

from reproarchive.codec.device_runtime import devices_here, runtime
from reproarchive.context.environment import environment_snapshot, set_by_torch_here
from reproarchive.errors import ReproArchiveError, SchemaViolation, StoreError, StoreNotFoundError
from reproarchive.format.plain import PlainData, PlainRecord, from_plain, omit_none
from reproarchive.store.backend import Store

#: The record's version: a reader refuses a verdict object of another major. 1.1 added ``replays``.
VERDICT_FORMAT = "1.1"
PREFIX = "verdicts"
_MAX_OBJECT = 1 << 20

#: The variables that set how many threads a replay computes with. They can change its numbers,
#: and whether a race or an abort inside an OpenMP loop shows, so a verdict on a failure in a
#: graph's run depends on them; a compile error is the compiler's answer to the graph, which they
#: do not decide. An archive whose recorded failure is a compile error is judged in its
#: environment without them (``Environment.deciding``), so that engines that set them differently
#: (Ray starts its workers with ``OMP_NUM_THREADS`` set to a task's CPUs) share its verdicts.
#: Of the variables an environment records (``context.admission``), only these two set a count.
THREAD_VARIABLES = frozenset({"OMP_NUM_THREADS", "MKL_NUM_THREADS"})
#: The recorded failure stages whose verdicts do not depend on THREAD_VARIABLES.
_THREAD_FREE_STAGES = frozenset({"compile"})

#: What an action can conclude, besides the outcome words of ``run`` and ``minify``.
CRASHED, TIMED_OUT, ERROR = "crashed", "timed out", "error"


@dataclasses.dataclass(frozen=True)
class Environment(PlainRecord):
    """Where verdicts were reached: the facts that can change one. ``digest`` names it."""

    torch: str
    torch_git: str
    python: str
    device: str  # what replays ran on: "cpu", or the accelerators present ("cuda: NVIDIA H100 ...")
    settings: dict[str, PlainData]  # the replay settings (ReplaySettings.to_plain())
    variables: dict[str, str]  # the environment variables that steer torch (redacted)
    #: the interpreter a replay there runs (``triage --against PYTHON``): two interpreters of one
    #: torch on one machine are two environments (their other packages differ). None for the
    #: environment triage runs in: its verdicts are keyed as they always were.
    interpreter: str | None = omit_none()
    COMPUTED = ("digest", "label")

    @property
    def digest(self) -> str:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "interpreter" or self.interpreter is not None}
        text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()

    @property
    def label(self) -> str:
        """``torch 2.13.0 (cpu) sha256:1f2e3d4c``: short, for tables."""
        where = f", {self.interpreter}" if self.interpreter else ""
        return f"torch {self.torch} ({self.device}{where}) {self.digest[:15]}"

    def deciding(self, stage: str | None) -> Environment:
        """What of this environment can decide a verdict on an archive whose recorded failure is
        at ``stage`` (None: none recorded): all of it, except the thread counts for a compile
        error (``THREAD_VARIABLES``). Verdicts are cached under this one's digest."""
        if stage not in _THREAD_FREE_STAGES:
            return self
        return dataclasses.replace(self, variables={k: v for k, v in self.variables.items()
                                                    if k not in THREAD_VARIABLES})


def current_environment(settings: Any) -> Environment:
    """This process's environment for replays under ``settings`` (a ``ReplaySettings``)."""
    import torch


    device = "cpu"
    here = devices_here()
    if here:  # the accelerators' names (through the one device seam: codec.device_runtime)
        names = sorted({runtime(d).properties(d).get("name") or str(d) for d in here})
        device = f"{here[0].type}: {', '.join(names)}"
    return Environment(torch=torch.__version__, torch_git=getattr(torch.version, "git_version", "") or "",
                       python=platform.python_version(), device=device, settings=settings.to_plain(),
                       # what torch exports by itself once it compiled (its default cache folder)
                       # says nothing about the environment
                       variables={k: v for k, v in environment_snapshot().variables.items()
                                  if not set_by_torch_here(k, v)})


@dataclasses.dataclass(frozen=True)
class Minified(PlainRecord):
    """The archive a minify task wrote: where (a path, or a store reference), its index digest
    and how small it is."""

    location: str
    digest: str
    nodes: int
    ops: int
    inputs: int
    bytes: int
    code: str = ""


@dataclasses.dataclass(frozen=True)
class Verdict(PlainRecord):
    """What one action concluded on one archive in one environment (spec §11.5).

    ``status``: for replay the words of ``run`` (reproduced, different failure, passed); for
    minify those of ``minify`` (minified, not failing, unchanged); for bisect those of
    ``bisect compiler`` (found, not reproduced, incomplete: ``kind`` the stage named, ``message``
    its summary); for doctor "same" or "differs"; for any action "crashed" (the task's process
    died: ``signal``), "timed out" (past ``--max-time``) or "error" (the action could not be
    done: ``message``).
    ``signature`` and ``kind``: the failure observed, for replay."""

    format: str
    action: str
    archive: str  # the archive's index digest
    environment: str  # Environment.digest
    status: str
    exit_code: int | None = None
    kind: str | None = None
    signature: str | None = None
    message: str = ""
    signal: str | None = None
    elapsed_s: float = 0.0
    finished: str = ""  # ISO 8601 UTC
    minified: Minified | None = None
    differences: int | None = None  # doctor: rows that could change the outcome of run
    #: replay repeated (``triage --repeat``): every replay's status, in the order they ended; the
    #: rest of the record is the replay ``status`` came from (``triage.repeats``). None: one replay.
    replays: tuple[str, ...] | None = omit_none()

    @property
    def failed_to_run(self) -> bool:
        """The task did not reach a verdict on the archive (it crashed, hung or could not start)."""
        return self.status in (CRASHED, TIMED_OUT, ERROR)

    @property
    def replay_count(self) -> int:
        return len(self.replays) if self.replays else 1


def _hex(digest: str) -> str:
    algorithm, _, value = digest.partition(":")
    if algorithm != "sha256" or len(value) != 64 or not all(c in "0123456789abcdef" for c in value):
        raise ReproArchiveError(f"{digest[:80]!r} is not a sha256 digest", "this is a bug in the caller")
    return value


class VerdictCache:
    """Verdicts in a store, under ``verdicts/<environment hex>/``: ``environment.json`` says
    what the environment is, ``<archive hex>/<action>.json`` holds one verdict each."""

    def __init__(self, store: Store):
        self.store = store

    def _key(self, environment: str, archive: str, action: str) -> str:
        return f"{PREFIX}/{_hex(environment)}/{_hex(archive)}/{action}.json"

    def get(self, environment: str, archive: str, action: str) -> Verdict | None:
        """The stored verdict, or None (none stored, or one this reader cannot trust)."""
        try:
            data = self.store.read_small(self._key(environment, archive, action), _MAX_OBJECT)
        except StoreNotFoundError:
            return None
        return _decode(data)

    def put(self, verdict: Verdict) -> None:
        self.store.write(self._key(verdict.environment, verdict.archive, verdict.action),
                         _encode(verdict.to_plain()))

    def record_environment(self, environment: Environment) -> None:
        key = f"{PREFIX}/{_hex(environment.digest)}/environment.json"
        if self.store.size(key) is None:
            self.store.write(key, _encode(environment.to_plain()))

    def environments(self) -> list[Environment]:
        """Every environment with verdicts here (for ``--against``)."""
        out = []
        for key in self.store.list(PREFIX):
            try:
                data = json.loads(self.store.read_small(f"{key}/environment.json", _MAX_OBJECT))
                data.pop("digest", None)
                data.pop("label", None)
                out.append(from_plain(Environment, data))
            except (StoreError, ValueError, SchemaViolation):
                continue
        return out

    def find_environment(self, prefix: str) -> Environment:
        """The one stored environment whose digest starts with ``prefix`` (``sha256:`` optional)."""
        want = prefix if prefix.startswith("sha256:") else f"sha256:{prefix}"
        found = [e for e in self.environments() if e.digest.startswith(want)]
        if len(found) != 1:
            known = ", ".join(e.label for e in self.environments()) or "none"
            raise ReproArchiveError(
                f"{'no' if not found else 'more than one'} environment with verdicts here matches {prefix!r}",
                f"name one by a longer digest prefix; environments with verdicts: {known}")
        return found[0]


def _encode(plain: dict) -> bytes:
    return json.dumps(plain, sort_keys=True, indent=1, default=str).encode() + b"\n"


def _decode(data: bytes) -> Verdict | None:
    """A stored verdict, checked like any record; a damaged or newer-major one is treated as
    missing (the task runs again), never trusted."""
    try:
        plain = json.loads(data)
        if not isinstance(plain, dict) or str(plain.get("format", "")).split(".")[0] != VERDICT_FORMAT.split(".")[0]:
            return None
        return from_plain(Verdict, plain)
    except (ValueError, SchemaViolation):
        return None
