"""``bisect torch``: replay one archive under several Python environments, given in order, and
name the first one where the recorded failure appears (by default a binary search:
``environment_search``).

Each environment is an interpreter (a path), or a torch (a version, a requirement, a wheel file)
whose environment is built with pip and cached (``torch_builds``). It is asked what it has
(``env_probe``: Python, torch, ``torch.version.git_version``, reproarchive) and then replays the
archive with its own installed reproarchive (``reproarchive run ARCHIVE --json``), in a fresh
process whose ``PYTHONPATH`` is cleared so nothing of this process's imports leaks in. An
environment without a reproarchive replays with a copy of this reproarchive's own package (the
"bundled" reader: the same code, not a separate implementation; its dependencies must be
importable there), made in a folder of its own: never this environment's site-packages, which
would bring its torch.

Verdicts, from the replay's exit code *and* its JSON document (an exit status alone is not a
verdict: a reader that dies importing itself exits 1 too):

* good (0, a document that says passed), bad (1, one that says reproduced: the recorded
  failure's signature), different failure (3);
* cannot load here: that reader refuses the archive (a format or record too new for it: exit 2
  with an archive error), lacks the backend, device or an operator (125), or the environment
  cannot run a replay at all (no torch, a crash of the reader): skipped, as git bisect skips 125.

The first bad environment, and the last good one before it, give the torch commit range to
look at (their ``git_version``s). Without a good environment before the first bad one nothing
was compared, and the status says so (exit 3): no culprit is named.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from reproarchive.bisect.environment_search import BINARY, searched
from reproarchive.bisect.flakiness import measured
from reproarchive.bisect.nightlies import nightly_specs, parse_range
from reproarchive.bisect.nightlies import pip_options as nightly_pip_options
from reproarchive.bisect.results import (
    BAD,
    GOOD,
    OTHER,
    SKIPPED,
    EnvVerdict,
    Flakiness,
    TorchBisection,
    failed_of,
)
from reproarchive.bisect.torch_builds import (
    BuildError,
    build_environment,
    default_cache,
    pinned_packages,
    torch_requirement,
)
from reproarchive.errors import ReproArchiveError, SourceError
from reproarchive.format.reader import ContainerReader

_PROBE = Path(__file__).with_name("env_probe.py")
_PACKAGE = Path(__file__).resolve().parents[1]  # this reproarchive: the bundled reader is a copy of it
_CLI = "import sys; from reproarchive.cli import main; sys.exit(main())"
_CANNOT_LOAD_CODES = {"E_VERSION", "E_SCHEMA", "E_ARCHIVE", "E_CORRUPT", "E_UNSAFE", "E_LIMIT", "E_NOT_REPLAYABLE",
                      "E_BACKEND", "E_DEVICE"}
_PROBE_TIMEOUT = 120

VerdictFn = Callable[[EnvVerdict], None]


def bisect_torch(path: str | os.PathLike, interpreters: list[str], *, backend: str | None = None,
                 max_time: float | None = None, on_verdict: VerdictFn | None = None,
                 repeat: int | None = None, torch_specs: tuple[str, ...] = (), env_cache: Path | None = None,
                 on_build: Callable[[str, Path], None] | None = None, nightlies: str | None = None,
                 index_url: str | None = None, search: str = BINARY) -> TorchBisection:
    """Replay the archive at ``path`` under each interpreter in ``interpreters``, in order; see
    the module docstring. ``torch_specs`` instead names each environment by its torch (a version,
    a requirement or a wheel file): it is built with pip under ``env_cache`` and reused
    (``torch_builds``; ``on_build`` is told before a build); ``nightlies`` (``FROM..TO``) adds the
    nightly builds of that date range after them, found on ``index_url`` (``nightlies``).
    ``search``: ``BINARY`` replays about log2(n) + 2 of them, ``LINEAR`` every one
    (``environment_search``). ``backend`` is passed to each replay
    as ``--backend``; ``repeat`` replays each environment up to that many times (``_repeated``);
    None (the default) chooses it from the failure's measured flakiness (``flakiness``).
    Raises SourceError (exit 4) when the archive or an interpreter is missing."""
    archive = _checked(path, interpreters, torch_specs, repeat, nightlies)
    nightly = nightly_specs(nightlies, index_url) if nightlies else ()
    torch_specs = (*torch_specs, *nightly)
    started = time.monotonic()
    deadline = None if max_time is None else started + max_time
    environments = [(python, None) for python in interpreters] + [(None, spec) for spec in torch_specs]
    pins = pinned_packages(_recorded_packages(archive)) if torch_specs else ()
    out_of_time: list[bool] = []
    with tempfile.TemporaryDirectory(prefix="reproarchive-bundle-") as bundle:
        def evaluate(i: int) -> EnvVerdict | None:
            """The i-th environment, built if need be, replayed in."""
            if deadline is not None and deadline - time.monotonic() <= 0:
                out_of_time.append(True)
                return None
            python, spec = environments[i]
            if spec is not None:
                options = nightly_pip_options(index_url) if spec in nightly else ()
                python, verdict = _built(spec, env_cache or default_cache(), pins, on_build, options)
            if python is not None:
                verdict = _judge(python, archive, backend, bundle=Path(bundle), repeat=repeat or 1, deadline=deadline,
                                 timeout=None if deadline is None else deadline - time.monotonic())
                verdict = dataclasses.replace(verdict, built_from=spec)
            if on_verdict is not None:
                on_verdict(verdict)
            return verdict

        judged = searched(len(environments), evaluate, search)
        verdicts = [judged[i] for i in sorted(judged)]
        status = "incomplete" if out_of_time else "done"
        flakiness = None
        if repeat is None and status == "done":
            def replay_more(verdict: EnvVerdict, n: int) -> EnvVerdict | None:
                if deadline is not None and deadline - time.monotonic() <= 0:
                    return None
                until = "all" if verdict.verdict == BAD else "bad"  # measure a rate; or look for a failure
                return _judge(verdict.python, archive, backend, bundle=Path(bundle), repeat=n, deadline=deadline,
                              timeout=None if deadline is None else deadline - time.monotonic(), until=until)

            verdicts, flakiness = measured(verdicts, replay_more)
    return _result(str(archive), verdicts, status, round(time.monotonic() - started, 3), flakiness)


def _checked(path: str | os.PathLike, interpreters: list[str], torch_specs: tuple[str, ...],
             repeat: int | None, nightlies: str | None) -> Path:
    """The archive's absolute path, once every argument is checked (nothing is built before)."""
    if repeat is not None and repeat < 1:
        raise ReproArchiveError(f"--repeat {repeat}: an environment needs at least one replay",
                                "give --repeat 1 or more")
    archive = Path(path).resolve()
    if not archive.is_file():
        raise SourceError(f"{path} does not exist or is not a file", "give the path of an archive")
    if nightlies:
        parse_range(nightlies)  # its dates, before pip is asked what it serves
    if interpreters and (torch_specs or nightlies):
        raise ReproArchiveError("environments given both as interpreters (--env) and as torch versions (--torch)",
                                "give them one way, in the order to bisect")
    if not interpreters and not torch_specs and not nightlies:
        raise ReproArchiveError("no environment to replay in",
                                "give one or more --env PATH-TO-PYTHON, or --torch VERSION")
    for python in interpreters:
        if not is_interpreter(python):
            raise SourceError(f"{python} is not an executable interpreter", "give the path of a python in each --env")
    for spec in torch_specs:
        torch_requirement(spec)  # a spec that names no torch is refused before anything is built
    return archive


