"""``triage --against TORCH``: re-check a fleet's open groups on another torch, here and now.

``--against`` with a digest compares with verdicts someone already reached in that environment.
The question a team asks when a release or a nightly lands is the same one before anyone has
triaged there: which of our open bugs does it fix? So ``--against`` also takes an environment:
an interpreter (a path) or a torch (a version, a requirement or a wheel file: built with pip and
cached, as ``bisect torch --torch`` builds it). Each group that still fails here is replayed
there (as often as here while it passes: ``recheck``), with that environment's own reproarchive
or a copy of this one (``bisect``'s rule: nothing of this process leaks in), and the verdict is
cached under that environment, so the comparison (fixed, still fails, fails differently) reads
it like any other and a rerun replays nothing. A replay there that reaches no verdict (its
reader cannot load the archive, a timeout) is reported, never cached, and never taken for
"fixed".
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from typing import Callable

from reproarchive.bisect.environments import is_interpreter, probe_environment, replay_in
from reproarchive.bisect.results import BAD, GOOD, OTHER
from reproarchive.bisect.torch_builds import build_environment, default_cache, pinned_packages
from reproarchive.errors import ReproArchiveError, SourceError
from reproarchive.references import local_archive
from reproarchive.replay.outcome import DIFFERENT, PASSED, REPRODUCED
from reproarchive.triage.engine import now
from reproarchive.triage.repeats import combined
from reproarchive.triage.verdicts import ERROR, TIMED_OUT, VERDICT_FORMAT, Environment, Verdict, VerdictCache

_STATUS = {GOOD: PASSED, BAD: REPRODUCED, OTHER: DIFFERENT}
_DIGEST = re.compile(r"(sha256:)?[0-9a-f]{4,64}")


def names_an_environment(against: str) -> bool:
    """Whether ``--against`` names an environment to replay in (an interpreter, or a torch),
    rather than a digest prefix of one with cached verdicts."""
    if is_interpreter(against):
        return True
    return _DIGEST.fullmatch(against) is None


def other_environment(against: str, here: Environment,
                      on_build: Callable[[str, object], None] | None = None) -> tuple[str, Environment]:
    """(the interpreter, the ``Environment`` its verdicts are cached under) for ``against``:
    this machine, variables and replay settings, with that interpreter's torch and Python, and
    the interpreter itself (another venv of the same torch is another environment)."""
    python = against
    if os.sep in against and not against.endswith(".whl") and not os.path.isfile(against):
        raise SourceError(f"--against {against}: no such interpreter",
                          "give the path of a python, a torch version or wheel, or an environment's digest prefix")
    if not is_interpreter(against):
        python = str(build_environment(against, cache=default_cache(), pins=pinned_packages({}),
                                       on_build=on_build).python)
    facts, problem = probe_environment(python)
    if problem is not None or not facts or facts.get("torch_error") or not facts.get("torch"):
        why = problem or f"torch cannot be imported: {(facts or {}).get('torch_error')}"
        raise ReproArchiveError(f"--against {against}: {why}", "give an interpreter that has torch installed")
    other = dataclasses.replace(here, torch=str(facts["torch"]), torch_git=str(facts.get("git_version") or ""),
                                python=str(facts.get("python") or ""), interpreter=os.path.abspath(python))
    return python, other


def recheck(cache: VerdictCache, python: str, todo: list[tuple[Environment, object, str | None, str | None]],
            max_time: float | None, progress: Callable[[dict], None] | None = None,
            replays: int = 1) -> dict[str, Verdict]:
    """Replay there each ``(environment, representative, backend, recorded signature)`` of
    ``todo`` whose verdict is not cached yet; the verdicts reached, by the representative's
    index digest. A replay that reproduced there observed the recorded signature (``run``'s
    strict rule), one that failed differently names what it observed. A representative that
    passes there is replayed until ``replays`` in all (``repeats``): it is called fixed there
    only when none of them fails; the first that fails, or reaches no verdict, ends it."""
    out = {}
    for done, (env, rep, backend, recorded) in enumerate(todo, 1):
        if cache.get(env.digest, rep.digest, "replay") is not None:
            continue
        tries: list[Verdict] = []
        while len(tries) < replays and (not tries or tries[-1].status == PASSED):
            tries.append(_replay_there(python, env, rep, backend, recorded, max_time))
        verdict = combined(tries)
        if not verdict.failed_to_run:
            cache.record_environment(env)
            cache.put(verdict)
        out[rep.digest] = verdict
        if progress is not None:
            progress({"event": "verdict", "done": done, "total": len(todo), "archive": rep.name, "verdict": verdict})
    return out


def _replay_there(python: str, env: Environment, rep, backend: str | None, recorded: str | None,
                  max_time: float | None) -> Verdict:
    start = time.monotonic()
    judged = replay_in(python, local_archive(rep.location), backend=backend, timeout=max_time)
    status = _STATUS.get(judged.verdict)
    if status is None:
        status = TIMED_OUT if "--max-time" in (judged.reason or "") else ERROR
    observed = recorded if status == REPRODUCED else judged.reason if status == DIFFERENT else None
    return Verdict(format=VERDICT_FORMAT, action="replay", archive=rep.digest, environment=env.digest,
                   status=status, exit_code=judged.exit_code, message=(judged.reason or "")[:300],
                   signature=observed, elapsed_s=round(time.monotonic() - start, 3), finished=now())
