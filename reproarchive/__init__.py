"""reproarchive: one portable, verifiable, content-addressed file per torch.compile failure.

The public surface is the verbs below and their value types (docs/api.md); everything else is
private. The command line's own helpers are in ``reproarchive._internal``. Names resolve lazily
so that ``reproarchive --help`` does not pay for importing torch.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING

from reproarchive.lazy_names import resolved
from reproarchive.package_version import __version__  # noqa: F401

_EXPORTS = {
    # format and core library (spec/FORMAT.md)
    "pack": "reproarchive.sources.graph_pack",
    # load, inspect and run take a file or a store reference (STORE/NAME)
    "load": "reproarchive.references",
    "verify": "reproarchive.archive.checking",
    "unpack": "reproarchive.archive.checking",
    "inspect": "reproarchive.references",
    "doctor": "reproarchive.references",
    "Repro": "reproarchive.archive.loading",
    "Records": "reproarchive.format.schema",
    # a multi-rank job in one archive (spec §8 job)
    "load_job": "reproarchive.archive.job_archive",
    "JobRepro": "reproarchive.archive.job_archive",
    "pack_job": "reproarchive.archive.job_archive",
    "RankCapture": "reproarchive.archive.job_archive",
    "AbsentTensor": "reproarchive.codec.tensors",
    # capture after a failure
    "capture": "reproarchive.sources.capture.capture_backend",
    "pack_dump": "reproarchive.sources.dump.pack_dump",
    "capture_program": "reproarchive.sources.program.program_capture",
    "pack_trace": "reproarchive.sources.trace.pack_trace",
    # replay and export
    "run": "reproarchive.references",
    "JobOutcome": "reproarchive.replay.launch",
    "Outcome": "reproarchive.replay.outcome",
    "ReplaySettings": "reproarchive.replay.settings",
    "export": "reproarchive.standalone.exporting",
    # many replays or imports in one process: their child processes forked from a warm server
    "warm_children": "reproarchive.child",
    # find the culprit: the compiler stage, the torch build
    "bisect_compiler": "reproarchive.bisect.compiler",
    "CompilerBisection": "reproarchive.bisect.results",
    "bisect_torch": "reproarchive.bisect.environments",
    "TorchBisection": "reproarchive.bisect.results",
    "read_bisection": "reproarchive.bisect.results",
    # triage
    "diff": "reproarchive.triage.diff",
    "view": "reproarchive.triage.view",
    # a fleet: group, replay and minify one per group on an engine, verdicts cached
    "triage_fleet": "reproarchive.triage.fleet",
    "TriageReport": "reproarchive.triage.fleet",
    "Executor": "reproarchive.triage.engine",
    "LocalExecutor": "reproarchive.triage.engine",
    "RayExecutor": "reproarchive.triage.ray_engine",
    "Task": "reproarchive.triage.engine",
    "Verdict": "reproarchive.triage.verdicts",
    # minify
    "minify": "reproarchive.minifier",
    "minify_archive": "reproarchive.minifier.driver",
    # a team store on object storage (spec §11)
    "push": "reproarchive.store.push",
    "pull": "reproarchive.store.pull",
    "list_store": "reproarchive.store.listing",
    "check_store": "reproarchive.store.check",
    # errors: the base class of every one; each kind is in the public module reproarchive.errors
    "ReproArchiveError": "reproarchive.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return resolved(_EXPORTS, globals(), __name__, name)
    if name == "errors":
        return importlib.import_module("reproarchive.errors")
    errors = importlib.import_module("reproarchive.errors")
    if name in errors.__all__:  # once a name of the package: still found, with a warning
        warnings.warn(f"reproarchive.{name} is reproarchive.errors.{name} now; the package's own name may go "
                      "(docs/api.md)", DeprecationWarning, stacklevel=2)
        return getattr(errors, name)
    _internal = importlib.import_module("reproarchive._internal")
    if name not in _internal.HELPERS:
        raise AttributeError(f"module 'reproarchive' has no attribute {name!r}")
    # once public: still found, with a warning, so that code written against it keeps working
    warnings.warn(f"reproarchive.{name} is private now and may change or go; it is not part of the API "
                  "(docs/api.md)", DeprecationWarning, stacklevel=2)
    return getattr(_internal, name)


if TYPE_CHECKING:  # pragma: no cover
    from reproarchive.archive.checking import unpack, verify  # noqa: F401
    from reproarchive.archive.loading import Repro  # noqa: F401
    from reproarchive.format.schema import Records  # noqa: F401
    from reproarchive.references import doctor, inspect, load, run  # noqa: F401
    from reproarchive.replay.settings import ReplaySettings  # noqa: F401
    from reproarchive.sources.graph_pack import pack  # noqa: F401
    from reproarchive.store.check import check_store  # noqa: F401
    from reproarchive.store.pull import pull  # noqa: F401
    from reproarchive.store.push import push  # noqa: F401