def _built(spec: str, cache: Path, pins: tuple[str, ...], on_build: Callable[[str, Path], None] | None,
           pip_options: tuple[str, ...] = ()) -> tuple[str | None, EnvVerdict | None]:
    """(the interpreter built for ``spec``, None), or (None, the verdict of an environment that
    could not be built: skipped, since it says nothing of torch)."""
    try:
        return str(build_environment(spec, cache=cache, pins=pins, on_build=on_build,
                                     pip_options=pip_options).python), None
    except BuildError as err:
        return None, EnvVerdict(python=spec, python_version=None, torch=None, git_version=None, reader="none",
                                verdict=SKIPPED, exit_code=None, seconds=0.0, built_from=spec,
                                reason=f"the environment could not be built: {err.what}")


def _recorded_packages(archive: Path) -> dict[str, str | None]:
    """The package versions the archive records (none when it cannot be read here: its replay
    will say why)."""
    try:
        with ContainerReader(archive) as reader:
            system = reader.index.records.system
    except (ReproArchiveError, OSError):
        return {}
    return dict(system.packages or {}) if system is not None else {}


def is_interpreter(path: str) -> bool:
    """Whether ``path`` is an executable file: what an environment given by its interpreter must be."""
    return os.path.isfile(path) and os.access(path, os.X_OK)


