"""What differs between an archive's recording machine and this one: ``run``'s report and
``doctor``.

"Fails there, passes here" is explained by a difference, so a list padded with non-differences
hides the one that matters. Every row here is a real difference: a config setting compared
only when both sides can be read (the torch config modules the record names are loaded first,
from a fixed list; never a module an archive names), an environment variable set differently
(not one torch sets by itself when compiling), a system fact. ``doctor`` reads the index
alone, so it costs nothing and runs nothing.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

from reproarchive.archive.inspection import NamedByIndex, StoreOrigin
from reproarchive.codec.custom_ops import differences as custom_op_differences
from reproarchive.codec.stand_ins import BROUGHT_MODULES, bring_implementations, is_stand_in
from reproarchive.codec.triton_kernels import brought_kernels
from reproarchive.codec.triton_kernels import differences as triton_kernel_differences
from reproarchive.context.config import comparable_snapshot, config_diff
from reproarchive.context.environment import environment_diff
from reproarchive.context.execution import execution_diff
from reproarchive.context.system import system_diff
from reproarchive.format import layout
from reproarchive.format.plain import PlainData
from reproarchive.format.reader import ContainerReader
from reproarchive.format.schema import ConfigRecord, EnvironmentRecord, ExecutionRecord, SystemRecord
from reproarchive.package_version import TESTED_TORCH, tested_torch


def differences(
    *,
    config: ConfigRecord | None,
    environment: EnvironmentRecord | None,
    system: SystemRecord | None,
    config_applied: bool | None = True,
    execution: ExecutionRecord | None = None,
) -> list[dict[str, Any]]:
    """Differences that could explain a different outcome, most telling first.

    Rows are ``{"what", "name", "recorded", "current", "important"}``, config rows also
    ``"status"`` (``context.config.config_diff``; for "missing_here", "new_here" and
    "not_compared" the side without the setting is None and means "no such setting" or
    "unknown", never the value None). ``config_applied``: True when the recorded config was
    applied to the replay: a value that merely differs here was overridden and cannot explain
    anything, so it is left out; False (``run --current-config``): every config row is
    important; None (``doctor``, nothing run): differing values are listed but not important,
    since ``run`` applies them. Important are also settings this torch lacks that the
    recording changed, and settings that could not be stored (custom passes). ``execution``
    rows (``doctor``'s; ``run`` enters the recorded state, so it has none) are where the
    recorded thread state differs from a fresh process's: any other replay must enter it.
    """

    rows: list[dict[str, Any]] = []
    try:
        if system is not None:
            for row in system_diff(system):
                rows.append({"what": "system", "name": row["what"], "recorded": row["recorded"],
                             "current": row["current"], "important": row["important"]})
        if environment is not None:
            for row in environment_diff(environment):
                rows.append({"what": "environment", "name": row["what"].removeprefix("env "),
                             "recorded": row["recorded"], "current": row["current"], "important": row["important"]})
        if execution is not None:
            for row in execution_diff(execution):
                rows.append({"what": "execution", "name": row["what"], "recorded": row["recorded"],
                             "current": row["current"], "important": True})
        if config:
            changed = {(m, k) for m, values in config.changed.items() for k in values}
            changed |= {(u.module, u.key) for u in config.unrepresentable if u.changed}  # e.g. not applied when packed
            for row in config_diff(config, comparable_snapshot(config)):
                status = row["status"]
                if config_applied and status == "differs":
                    continue
                important = (config_applied is False or status == "unrepresentable"
                             or status in ("missing_here", "not_compared") and (row["module"], row["key"]) in changed)
                rows.append({"what": "config", "name": f"{row['module']}.{row['key']}",
                             "recorded": row["recorded"], "current": row["current"],
                             "important": important, "status": status})
    except Exception as exc:  # noqa: BLE001 - the report must not fail because a diff did
        rows.append({"what": "diff", "name": "(could not compare)", "recorded": None,
                     "current": f"{type(exc).__name__}: {exc}", "important": False})
    rows.sort(key=lambda r: not r["important"])
    return rows


@dataclasses.dataclass(frozen=True)
class DoctorReport(NamedByIndex):
    """What ``doctor`` found; ``to_plain()`` is ``doctor --json``."""

    path: str
    digest: str  # the index digest
    differences: tuple[PlainData, ...]  # rows as ``differences`` gives them, important first
    count: int
    important: int  # how many rows could change the outcome of ``run``
    torch: str  # the torch here
    tested_torch: tuple[str, ...]  # the torch releases this reproarchive was tested with
    torch_tested: bool  # whether the torch here is one of them
    store: StoreOrigin | None = dataclasses.field(default=None, metadata={"omit": "none"})


def _custom_names(index) -> list[str]:
    return [op.name for op in index.custom_ops or ()]


def doctor(path: str | os.PathLike, *, limits: layout.Limits = layout.DEFAULT_LIMITS,
           imports: tuple[str, ...] = (), libraries: tuple[str, ...] = ()) -> DoctorReport:
    """What differs between the machine that recorded the archive at ``path`` and this one,
    without loading a tensor or compiling anything.

    Reads the index alone (validated like every reader's: ArchiveError, exit 2, for a bad
    archive). The graph is not rebuilt, so an archive this torch could not load (a device type
    or call target it lacks) is still compared: its torch version is then usually the answer.
    Custom ops the graph calls are compared with the ones registered here, after importing and
    loading what the user names (``imports``, ``libraries``: ``--import``, ``--load-library``):
    missing, or with another schema or implementation (provenance digest); (1.4) each user Triton
    kernel that was not brought, or was brought in another version (source digest). The report
    also says whether the torch here is a release this reproarchive was tested with: the
    library reads torch's private modules, which change in every release.
    """
    bring_implementations(imports, libraries)
    with ContainerReader(path, limits=limits) as reader:
        index = reader.index
        digest = reader.index_digest
    records = index.records
    rows = differences(config=records.config, environment=records.environment, system=records.system,
                       execution=records.execution, config_applied=None)
    rows[:0] = [*custom_op_differences(index.custom_ops, stand_ins=[n for n in _custom_names(index) if is_stand_in(n)]),
                *triton_kernel_differences(index.triton_kernels, brought_kernels(BROUGHT_MODULES))]

    return DoctorReport(path=str(path), digest=digest, differences=tuple(rows), count=len(rows),
                        important=sum(1 for r in rows if r["important"]), torch=torch.__version__,
                        tested_torch=TESTED_TORCH, torch_tested=tested_torch(torch.__version__))
