"""``bisect compiler``: which compiler stage, pass or lowering makes an archive fail.

PyTorch's own ``torch._inductor.compiler_bisector.CompilerBisector`` does the search (backends
eager -> aot_eager -> aot_eager_decomp_partition -> inductor, then each backend's subsystems,
then a binary search over one subsystem's applications); this module gives it a test, the
archive's replay, and keeps its state private:

* every replay runs in a child process (``compiler_child``) that gets the bisector's state the
  way ``compiler_bisector run`` hands it to its command (``TORCH_BISECT_*`` variables), so a
  crash is a verdict and nothing the compiler does stays in this process; the children are
  forked from one ``ForkServer`` per bisection, which has imported torch under the archive's
  environment, so each replay is fresh without paying the imports again;
* the state folder is a fresh temporary folder per bisection, set as the bisector's
  ``in_process_cache`` before it starts (so its opening ``delete_bisect_status`` cannot touch
  the user's ``<inductor cache>/bisect``) and removed afterwards, whatever happened; the
  bisector's class state (enabled flag, folder, counters) is put back as it was;
* the verdict is the replay's: "bad" only when the recorded failure's strict signature
  appears; a different failure counts as "not the recorded failure" for the search (as a pass
  would), and the result says how many steps saw one.

The bisector keeps its state on its class, so one process runs one bisection at a time
(``_ONE_AT_A_TIME``); separate processes each have their own folder and run side by side.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

import torch

from reproarchive.bisect import config_flags
from reproarchive.bisect.compiler_child import CONFIG_CHANGE_BACKEND, FLAGS_ENV, WRAPPED_ENV
from reproarchive.bisect.results import BAD, GOOD, OTHER, SKIPPED, BisectStep, CompilerBisection, Trial
from reproarchive.child import ForkServer
from reproarchive.compat import inductor
from reproarchive.context.environment import child_environment
from reproarchive.errors import BackendUnavailableError, ReproArchiveError
from reproarchive.replay.isolation import child_outcome
from reproarchive.replay.outcome import DIFFERENT, REPRODUCED
from reproarchive.replay.prepared import prepared
from reproarchive.replay.settings import ReplaySettings

_CHILD = "reproarchive.bisect.compiler_child"
BISECT_VARIABLES = ("TORCH_BISECT_BACKEND", "TORCH_BISECT_SUBSYSTEM", "TORCH_BISECT_MAX")
_ONE_AT_A_TIME = threading.Lock()

StepFn = Callable[[BisectStep], None]


class _OutOfTime(Exception):
    """--max-time ran out: raised through PyTorch's loop, caught by ``bisect_compiler``."""


def bisect_compiler(path: str | os.PathLike, settings: ReplaySettings | None = None, *,
                    max_time: float | None = None, on_step: StepFn | None = None,
                    first_backend: str | None = None, config_only: bool = False,
                    repeat: int = 1) -> CompilerBisection:
    """Find the compiler stage that makes the archive at ``path`` fail, and which recorded
    non-default Inductor settings it needs (``config_flags``); see the module docstring.

    ``settings``: the replay's settings (backend None: the archive's; a recorded custom
    ``module:function`` must be named to be run, as for ``run``). That backend replays at
    PyTorch's "inductor" stage; the earlier stages replay with PyTorch's named backends.
    ``first_backend`` starts the search at that stage, taking the earlier ones as good without
    replaying them (said in the steps). ``config_only``: no stage search, only the settings
    (status "found" when some are needed). ``on_step`` hears of each replay as it ends.
    ``repeat``: for a flaky failure, each step replays up to that many times, one failure
    making it bad.
    Raises BackendUnavailableError (125) when the archive's backend is missing here, and
    ArchiveError (2) for an unreadable archive; interrupts propagate after the state folder
    is removed.
    """
    settings = settings or ReplaySettings()
    for name in BISECT_VARIABLES:
        if os.environ.get(name):
            raise ReproArchiveError(f"{name} is set in this environment, which would steer PyTorch's bisector",
                                    f"unset {name} and run again")
    backends = inductor.bisector_backends()
    if first_backend is not None and first_backend not in backends:
        raise ReproArchiveError(f"{first_backend!r} is not one of PyTorch's bisection backends",
                                f"use one of: {', '.join(backends)}")
    facts = _archive_facts(path, settings)
    search = _Search(path, settings, facts, max_time=max_time, on_step=on_step, first_backend=first_backend,
                     repeat=repeat)
    with _ONE_AT_A_TIME, search.private_state() as log, search.children:
        if config_only:
            return search.config_only(log)
        status = "found"
        try:
            found = inductor.run_bisector(search.test)
        except BaseException as exc:
            # do_bisect's own cleanup runs when its frame goes: now, while the state folder is
            # still the private one (later, it would delete the user's <cache>/bisect)
            traceback.clear_frames(exc.__traceback__)
            if not isinstance(exc, _OutOfTime):
                raise
            found, status = None, "incomplete"
        if found is None and status == "found":
            status = "not reproduced"
        debug_info = found.debug_info if found else None
        flags = None
        if found is not None and found.backend == "inductor":
            try:
                flags = search.flags()
            except _OutOfTime:
                flags = config_flags.FlagSearch(status="not searched", reason="--max-time ran out before the "
                                                "recorded settings were searched")
    return search.result(found, status, debug_info, log.getvalue().splitlines(), flags=flags)


