"""The capture backend: a torch.compile backend that turns its own failure into an archive.

    model = torch.compile(model, backend=reproarchive.capture("inductor"))

PyTorch's after_dynamo/after_aot dumps need env vars set before the run, write scripts with
absolute paths, and for compile errors and most runtime errors have no real input data (fake
tensors). Capture sits where the data still is: Dynamo hands a backend the real example inputs
before the graph has run, so on a failure we store the graph as Dynamo traced it, those inputs
bit for bit, the config, environment, system and the failure, in one file.

What it does for each graph Dynamo hands it:

1. Copies the graph structure (not the tensors): backends may rewrite the graph in place
   (PyTorch's ``relu_*_TESTING_ONLY`` injectors do), and the archive must hold the graph as
   Dynamo traced it. Takes the config snapshot (the config this graph is compiled with).
2. Compiles it with the real backend. An exception: stage ``compile``; the archive holds
   Dynamo's example inputs, which nothing has run on yet. The exception leaves the backend, so
   Dynamo wraps it as usual (``BackendCompilerFailed`` / ``InductorError``).
3. Unless ``check_runtime=False``: returns the compiled function behind a thin wrapper
   (``call_guard``) whose first call is the check: it runs once, on the real arguments, and
   an exception from it is stage ``forward``. Where it made a backward the backend compiled
   (AOTAutograd's, as ``aot_eager``'s and Inductor's are: an ``autograd.Function``), that
   backward is compiled and run by the program's own ``backward()``, and watched there
   (``backward_watch``): an exception from it is stage ``backward``, archived with the inputs
   as they were before the call and the generator states the call started from, and raised in
   the program's ``backward()`` as without capture; no step of ours runs before the call. Only
   the first call's backward is watched, once. Where the backend runs the graph itself
   (``eager``, a backend that only rewrites the graph: ``call_guard.runs_the_graph``) the
   backward is PyTorch's derivatives; should the outputs show an ``autograd.Function``'s
   backward after all (or a compiled backward that cannot be watched), that backward is
   checked once the call has ended, on its inputs as they were before it (copies of the
   written ones) and from the generator states it started from. A check run *before* the
   first call, on the real arguments (aliases of those the graph does not write, copies of
   those it writes: ``replay.input_writes``), forward and, when an output requires grad,
   backward of a scalar loss (as PyTorch's ``run_fwd_maybe_bwd``; ``fwd_only=True`` skips
   backward), remains for two cases: ``accuracy=True``, where the run is compared with eager
   and an fp64 reference (``replay.accuracy``, PyTorch's rule: stage ``accuracy``); and
   ``spool=False``, whose crash record is a whole archive that cannot be set aside while the
   program runs between the call and its backward. That check runs at the first call and not
   inside the backend because inside the backend Dynamo's compile context is still open and a
   backward would compile AOTAutograd's backward graph nested in it (which torch 2.13 rejects);
   at the first call the arguments are the real inputs, still untouched.
4. On a failure: writes the archive (graph, the real inputs, snapshots, failure record) and
   re-raises the ORIGINAL exception, same type, with the archive path appended to its message
   (a note where the message cannot be changed; ``exc.reproarchive_path`` and
   ``archive_path(exc)`` give it to programs). Runtime failures surface at the user's call, as
   they would without capture. An accuracy failure raises PyTorch's ``AccuracyError`` (or only
   warns with ``on_accuracy="warn"``).
5. Otherwise the compiled function runs exactly as without capture. Every later call is
   covered too: the wrapper copies the inputs the graph writes (usually none), calls, and
   only when the call raises archives that call's inputs as they were before it (stage
   ``forward``) and re-raises; a failure it cannot archive is said on stderr.

Native crashes: a segfault, an abort from the C++ runtime or a fatal device assert ends the
process inside step 3, where nothing can be written any more. So, unless ``crash=False``, the
archive a crash would leave is prepared *before* the first run, with a ``crash`` failure whose
signal is not yet known (spec §8), and dropped when the run ends any other way (passed, raised,
interrupted; a raised failure then writes its own archive). By default (``spool=True``) it is
kept in the process's spool (``process_spool``): drafted while the backend compiles, each
storage written once per process however many graphs share it, in the background at the lowest
priority, the first call waiting for none of it (a forked copy-on-write writer finishes what is
left if the call comes first). If the process dies, a guardian process (``spool_guardian``)
completes the entry into the archive, ``repro-<hash>.tar.zst`` as below, within a second of
the death, with the signal and the crashing thread's stack faulthandler reported as it died
(unless the program turned faulthandler on itself, or nothing could report: ``SIGKILL``), and
pushes it to ``store=`` when one is given. With ``spool=False`` the whole
archive is written before each first run instead (one full write per graph). Either way a
process that dies leaves an archive, complete and verifiable; ``reproarchive run`` replays it
in a child process and reports the signal and the crashing thread's stack.

Cost and side effects of the check, by design:

* no extra run by default: the first call is the check, and its compiled backward is the
  program's own, watched. With ``accuracy=True`` (or ``spool=False``) one extra forward
  (+ backward, where the backend compiled one) per graph, once, where an output requires grad,
  and for accuracy also an eager and an fp64 run. ``check_runtime="calls"``: the first call
  guarded like every other and crash-covered, but a failing backward (the program's own) is
  not archived; ``False``: compile errors only, nothing extra ever runs. A failing graph that calls custom
  ops runs once more, eagerly on copies of its inputs, to record their real outputs.
* memory: copies of the inputs the graph writes in place, as they were before the first call,
  kept until its watched backward has run (or its outputs are freed); a check run before the
  call (accuracy, ``spool=False``) holds them for one run, the
  other inputs (the parameters, since Dynamo passes them as inputs) are aliased, and a
  backward's gradients of them are as large as the program's own, freed and given back to the
  system (``call_guard.preserved_state``) before the real call, so its peak is the program's.
  The one exception is the check after a real call (a graph run by the backend itself whose
  outputs show an ``autograd.Function``'s backward): it runs beside that call's activations,
  one forward's more at its peak. Archived inputs are the
  real ones, not copies; where the inputs the graph writes are unknown (an operator without
  a fake kernel) their version counters are checked and an input changed before the archive
  was written is listed in the failure record (``inputs_modified``).
* user-visible state is restored after a check run: the RNG state (CPU and the CUDA devices involved), and the
  ``.grad`` and buffer values of any parameters the graph holds as attributes; the copies are
  leaves, so gradients never reach the user's tensors. A CUDA-graph backend sees one extra
  warm-up call. A native crash is guarded against on a graph's first call only; an exception
  on any call is archived.
* randomness: the archive holds the generator states (CPU, and the devices of the inputs) the
  failing call started from, and ``run`` restores them. With ``accuracy=True`` the check of a
  graph that draws random numbers compiles a copy of its own with inductor's
  ``fallback_random`` (``replay.accuracy.fair_to_randomness``), so that its dropout draws as
  eager's does and a correct graph is not an accuracy failure; the program's own compile is
  left as it would be without capture (its random ops draw with inductor's own RNG code, and
  its numbers are the program's), and the graph's ``training`` is never switched off.

Where archives go: ``path`` may be a file name (``*.tar.zst``, every failure of this backend
writes that one file) or a directory (created; archives are named
``repro-<12 hex digits>.tar.zst`` from a hash of the graph, the input metadata and the failure
signature, so the same failure captured twice overwrites one file rather than piling up).
Default: ``$REPROARCHIVE_DIR`` if set, else ``./reproarchives/`` in the working directory at the
time ``capture()`` is called.

Multi-rank jobs: on a rank of a torch.distributed job every rank writes its part and a failing
rank merges them into one archive for the job (``job_capture``).

Sharing: with ``store=`` (default ``$REPROARCHIVE_STORE``) every archive written is also pushed
to that store (an fsspec URL or a folder, ``reproarchive push``), so a CI job shares every
failure it sees. A push that fails is logged and noted on the exception, never raised in place
of the user's own failure; the archive stays on disk either way.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from reproarchive.archive.writing import Capture
from reproarchive.codec.device_runtime import RngState, devices_of
from reproarchive.codec.rng import random_ops, states_of
from reproarchive.codec.shape_guards import note_entry
from reproarchive.codec.shapes import policy_of
from reproarchive.compat import inductor
from reproarchive.context.config import config_snapshot
from reproarchive.format.schema import CaptureSource, ConfigRecord, FailureRecord
from reproarchive.replay import accuracy as _accuracy
from reproarchive.replay.input_writes import run_inputs
from reproarchive.replay.shape_policy import symbolic_compile
from reproarchive.sources.capture import gc_pause
from reproarchive.sources.capture.call_guard import (
    Ended,
    GraphWrites,
    backward_is_compiled,
    checked_after,
    guarded,
    is_control_flow,
    modified_inputs,
    outputs_cannot_require_grad,
    preserved_state,
    runs_the_graph,
    versions_of,
    watched_backward,
)
from reproarchive.sources.capture.capture_options import capture_settings, resolve_backend, resolve_target
from reproarchive.sources.capture.failure_archives import BackendArchives, CaptureWarning
from reproarchive.sources.capture.failure_notes import archive_path
from reproarchive.sources.capture.failure_records import capture_of, copy_graph_structure, write_archive  # noqa: F401
from reproarchive.sources.capture.job_calls import guarded_on_rank
from reproarchive.sources.capture.job_capture import note_compile, rank_context
from reproarchive.sources.capture.stack_room import with_frame_room
from reproarchive.sources.pack_report import PackReport, archive_report
from reproarchive.store.push import STORE_ENV


def capture(
    backend: str | Callable = "inductor",
    *,
    path: str | os.PathLike | None = None,
    accuracy: bool = False,
    store: str | None = None,
    **options: Any,
) -> Callable:
    """A torch.compile backend that compiles with ``backend`` and archives its failures.

    ``backend``: a name ``torch.compile`` accepts or a backend callable. ``path``: a directory
    or a ``.tar.zst`` file name (see the module docstring; default ``$REPROARCHIVE_DIR`` or
    ``./reproarchives/``). ``accuracy``: also compare the compiled result with eager.

    Options: ``fwd_only`` (bool, default False: run backward when an output requires grad),
    ``tolerance`` (float, default 1e-3, PyTorch's ``repro_tolerance``), ``check_runtime`` (True,
    the default: the first call is checked, and the backward it made where the backend compiled
    one, where the program runs it; with accuracy, a check run before it; ``"calls"``: never an
    extra run, every call guarded, a failing backward not archived,
    no accuracy; False: compile errors only, the graph never guarded),
    ``on_accuracy`` ("raise" | "warn"), ``use_fp64`` (bool, default True: fp64 reference for
    accuracy), ``crash`` (bool, default True: prepare the archive before the first run so that a
    native crash leaves one; see the module docstring), ``spool`` (bool, default True: prepare
    it in a process-wide spool, ``<path>/spool-<pid>``, written in the background, each storage
    once per process, the first call waiting for none of it; a guardian process completes it
    into the archive if the process dies. False: write each graph's whole archive before its
    first run), and for
    ``backend="inductor"`` the
    ``mode`` / ``options`` that torch.compile
    would take (they are applied while compiling and recorded in the config snapshot).

    The backend returned lists the archives it wrote: ``written`` (paths) and ``reports`` (one
    ``PackReport`` each, as ``capture --`` reports them).
    """
    settings = capture_settings(accuracy, options)
    compiler, name, config_patches = resolve_backend(backend, options.get("mode"), options.get("options"))
    target = resolve_target(path)
    backend_fn = _CaptureBackend(compiler, name, config_patches, target, settings,
                                 store if store is not None else (os.environ.get(STORE_ENV) or None))
    return backend_fn


# ---------------------------------------------------------------------------------------------


class _CaptureBackend(BackendArchives):
    """The callable handed to torch.compile. A class so that ``repr`` and ``__name__`` say what
    it wraps (Dynamo puts ``__name__`` in its error messages: ``backend='capture(inductor)'``)."""

    def __init__(self, compiler: Callable, name: str, config_patches: dict, target: Path, settings: dict,
                 store: str | None = None):
        self.compiler = compiler
        self.store = store
        self.pushed: list = []  # PushResult of each archive pushed to ``store``
        self.backend_name = name
        self.config_patches = config_patches
        self.target = target
        self.settings = settings
        self.__name__ = f"capture({name})"
        self.written: list[Path] = []  # archives this backend wrote, oldest first
        self._made_folder = False  # the folder of ``target`` was created for a pending archive

    def __repr__(self) -> str:
        return f"reproarchive.capture({self.backend_name!r}, path={str(self.target)!r})"

    @property
    def reports(self) -> list[PackReport]:
        """One ``PackReport`` per archive this backend wrote (``written``, each once, oldest
        first), read back from the archive's index as ``capture --`` reports the archives this
        backend writes in the program: what every capture source reports (``sources.source``).
        The failure is the program's own, so nothing was replayed."""
        return [archive_report(path, kind="capture", replay={"performed": False, "failure_from": "program"})
                for path in dict.fromkeys(self.written)]

    def rank_capture(self, gm: Any, inputs: list[Any], config: ConfigRecord, failure: FailureRecord,
                     custom_ops: list | None = None, rng_states: dict | None = None) -> Capture:
        """One rank's part of a multi-rank job (``job_capture``): this backend's records."""
        return capture_of(gm, inputs, config=config, failure=failure, backend=self.backend_name, accuracy=False,
                          capture_settings=self.settings, custom_ops=custom_ops, rng_states=rng_states)

    def __call__(self, gm: Any, example_inputs: Sequence[Any]) -> Any:
        example_inputs = list(example_inputs)
        with gc_pause.paused():  # capture's own work (``collector``)
            pristine_gm = copy_graph_structure(gm)
            note_entry(pristine_gm)  # the guards Dynamo made, before the compile adds its own
            versions = versions_of(example_inputs)
            in_job = rank_context() is not None
            if in_job:  # a rank of a multi-rank job: its collectives, in order
                note_compile(pristine_gm)

        with self._patched_config():
            with gc_pause.paused():
                config = config_snapshot()  # what this graph is compiled with (~7 ms)
                writes = GraphWrites(pristine_gm)  # found once: for the spool now, for the first call later
                # in a job, the rank's part written before the first call is the crash record
                spooled = None if in_job else self._spool_pending(pristine_gm, example_inputs, config, writes)
            try:
                # a few frames deeper than the plain compile: given room (``stack_room``); exactly the
                # program's compile (an accuracy check that needs another compiles its own copy)
                compiled = with_frame_room(self.compiler, gm, example_inputs)
            except Exception as exc:
                self._discard(spooled)
                if is_control_flow(exc):
                    raise
                self._fail(pristine_gm, example_inputs, modified_inputs(example_inputs, versions), exc, "compile",
                           config)
                raise
        if not self.settings["check_runtime"]:
            self._discard(spooled)
            return compiled
        return self._checked_on_first_call(compiled, gm, pristine_gm, config, spooled, writes)

    def _checked_on_first_call(self, compiled: Callable, gm: Any, pristine_gm: Any, config: ConfigRecord,
                               spooled: str | None = None, writes: GraphWrites | None = None) -> Callable:
        """Wrap ``compiled`` so that its first call is checked (before it runs for real,
        ``_checks_before_the_call``, or by it, and then what it did not run, a compiled backward,
        right after it: ``_checks_after_the_call``), and a failure of any call is archived
        (``call_guard``).

        The check cannot run inside the backend call: there Dynamo's compile context is still
        open, and a backward run would make AOTAutograd compile the backward graph nested in
        it (torch 2.13 then fails with "Metric(s) {'is_forward'} have already been set").
        At the first call the arguments are the real inputs, not yet touched: the check runs
        on them (copies of only the inputs the graph writes, aliases of the rest), and an
        archive holds them as they were.
        """
        writes = writes or GraphWrites(pristine_gm)
        # a first call that is its own check: the generator states before it, and the archive pending
        # for it (it covers that call, and goes when it ends: ``call_guard``)
        own_check: list[tuple[dict, Path | str | None]] = []

        def first_call(args: list[Any]) -> Ended | None:
            if self._checks_before_the_call(compiled, gm, args):
                self._check(compiled, gm, pristine_gm, args, config, writes.of(args), spooled)
                return None
            started = RngState.capture(devices_of(args))
            # a backward the backend compiled runs (and compiles) in the program's backward(),
            # watched there: the entry is finished now, not by a writer forked through it
            watches = self._watches_backward(compiled) and not outputs_cannot_require_grad(gm, args)
            pending = self._pending(pristine_gm, args, config, spooled, fork=not watches)
            own_check.append((states_of(started), pending))

            def check(before: list[Any], run_args: list[Any], rng: RngState) -> None:
                self._run_check(compiled, gm, pristine_gm, before, config, versions_of(before), writes.of(before),
                                run_args=run_args, rng=rng, rng_states=own_check[0][0], pending=pending)
            after = checked_after(writes, args, started, check, wanted=self._checks_after_the_call,
                                  then=lambda: self._discard(pending))
            if not watches:
                return after

            def ended(before: list[Any], out: Any) -> None:
                if out is None or writes.of(before) is None or not self._watch_backward(
                        pristine_gm, args, before, out, config, own_check[0][0], pending):
                    after(before, out)
            return ended

        if rank_context() is not None:  # a rank of a multi-rank job: its part is the crash record
            self._discard(spooled)
            if self.settings["accuracy"]:
                _no_accuracy_on_ranks()
            return guarded_on_rank(self, compiled, pristine_gm, config, writes)

        def failed(before: list[Any], exc: BaseException, call: int, rng: dict | None) -> tuple[Path | None,
                                                                                             str | None]:
            modified = list(getattr(exc, "reproarchive_inputs_modified", ()))
            rng_states, pending = own_check[0] if call == 1 and own_check else (None, None)
            if rng is not None:  # the states this call started from, not those it left
                rng_states = rng
            return self._fail(pristine_gm, before, modified, exc, _accuracy.stage_of(exc), config,
                              rng_states=rng_states, pending=pending)

        return guarded(compiled, writes, failed=failed, first_call=first_call, marker=self._marker(gm, spooled))

    def _checks_before_the_call(self, compiled: Callable, gm: Any, args: list[Any]) -> bool:
        """Whether the first call needs a check run before the real one: for accuracy, and where
        a whole archive is written before the first run (``spool=False``: no entry to set aside
        while the program runs between the call and its backward); not where that run would
        be the real call, nor where the backend runs the graph itself (its backward is
        PyTorch's: the real call is the check, ``_checks_after_the_call`` the rare exception),
        nor where the backward it compiled is watched in the program's own ``backward()``
        (``_watches_backward``), nor with ``check_runtime="calls"`` (module docstring)."""
        if self.settings["check_runtime"] == "calls":
            return False
        if self.settings["accuracy"]:
            return True
        return not (self.settings["fwd_only"] or outputs_cannot_require_grad(gm, args) or runs_the_graph(compiled)
                    or self._watches_backward(compiled))

    def _watches_backward(self, compiled: Callable) -> bool:
        """Whether a first call's compiled backward is left to the program's own ``backward()``,
        watched there (``backward_watch``), instead of a check run before the call: for a
        backend that compiles the graph (not one that runs it itself), without accuracy, and
        where the crash record is a spool entry (or none), which can be set aside meanwhile."""
        return (self.settings["check_runtime"] is True and not self.settings["accuracy"]
                and not self.settings["fwd_only"] and (self.settings["spool"] or not self.settings["crash"])
                and not runs_the_graph(compiled))

    def _watch_backward(self, pristine_gm: Any, args: list[Any], before: list[Any], out: Any, config: ConfigRecord,
                        rng_states: dict, pending: Path | str | None) -> bool:
        """Watch the compiled backward the first call on ``args`` made (its outputs ``out``):
        where the program runs it, its crash record is back on disk, and a failure is archived
        with the inputs as they were before the call (``before``) and the generator states it
        started from, then raised to the program as it was. False where there is nothing to
        watch (the caller then checks as before)."""
        versions = versions_of(before)
        return watched_backward(
            out, args, restore=lambda: self._restore(pending), set_aside=lambda: self._set_aside(pending),
            done=lambda: self._discard(pending),
            failed=lambda exc: self._fail(pristine_gm, before, modified_inputs(before, versions), exc, "backward",
                                          config, rng_states=rng_states, pending=pending))

    def _checks_after_the_call(self, out: Any) -> bool:
        """A first call that was its own check whose outputs' backward is compiled after all (a
        graph run by the backend itself that calls an ``autograd.Function``): that backward is
        checked once the call has ended, on its inputs as they were before it."""
        return self.settings["check_runtime"] is True and not self.settings["fwd_only"] and backward_is_compiled(out)

    def _check(self, compiled: Callable, gm: Any, pristine_gm: Any, args: list[Any], config: ConfigRecord,
               written: frozenset[int] | None, spooled: str | None) -> None:
        versions = versions_of(args)
        pending = self._pending(pristine_gm, args, config, spooled, fork=False)
        try:
            self._run_check(compiled, gm, pristine_gm, args, config, versions, written, pending=pending)
        finally:
            # The check ran to its end (passed, failed, or was interrupted): the process did
            # not crash, so the pending archive is not a record of anything.
            self._discard(pending)

    def _run_check(self, compiled: Callable, gm: Any, pristine_gm: Any, args: list[Any], config: ConfigRecord,
                   versions: list, written: frozenset[int] | None, *, run_args: list[Any] | None = None,
                   rng: RngState | None = None, rng_states: dict | None = None,
                   pending: Path | str | None = None) -> None:
        """The check run on ``args`` (``run_args``: the inputs made for it already; ``rng``: the
        generator states it starts from; ``rng_states``: those an archive of its failure holds,
        None: read when it is written; ``pending``: the archive a crash in it would leave)."""
        report = None
        try:
            with preserved_state(gm, args, rng=rng):
                if self.settings["accuracy"]:
                    report = _accuracy.check_accuracy(
                        pristine_gm, self._compiled_for_the_check(compiled, pristine_gm, args), args,
                        fwd_only=self.settings["fwd_only"], tol=self.settings["tolerance"],
                        use_fp64=self.settings["use_fp64"], written=written,
                    )
                else:
                    _accuracy.run_forward_backward(
                        compiled, run_inputs(args, written) if run_args is None else run_args,
                        fwd_only=self.settings["fwd_only"], seed="ones", backward_if=backward_is_compiled,
                    )
        except _accuracy.EagerFailed as exc:
            # The traced graph fails eagerly too: not this backend's bug. The real call below
            # will raise whatever it raises.
            warnings.warn(f"reproarchive.capture: accuracy not checked: {exc}", CaptureWarning, stacklevel=5)
            return
        except Exception as exc:
            if is_control_flow(exc):
                raise
            self._fail(pristine_gm, args, modified_inputs(args, versions), exc, _accuracy.stage_of(exc), config,
                       rng_states=rng_states, pending=pending)
            raise
        if report is not None and not report.passed:
            self._accuracy_failed(pristine_gm, args, modified_inputs(args, versions), report, config)

    def _compiled_for_the_check(self, compiled: Callable, pristine_gm: Any, args: list[Any]) -> Callable:
        """What the accuracy check compares with eager: the program's own compiled code, or,
        for a graph that draws random numbers, a copy compiled for the check alone under
        ``fair_to_randomness`` (the program's compile must not change for the check's sake)."""

        if not random_ops(pristine_gm):
            return compiled
        # compiled as Dynamo handed the graph over: in a fake mode of the compile's own shape policy
        # (the placeholders' fakes say it), not on the real inputs, which a compile takes as static
        # (a graph whose static compile fails, where the program's symbolic one does not, failed)
        policy = policy_of(pristine_gm, list(args))
        with gc_pause.paused(), _accuracy.fair_to_randomness(pristine_gm), ExitStack() as stack:
            copy = copy_graph_structure(pristine_gm)
            try:
                example = stack.enter_context(symbolic_compile(policy, copy, list(args), None))
            except Exception:  # noqa: BLE001 - inputs the policy cannot fakify: on the real ones, as before
                example = list(args)
            return with_frame_room(self.compiler, copy, example)

    # -- config -----------------------------------------------------------------------------

    @contextmanager
    def _patched_config(self):
        """Inductor ``mode``/``options`` are applied by torch's wrapper only inside its call;
        we hold them for the whole compile+check so the snapshot records them."""
        if not self.config_patches:
            yield
            return

        with inductor.patched_config(self.config_patches):
            yield


@functools.cache
def _no_accuracy_on_ranks() -> None:
    """Said once a process: a rank's comparison with eager cannot name the rank that computed a
    wrong value, which reaches every rank through the collectives (each rank would report it)."""
    warnings.warn("reproarchive.capture: accuracy=True is not checked on the ranks of a multi-rank job: a wrong "
                  "value on one rank reaches every rank through the collectives, so a rank's comparison with eager "
                  "cannot say which rank computed it; compile errors, runtime errors and crashes are captured",
                  CaptureWarning, stacklevel=4)


# ---------------------------------------------------------------------------------------------
# What this source records, written through the one capture writer
# ---------------------------------------------------------------------------------------------


SOURCE_RECORD = CaptureSource


__all__ = ["capture", "archive_path", "CaptureWarning"]

