"""The process one triage task runs in: ``python -m reproarchive.triage.task_child FOLDER``.

It does the action as the command of the same name would (``run``, ``minify``, ``doctor``), in
this fresh process, and returns the verdict. A replay of an archive whose recorded failure is a
crash still isolates itself one level further down (``run``'s own rule), so its crash is judged
against the recorded one; any other death takes this process, which ``engine.run_task`` reports.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from reproarchive.child import child_main, temp_folder
from reproarchive.compat import dynamo
from reproarchive.errors import ReproArchiveError
from reproarchive.format.plain import from_plain
from reproarchive.format.reader import ContainerReader
from reproarchive.replay.settings import ReplaySettings
from reproarchive.store.location import is_store
from reproarchive.store.push import push
from reproarchive.triage.engine import Task, now
from reproarchive.triage.verdicts import ERROR, VERDICT_FORMAT, Minified, Verdict, current_environment

_CODE_CHARS = 20000


def _handle(request: dict, *, started, event) -> dict[str, Any]:
    task = from_plain(Task, request)
    settings = ReplaySettings.from_plain(task.settings)
    environment = current_environment(settings).digest
    start = time.monotonic()
    try:
        facts = {"replay": _replay, "minify": _minify, "doctor": _doctor, "bisect": _bisect}[task.action](task,
                                                                                                   settings)
    except ReproArchiveError as err:
        facts = {"status": ERROR, "message": str(err)}
    return Verdict(format=VERDICT_FORMAT, action=task.action, archive=task.digest, environment=environment,
                   elapsed_s=round(time.monotonic() - start, 3), finished=now(), **facts).to_plain()


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")[:300]


def _replay(task: Task, settings: ReplaySettings) -> dict[str, Any]:
    from reproarchive.references import run

    outcome = run(task.archive, settings)
    observed = outcome.observed
    return {"status": outcome.status, "exit_code": outcome.exit_code, "kind": outcome.kind,
            "signature": observed.signature if observed else None,
            "message": f"{observed.exception_type}: {_first_line(observed.message)}".strip(": ") if observed else ""}


def _minify(task: Task, settings: ReplaySettings) -> dict[str, Any]:
    from reproarchive.minifier.driver import minify_archive
    from reproarchive.references import local_archive

    name = f"min-{task.digest.split(':')[1][:16]}"

    to_store = task.output is not None and is_store(task.output)
    with tempfile.TemporaryDirectory(prefix="reproarchive-task-", dir=temp_folder()) as tmp:
        folder = Path(tmp) if to_store or task.output is None else Path(task.output)
        folder.mkdir(parents=True, exist_ok=True)
        out = folder / f"{name}.tar.zst"
        report = minify_archive(local_archive(task.archive), out, settings, max_time=task.max_time, jobs=1,
                                repeat=task.repeat or 1)
        judged = f"; each candidate judged by up to {task.repeat} replays (flaky)" if task.repeat else ""
        facts: dict[str, Any] = {"status": report.status, "message": _stop_reason(report.stats) + judged}
        if report.status != "minified" or not out.exists():
            return facts
        with ContainerReader(out) as reader:
            index, digest = reader.index, reader.index_digest
        location = str(out)
        if to_store:
            push(out, task.output, name=name)
            location = f"{task.output.rstrip('/')}/{name}"
        facts["minified"] = Minified(location=location, digest=digest, nodes=len(index.graph.nodes),
                                     ops=index.graph.op_count(), inputs=len(index.inputs),
                                     bytes=os.path.getsize(out), code=report.code[:_CODE_CHARS])
        return facts


def _stop_reason(stats: dict) -> str:
    ops = (stats.get("initial_ops"), stats.get("final_ops"))
    text = f"{ops[0]} -> {ops[1]} ops" if None not in ops else ""
    if stats.get("stop_reason"):
        text += f" ({stats['stop_reason']})" if text else str(stats["stop_reason"])
    return text


def _bisect(task: Task, settings: ReplaySettings) -> dict[str, Any]:
    """``bisect compiler`` on the archive: the compiler stage (backend, subsystem, bisect number)
    and the recorded Inductor settings its failure needs, in one line (``culprit``)."""
    from reproarchive.bisect.compiler import bisect_compiler
    from reproarchive.references import local_archive

    result = bisect_compiler(local_archive(task.archive), settings, max_time=task.max_time, repeat=task.repeat or 1)
    judged = f"; each step judged by up to {task.repeat} replays (flaky)" if task.repeat else ""
    return {"status": result.status, "message": (result.summary[:300 - len(judged)] + judged),
            "kind": _culprit(result)}


def _culprit(result) -> str | None:
    """``inductor / lowerings / 2``, the stage a bisection named; None when it named none."""
    if result.status != "found" or result.backend is None:
        return None
    parts = [result.culprit_backend, result.subsystem,
             None if result.bisect_number is None else str(result.bisect_number)]
    return " / ".join(p for p in parts if p)


def _doctor(task: Task, settings: ReplaySettings) -> dict[str, Any]:
    from reproarchive.references import doctor

    report = doctor(task.archive)
    important = [row for row in report.differences if isinstance(row, dict) and row.get("important")]
    first = important[0] if important else None
    message = f"{first.get('what')}: {first.get('recorded')!r} -> {first.get('current')!r}" if first else ""
    return {"status": "differs" if report.important else "same", "differences": report.important,
            "message": message[:300]}


if __name__ == "__main__":
    sys.exit(child_main(_handle, unexpected_what="the triage task failed",
                        warm_imports=("reproarchive.references", dynamo.MODULE)))