def _archive_facts(path, settings: ReplaySettings) -> dict:
    """The archive's digest, recorded environment and device plan, and the backend that
    replays at the "inductor" stage (checked here: 125 before any replay when missing)."""

    ready = prepared(path, settings, here=False)  # every replay is a child's, which prepares its own
    return {"settings": ready.settings, "plan": ready.plan, "environment": ready.records.environment,
            "digest": ready.digest, "config": None if ready.settings.current_config else ready.records.config}


class _Search:
    """The test PyTorch's bisector calls, and what it saw."""

    def __init__(self, path, settings, facts, *, max_time, on_step, first_backend, repeat=1):
        self.path = os.fspath(os.path.abspath(path))
        self.settings: ReplaySettings = facts["settings"]
        self.facts = facts
        self.deadline = None if max_time is None else time.monotonic() + max_time
        self.on_step = on_step
        self.first_backend = first_backend
        self.repeat = max(1, repeat)
        self.steps: list[BisectStep] = []
        self.started = time.monotonic()
        self.state: str | None = None
        self.children = _Children(child_environment(facts["environment"]))

    # --- the bisector's state, private to this bisection ---------------------------------

    @contextlib.contextmanager
    def private_state(self):
        """A fresh state folder set as the bisector's; its class state put back afterwards.
        Yields the buffer PyTorch's progress messages are printed into."""
        self.state = tempfile.mkdtemp(prefix=f"reproarchive-bisect-{os.getpid()}-")
        log = io.StringIO()
        self.stdout = sys.stdout
        try:
            with inductor.bisector_state_in(self.state), contextlib.redirect_stdout(log):
                yield log
        finally:
            shutil.rmtree(self.state, ignore_errors=True)

    # --- the test ----------------------------------------------------------------------------

    def test(self) -> bool:
        """One replay under the bisector's current state: True when the recorded failure does
        not appear (PyTorch's "good")."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise _OutOfTime()
        stage, subsystem, state, bounds = inductor.bisector_position()
        trial = self.trial(stage, subsystem, state)
        start = time.monotonic()
        replayed = not self._before_first(stage)
        verdict, observed = self._replayed(trial) if replayed else (GOOD, None)
        step = BisectStep(backend=stage, subsystem=subsystem, state=state, bisect_range=bounds, trial=trial,
                          verdict=verdict, observed=observed, seconds=round(time.monotonic() - start, 3),
                          replayed=replayed)
        self.steps.append(step)
        if self.on_step is not None:
            with contextlib.redirect_stdout(self.stdout):  # the caller's output is not PyTorch's log
                self.on_step(step)
        return verdict != BAD

    def _before_first(self, stage: str) -> bool:
        names = inductor.bisector_backends()
        return self.first_backend is not None and names.index(stage) < names.index(self.first_backend)

    def trial(self, stage: str, subsystem: str | None, state: str | None) -> Trial:
        """The settings PyTorch's ``compiler_bisector run`` would hand its command now."""
        env = {"TORCH_BISECT_BACKEND": stage}
        config: dict[str, str] = {}
        if subsystem:
            env["TORCH_BISECT_SUBSYSTEM"] = subsystem
            if state == "test_disable":
                env["TORCH_BISECT_MAX"] = "-1"  # every application off
            change = _config_change(stage, subsystem)
            if change is not None:
                field, value = change
                config[f"torch._inductor.config.{field}" if stage == "inductor" else
                       f"torch._functorch.config.{field}"] = repr(value)
        return Trial(backend=self.stage_backend(stage), env=env, config=config)

    def stage_backend(self, stage: str) -> str:
        """PyTorch's backend for ``stage``, except at "inductor", the last stage, where the
        archive's own backend replays when it is not one of the stages (a custom
        ``module:function`` built on inductor, an out-of-tree backend)."""
        chosen = self.settings.backend
        if stage == "inductor" and chosen not in inductor.bisector_backends():
            return chosen
        return stage

    # --- the recorded settings (``config_flags``) ---------------------------------------------

    def flags(self) -> config_flags.FlagSearch:
        """Which recorded non-default Inductor settings the failure needs, its stage known to be
        inductor (the stage search's last bad replay ran with all of them)."""
        if self.facts["config"] is None:
            return config_flags.FlagSearch(status="not searched", reason="replayed with --current-config: no "
                                           "recorded setting was applied")
        found, left = config_flags.searchable(self.facts["config"])
        return config_flags.search(found, left, self._gone_without)

    def _gone_without(self, flags) -> bool:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise _OutOfTime()
        defaults = {key: value for _, key, value in flags}
        trial = Trial(backend=self.settings.backend, env={}, config={f.setting: f.default for f, _, _ in flags})
        start = time.monotonic()
        verdict, observed = self._replayed(trial, defaults=defaults)
        state = f"{len(flags)} at their defaults" if flags else "as recorded"
        step = BisectStep(backend="inductor", subsystem="recorded settings", state=state,
                          bisect_range=None, trial=trial, verdict=verdict, observed=observed,
                          seconds=round(time.monotonic() - start, 3), replayed=True)
        self.steps.append(step)
        if self.on_step is not None:
            with contextlib.redirect_stdout(self.stdout):
                self.on_step(step)
        return verdict != BAD

    def config_only(self, log) -> CompilerBisection:
        """``bisect compiler --config-only``: one replay as recorded (it must fail), then the
        settings' search; no stage search."""
        try:
            reproduced = not self._gone_without([])
            flags = self.flags() if reproduced else None
        except _OutOfTime:
            return self.result(None, "incomplete", None, log.getvalue().splitlines())
        status = "not reproduced" if not reproduced else "found" if flags.status == "needed" else "no setting needed"
        return self.result(None, status, None, log.getvalue().splitlines(), flags=flags)

    def _replayed(self, trial: Trial, defaults: dict | None = None) -> tuple[str, str | None]:
        """Up to ``repeat`` replays, the first that shows the recorded failure ending them: a
        flaky failure that passed one replay by luck would move the search past its culprit."""
        for _ in range(self.repeat):
            verdict, observed = self._replay(trial, defaults=defaults)
            if verdict == BAD:
                break
        return verdict, observed

    def _replay(self, trial: Trial, defaults: dict | None = None) -> tuple[str, str | None]:
        env = dict(trial.env)
        backend = trial.backend
        if defaults:
            env[FLAGS_ENV] = json.dumps(defaults)
        if (trial.config and trial.env.get("TORCH_BISECT_BACKEND") == "inductor") or defaults:
            env[WRAPPED_ENV] = backend  # the config change is applied inside the recorded config
            backend = CONFIG_CHANGE_BACKEND
        request = {"path": self.path, "state": self.state,
                   "settings": self.settings.replace(backend=backend).to_plain(),
                   "plan": self.facts["plan"].to_plain()}
        try:
            result, died = self.children.run(request, env)
        except BackendUnavailableError:
            if trial.backend == self.settings.backend:
                raise  # the archive's own backend is missing in the child: nothing to bisect
            return SKIPPED, None  # this torch lacks one of PyTorch's stage backends
        outcome = child_outcome(self.path, result, died)
        observed = outcome.observed.signature if outcome.observed is not None else None
        if outcome.status == REPRODUCED:
            return BAD, observed
        return (OTHER if outcome.status == DIFFERENT else GOOD), observed

    # --- the result --------------------------------------------------------------------------

    def result(self, found, status: str, debug_info: str | None, log: list[str], *,
               flags: config_flags.FlagSearch | None = None) -> CompilerBisection:
        appear, disappear = self._around(found) if found is not None else (None, None)
        return CompilerBisection(
            archive=self.path, digest=self.facts["digest"], torch=torch.__version__, status=status,
            backend=found.backend if found else None, subsystem=found.subsystem if found else None,
            bisect_number=found.bisect_number if found and found.subsystem else None,
            debug_info=debug_info, replayed_backend=self.settings.backend, appear=appear, disappear=disappear,
            steps=tuple(self.steps), replays=sum(1 for s in self.steps if s.replayed),
            other_failures=sum(1 for s in self.steps if s.verdict == OTHER),
            seconds=round(time.monotonic() - self.started, 3), pytorch_log=tuple(log), config_flags=flags)

    def _around(self, found) -> tuple[Trial, Trial | None]:
        """The settings that make the failure appear and disappear at the culprit.

        A bisected subsystem: its applications up to the bisect number on
        (``TORCH_BISECT_MAX=N``) fail, up to the one before it pass. A config change: without it
        the failure appears, with it it is gone. A backend alone: it fails, the backend
        before it passes."""
        stage, subsystem = found.backend, found.subsystem
        base = {"TORCH_BISECT_BACKEND": stage}
        backend = self.stage_backend(stage)
        if subsystem is None:
            names = inductor.bisector_backends()
            before = names[names.index(stage) - 1] if names.index(stage) > 0 else None
            return (Trial(backend=backend, env={}, config={}),
                    Trial(backend=self.stage_backend(before), env={}, config={}) if before else None)
        if _config_change(stage, subsystem) is not None:  # a config value, not an env variable, makes it go
            return Trial(backend=backend, env={}, config={}), Trial(
                backend=backend, env={}, config=self.trial(stage, subsystem, "test_disable").config)
        number = found.bisect_number
        env = {**base, "TORCH_BISECT_SUBSYSTEM": subsystem}
        return (Trial(backend=backend, env={**env, "TORCH_BISECT_MAX": str(number)}, config={}),
                Trial(backend=backend, env={**env, "TORCH_BISECT_MAX": str(number - 1)}, config={}))


class _Children:
    """The bisection's ``ForkServer``, started at its first replay (a search that replays
    nothing starts none) under the archive's environment, and closed with the search."""

    def __init__(self, environment: dict[str, str]):
        self.environment = {k: v for k, v in environment.items() if k not in BISECT_VARIABLES}
        self.server: ForkServer | None = None

    def run(self, request: dict, env: dict[str, str]):
        if self.server is None:
            self.server = ForkServer(_CHILD, env=self.environment)
        return self.server.run(request, env=env)

    def __enter__(self) -> _Children:
        return self

    def __exit__(self, *exc) -> None:
        if self.server is not None:
            self.server.close()


def _config_change(stage: str, subsystem: str) -> tuple[str, object] | None:
    return inductor.bisector_config_change(stage, subsystem)


def state_folders(pid: int | None = None) -> list[Path]:
    """Bisection state folders of this machine's running bisections, or of the process ``pid``'s
    only (a test compares its own: another process may be bisecting at the same time)."""
    mine = "*" if pid is None else f"{pid}-*"
    return sorted(Path(tempfile.gettempdir()).glob(f"reproarchive-bisect-{mine}"))