def probe_environment(python: str) -> tuple[dict | None, str | None]:
    """(what the interpreter ``python`` has: python, torch, git_version, reproarchive; or None,
    why it cannot say), asked in a fresh process of its own."""
    with tempfile.TemporaryDirectory(prefix="reproarchive-env-") as cwd:
        return _probe(python, cwd)


def replay_in(python: str, archive: str | os.PathLike, *, backend: str | None = None,
              timeout: float | None = None) -> EnvVerdict:
    """One replay of ``archive`` under the interpreter ``python``, judged as ``bisect torch``
    judges an environment (its own reproarchive, or a copy of this one), for another command
    that asks "and on that torch?" (``triage --against``)."""
    with tempfile.TemporaryDirectory(prefix="reproarchive-bundle-") as bundle:
        return _judge(python, Path(archive).resolve(), backend, timeout=timeout, bundle=Path(bundle))


def _bundled(folder: Path) -> Path:
    """``folder`` holding a copy of this reproarchive, its CLI as ``reproarchive.cli`` (where it
    lives in the tree or in site-packages), and nothing else (made once)."""
    target = folder / "reproarchive"
    if not target.exists():
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        shutil.copytree(_PACKAGE, target, ignore=ignore)
        if not (target / "cli").exists():  # in the tree (an editable install) it is the top-level cli/
            shutil.copytree(_PACKAGE.parent / "cli", target / "cli", ignore=ignore)
    return folder


