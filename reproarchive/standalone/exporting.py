"""``export``: an archive's standalone script, for one process (``script``) or, for a
multi-rank job archive, for its ranks (``job_script``)."""

from __future__ import annotations

import os
from typing import Any

from reproarchive.codec.stand_ins import bring_implementations
from reproarchive.format.reader import ContainerReader
from reproarchive.replay.settings import ReplaySettings
from reproarchive.standalone import job_script, script


def export(path: str | os.PathLike, out_dir: str | os.PathLike, settings: ReplaySettings | None = None,
           **options: Any) -> script.ExportReport:
    """Write ``out_dir`` with ``repro.py`` and its data; see ``script.export`` (one process) and
    ``job_script.export_job`` (a job of several ranks: ``python repro.py`` launches them)."""
    settings = ReplaySettings.given(settings, options)
    # the user's implementations (--import, --load-library) before loading: the graph's custom ops
    # are then theirs, not stand-ins, and the script brings them too
    bring_implementations(settings.imports, settings.libraries)
    with ContainerReader(path) as reader:
        job = reader.index.job
    if job is not None and job.world_size > 1:
        return job_script.export_job(path, out_dir, settings)
    return script.export(path, out_dir, settings)
