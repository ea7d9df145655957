"""The command line's helpers: what ``cli/`` needs from the library besides its public verbs.

They are not part of the API (docs/api.md lists that): each answers a question only the command
line asks (is this path a TORCH_TRACE log, a spool, a job's parts; the text ``inspect`` prints for
a job; the page ``triage --html`` writes) or is a step of a verb the API offers whole. Keeping
them here keeps ``import reproarchive`` small and lets them change with the command line.
Names resolve lazily, as the package's do, so the CLI's start does not import torch.
"""

from __future__ import annotations

from reproarchive.lazy_names import resolved

HELPERS = {
    "graph_code": "reproarchive.archive.graph_code",
    "read_input": "reproarchive.archive.loading",
    "merge_parts": "reproarchive.archive.job_merge",
    "job_lines": "reproarchive.archive.job_report",
    "first_divergence": "reproarchive.archive.job_report",
    "pack_job_parts": "reproarchive.sources.capture.job_capture",
    "is_job_parts": "reproarchive.sources.capture.job_capture",
    "list_trace": "reproarchive.sources.trace.pack_trace",
    "is_trace": "reproarchive.sources.trace.pack_trace",
    "pack_spool": "reproarchive.sources.program.program_capture",
    "is_spool": "reproarchive.archive.spool_folder",
    "failure_kind": "reproarchive.context.failure",
    "compiler_errors": "reproarchive.context.failure",
    "recorded_config": "reproarchive.standalone.script_literals",
    "write_bisection": "reproarchive.bisect.results",
    "write_triage_page": "reproarchive.triage.fleet_page",
    "fetch": "reproarchive.store.pull",
    "is_store": "reproarchive.store.location",
    "is_store_reference": "reproarchive.store.location",
}

__all__ = sorted(HELPERS)


def __getattr__(name: str):
    return resolved(HELPERS, globals(), __name__, name)