def _environment(bundle: Path | None) -> dict[str, str]:
    """This process's environment without the paths that would make another interpreter import
    this process's packages (only the bundled reader's folder, when it is used)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    if bundle is not None:
        env["PYTHONPATH"] = str(bundle)
    return env


def _judge(python: str, archive: Path, backend: str | None, *, timeout: float | None, bundle: Path,
           repeat: int = 1, deadline: float | None = None, until: str = "answer") -> EnvVerdict:
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="reproarchive-env-") as cwd:
        facts, problem = _probe(python, cwd)
        facts = facts or {}
        base = dict(python=python, torch=facts.get("torch"), git_version=facts.get("git_version"),
                    python_version=facts.get("python"))
        if problem is not None or facts.get("torch_error"):
            return EnvVerdict(**base, reader="none", verdict=SKIPPED, exit_code=None,
                              reason=problem or f"torch cannot be imported: {facts['torch_error']}",
                              seconds=round(time.monotonic() - start, 3))
        installed = facts.get("reproarchive")
        reader = (f"installed reproarchive {facts.get('reproarchive_version') or '?'} ({installed})" if installed
                  else "bundled: a copy of this reproarchive's code")
        argv = [python, "-c", _CLI, "run", str(archive), "--json", "--quiet"]
        if backend:
            argv += ["--backend", backend]
        env = _environment(None if installed else _bundled(bundle))

        def replay(left: float | None) -> tuple[str, str | None, int | None]:
            try:
                done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, errors="replace",
                                      timeout=left, stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired:
                return SKIPPED, "--max-time ran out during this replay", None
            return (*_verdict(done.returncode, done.stdout, done.stderr), done.returncode)

        verdict, reason, code, replays = _repeated(replay, repeat, timeout, deadline, until)
    return EnvVerdict(**base, reader=reader, verdict=verdict, exit_code=code, reason=reason,
                      seconds=round(time.monotonic() - start, 3), replays=replays)


def _repeated(replay: Callable[[float | None], tuple[str, str | None, int | None]], repeat: int,
              timeout: float | None, deadline: float | None,
              until: str = "answer") -> tuple[str, str | None, int | None, tuple[str, ...]]:
    """One environment's verdict from up to ``repeat`` replays. A failure that shows once is
    there (bad, however many replays passed: syzkaller's rule), and the replays' disagreement is
    kept so the report can say flaky. Replaying stops once more could not change the answer: an
    environment that cannot replay at all, or one seen both good and bad. ``until``: "answer"
    (that), "bad" (also at the first failure: replays looking for one) or "all" (only when it
    cannot replay: replays measuring a failure rate)."""
    runs: list[tuple[str, str | None, int | None]] = []
    for i in range(repeat):
        left = timeout if i == 0 or deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            break
        runs.append(replay(left))
        seen = {v for v, _, _ in runs}
        if SKIPPED in seen or (until == "answer" and {GOOD, BAD} <= seen) or (until == "bad" and BAD in seen):
            break
    if not runs:
        return SKIPPED, "--max-time ran out before this replay", None, ()
    verdicts = tuple(v for v, _, _ in runs)
    chosen = next((r for r in runs if r[0] == BAD), None)
    if chosen is None and len(set(verdicts)) > 1:
        kinds = ", ".join(dict.fromkeys(verdicts))
        return SKIPPED, f"the replays disagreed ({kinds}): no verdict", runs[-1][2], verdicts
    verdict, reason, code = chosen or runs[0]
    if verdict == BAD and GOOD in verdicts:  # a pass and a failure: flaky (a later timeout is not a pass)
        reason = f"flaky: {failed_of(verdicts)}"
    return verdict, reason, code, verdicts


def _probe(python: str, cwd: str) -> tuple[dict | None, str | None]:
    try:
        done = subprocess.run([python, str(_PROBE)], cwd=cwd, env=_environment(None), capture_output=True,
                              text=True, errors="replace", timeout=_PROBE_TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, f"the interpreter did not answer within {_PROBE_TIMEOUT}s"
    lines = done.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1]), None
    except (IndexError, ValueError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"the interpreter cannot run ({tail[:200]})"


def _verdict(code: int, stdout: str, stderr: str) -> tuple[str, str | None]:
    """The verdict of one replay from its exit code and ``--json`` document."""
    try:
        document = json.loads(stdout)
    except ValueError:
        document = None
    error = document.get("error") if isinstance(document, dict) else None
    said = document.get("status") if isinstance(document, dict) else None
    if code == 0 and said == "passed":
        return GOOD, None
    if code == 1 and said == "reproduced":
        return BAD, None
    if code == 125 and said == "inconclusive":  # it passed, but not as recorded: no evidence either way
        return SKIPPED, "inconclusive: " + "; ".join(document.get("unfaithful") or [])[:300]
    if code == 3 and said == "different failure":
        observed = (document or {}).get("observed") or {}
        return OTHER, str(observed.get("signature") or "") or None
    if isinstance(error, dict):
        why = str(error.get("message") or "")[:300]
        if error.get("code") in _CANNOT_LOAD_CODES or code == 125:
            return SKIPPED, f"cannot load here: {why}"
        return SKIPPED, f"the replay could not run ({error.get('code')}): {why}"
    tail = (stderr.strip().splitlines() or ["no output"])[-1][:300]
    return SKIPPED, f"the replay ended with exit status {code} without a verdict ({tail})"


def _result(archive: str, verdicts: list[EnvVerdict], status: str, seconds: float,
            flakiness: Flakiness | None = None) -> TorchBisection:
    first_bad = next((i for i, v in enumerate(verdicts) if v.verdict == BAD), None)
    last_good = None
    if first_bad is not None:
        last_good = next((i for i in range(first_bad - 1, -1, -1) if verdicts[i].verdict == GOOD), None)
    commit_range = None
    if first_bad is not None and last_good is not None:
        good, bad = verdicts[last_good].git_version, verdicts[first_bad].git_version
        if good and bad and good != bad:
            commit_range = f"{good}..{bad}"
    if status == "done":
        status = ("no bad environment" if first_bad is None else "found" if last_good is not None
                  else "no good environment before the first bad one")
    return TorchBisection(
        archive=archive, status=status, verdicts=tuple(verdicts),
        first_bad=verdicts[first_bad].python if first_bad is not None else None,
        last_good=verdicts[last_good].python if last_good is not None else None,
        commit_range=commit_range, seconds=seconds, python=sys.version.split()[0], flakiness=flakiness)
