"""Leaving an archive behind when a program's compiled code crashes natively (``capture --``).

PyTorch's repro hooks write their dump from an ``except`` clause, so a segfault or an abort from
C++ inside compiled code leaves nothing; their "level 3" (dump every graph first) fails on
Inductor graphs in torch 2.13 ("expected Tensor() for op: input") and writes nothing for
after_aot. So ``capture --`` starts the program with ``crash_shim/`` first on ``PYTHONPATH``:
its ``sitecustomize`` (which still runs the program's own one) arranges for
``install`` to wrap Dynamo's ``WrapBackendDebug.__call__``, the door every torch.compile
backend goes through, when torch loads it. For each graph the wrapper spools an archive
(``process_spool``: in the background while the backend compiles, each storage once per
process; the first call waits for it) *before* the compiled code runs (graph as Dynamo traced
it, the real example inputs, config, environment, system, and a ``crash`` failure whose
signal is not known), and discards it once the compiled code has returned from its first
call, or raised (where that call made a compiled backward, once that backward has run in the
program's own ``backward()``: the entry is set aside between the two, ``backward_watch``); the
spool goes when the program exits normally. Only a process that dies
leaves it: ``capture_program`` completes its entries into archives (``pending_archives``) and
replays each in a child to learn the signal and the crashing thread's stack.

With PyTorch's after_dynamo hook on (``capture --``'s default) the wrapper also takes over the
hook's check, which PyTorch runs inside the backend call (``after_dynamo_hook``): there it
breaks working Inductor programs and turns a kernel abort into ``BackendCompilerFailed``; here
the first call is the check, its compiled backward watched where the program runs it, and
every later call is covered, with PyTorch's own dumps.

With ``$REPROARCHIVE_ACCURACY_DIR`` set (``capture --accuracy``) the same door also hands each
graph to reproarchive's own capture backend with its accuracy check, which writes its archives
there (``_accuracy_backend``).

In a rank of a multi-rank job (``capture -- torchrun ...``: the environment reaches every rank)
with ``$REPROARCHIVE_JOB_DIR`` set, the door hands each graph to the capture backend's job mode
instead (``_job_backend``): every rank writes its part, and one archive for the job results.

With ``$REPROARCHIVE_AOT_DIR`` set (``capture --after aot``) the wrapper also keeps the graph and
its real inputs known for the duration of the backend call, and Inductor's door
(``after_aot_hook``) is wrapped when torch loads ``torch._inductor.compile_fx``: a graph Inductor
fails to compile is archived there with the program's real inputs and exception.

The first call's spool entry (``FirstCall``) is shared with the hook through ``first_call``;
the hook's check is ``after_dynamo_hook``.

Nothing here runs unless ``$REPROARCHIVE_CRASH_DIR`` is set, and nothing here may break the
program: every failure to write costs the crash record, never the run.
"""

from __future__ import annotations

# Imports inside functions: the crash guard is imported by every Python process `capture --`
# starts; what recording a failure needs is imported when a graph fails, not at every start-up.
import functools
import importlib.abc
import itertools
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from reproarchive.compat import dynamo, inductor
from reproarchive.sources.capture import call_marks
from reproarchive.sources.capture.first_call import CRASH_DIR_ENV, FirstCall, discard, spool
from reproarchive.sources.capture.stack_room import with_frame_room
from reproarchive.sources.program import after_aot_hook, op_calls
from reproarchive.sources.program.after_dynamo_hook import after_dynamo_hook
from reproarchive.sources.program.door_archives import AOT_DIR_ENV, ARCHIVED_ATTR

JOB_DIR_ENV = "REPROARCHIVE_JOB_DIR"
ACCURACY_DIR_ENV = "REPROARCHIVE_ACCURACY_DIR"
#: what an accuracy failure does to the program under ``capture --accuracy``: "warn" (the
#: default: archived, and the program goes on, so its exit status is its own) or "raise"
ON_ACCURACY_ENV = "REPROARCHIVE_ON_ACCURACY"
PENDING_PREFIX = "pending-"
KEPT_DIR = "kept"  # beside it too: first calls whose failure PyTorch could not dump, from the spool
SUPERSEDES_SUFFIX = ".supersedes.json"  # beside a kept first call: the dump it stands for
EXECUTION_DIR = "execution"  # beside it too: the thread state of each compile, one JSON line per compile

log = logging.getLogger("reproarchive.capture")
_counter = itertools.count(1)  # first calls this process kept from its spool, in order


def install() -> None:
    """Guard every backend once torch loads Dynamo's repro module (now, if it is loaded), and
    Inductor's door once torch loads it."""
    if not os.environ.get(CRASH_DIR_ENV):
        return
    patches = {dynamo.REPRO_HOOK_MODULE: _patch, inductor.COMPILE_FX_MODULE: after_aot_hook.patch}
    for name, patch in list(patches.items()):
        module = sys.modules.get(name)
        if module is not None:
            patch(module)
            del patches[name]
    if patches and not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport(patches))


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: lets the next finder find Dynamo's repro module, then patches it
    right after it executes. Importing torch here instead would change the program's own
    import order (environment variables set before ``import torch`` must still count)."""

    def __init__(self, patches: dict[str, Any]):
        self.patches = patches  # module name -> what patches it

    def find_spec(self, name, path, target=None):
        patch = self.patches.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                execute = spec.loader.exec_module

                def exec_module(module, _execute=execute, _patch=patch):
                    _execute(module)
                    _patch(module)

                spec.loader.exec_module = exec_module  # this spec's own loader instance
                return spec
        return None


def _patch(module: Any) -> None:
    cls = dynamo.backend_debug_class(module)
    if cls is None or getattr(cls, "_reproarchive_guarded", False):
        return
    original = cls.__call__

    @functools.wraps(original)
    def __call__(self, gm, example_inputs, **kwargs):
        job_dir = os.environ.get(JOB_DIR_ENV)
        if job_dir and not kwargs and _in_a_job():  # every rank: its part, one archive for the job
            return _job_backend(self, job_dir)(gm, example_inputs)
        began = time.time()
        _note_entry(gm)
        calls = _noted_calls(gm)  # before the compile, as the dump prints the graph
        first = FirstCall(_write_pending(gm, list(example_inputs), _backend_name(self)))
        accuracy_dir = os.environ.get(ACCURACY_DIR_ENV)
        pristine = op_calls.op_graph(gm)

        def compile_() -> Any:
            if accuracy_dir and not kwargs:
                return _accuracy_backend(self, accuracy_dir)(gm, example_inputs)
            if _hook_runs_in_backend():
                return after_dynamo_hook(self, _backend_name(self), gm, list(example_inputs), kwargs, first)
            return original(self, gm, example_inputs, **kwargs)

        try:
            with after_aot_hook.dynamo_call(gm, list(example_inputs)):
                compiled = with_frame_room(compile_)  # deeper than the plain compile (``stack_room``)
        except BaseException as exc:
            discard(first.pending)
            if pristine is not None and isinstance(exc, Exception):
                op_calls.write_op_calls(pristine, list(example_inputs), exc, _backend_name(self))
            raise
        finally:
            shapes = _note_compile(gm, list(example_inputs), began, calls)
        if first.pending is None:  # no spool entry: no call is guarded, every call is marked
            return _every_call_marked(compiled, _marker(gm))
        return _discard_after_first_call(compiled, _backend_name(self), first, shapes, pristine, _marker(gm))

    cls.__call__ = __call__
    cls._reproarchive_guarded = True


def _note_entry(gm: Any) -> None:
    """The guards Dynamo made, noted before the compile adds its own (``codec.shape_guards``)."""
    from reproarchive.codec.shape_guards import note_entry  # torch's: imported once torch compiles

    note_entry(gm)


def _noted_calls(gm: Any) -> Any:
    """The graph's calls with their stacks (``printed_stacks.noted_calls``), or None."""
    try:
        from reproarchive.sources.printed_stacks import noted_calls

        return noted_calls(gm)
    except Exception:  # noqa: BLE001 - never in place of the program's own run
        return None


def _note_compile(gm: Any, inputs: list[Any], began: float, calls: Any = None) -> Any:
    """Append what PyTorch's dump does not record of this compile to this process's
    ``execution/<pid>.jsonl``: the thread state it runs under (grad and inference mode, autocast
    ...: a replay in another state can fail in a way the program never did, grad on for a
    ``no_grad`` model that writes in place) and the shape policy Dynamo's fake values on ``gm``
    say (which sizes are symbols, their ranges and guards; a dump writes sizes only where they
    are symbols). Noted when the backend call ends, with the guards the compile added, under
    the time it ``began``: ``pack_dump`` takes the last entry that began before the dump was
    written, the failing compile's. Returns that shape policy (None where there is none), which
    a first call kept from the spool records too: the spool entry was written before the
    compile added its guards. ``calls``: the graph's calls and their stacks, which a dump
    prints without (``printed_stacks``)."""
    try:
        import json

        from reproarchive.codec.shapes import policy_of
        from reproarchive.context.config import config_snapshot
        from reproarchive.context.execution import execution_snapshot
        from reproarchive.format.plain import to_plain

        folder = Path(os.environ[CRASH_DIR_ENV]).parent / EXECUTION_DIR
        folder.mkdir(parents=True, exist_ok=True)
        policy = policy_of(gm, inputs, config_snapshot())
        line = json.dumps({"time": began, "execution": to_plain(execution_snapshot(inputs)),
                           "shapes": to_plain(policy) if policy is not None else None, "inputs": len(inputs),
                           "calls": calls})
        with open(folder / f"{os.getpid()}.jsonl", "a") as f:
            f.write(line + "\n")
        return policy
    except Exception as err:  # noqa: BLE001 - never in place of the program's own run
        log.debug("reproarchive capture: the compile was not noted: %s", err)
        return None


def execution_notes(dump_dir: Path, pid: int) -> Path | None:
    """What process ``pid`` noted at its compiles (``_note_compile``), if anything."""
    path = dump_dir / EXECUTION_DIR / f"{pid}.jsonl"
    return path if path.is_file() else None


def _hook_runs_in_backend() -> bool:
    return dynamo.repro_after() == "dynamo" and dynamo.repro_level() in (1, 2, 3)


def _accuracy_backend(wrapper: Any, folder: str) -> Any:
    """``capture --accuracy``: the in-process capture backend (``reproarchive.capture(...,
    accuracy=True)``) around the program's real backend, in place of PyTorch's level-4 hook,
    which fails on working programs whose shapes are dynamic (torch 2.13: "sources must not
    be empty for symbol s22"). It archives compile, runtime and accuracy failures itself; an
    accuracy failure raises in the program only when the user asked (``ON_ACCURACY_ENV``)."""
    backend = getattr(wrapper, "_reproarchive_accuracy", None)
    if backend is None:
        from reproarchive.sources.capture.capture_backend import capture

        backend = capture(wrapper._torchdynamo_orig_backend, path=folder, accuracy=True, crash=False,
                          on_accuracy=os.environ.get(ON_ACCURACY_ENV) or "warn")
        backend.backend_name = _backend_name(wrapper)
        wrapper._reproarchive_accuracy = backend
    return backend


def _in_a_job() -> bool:
    from reproarchive.sources.capture.job_capture import rank_context

    return rank_context() is not None


def _job_backend(wrapper: Any, folder: str) -> Any:
    """``capture --`` of a multi-rank job (``torchrun ...``): on every rank, the in-process
    capture backend around the program's real backend, which writes each rank's part into
    ``folder`` and merges the job's archive there (``job_capture``); ``capture_program`` merges
    the parts again once the launcher has exited, so a rank that crashed is in it too."""
    backend = getattr(wrapper, "_reproarchive_job", None)
    if backend is None:
        from reproarchive.sources.capture.capture_backend import capture

        backend = capture(wrapper._torchdynamo_orig_backend, path=folder)
        backend.backend_name = _backend_name(wrapper)
        wrapper._reproarchive_job = backend
    return backend


def _backend_name(wrapper: Any) -> str:
    """The name to record for the backend behind Dynamo's ``wrapper``: a registered name as
    it is; a custom function by its import path (``recorded_name``), not the bare ``__name__``
    that ``torch.compile``'s wrapper takes as its ``compiler_name``."""
    from reproarchive.sources.capture.capture_options import recorded_name

    name = dynamo.wrapped_backend_name(wrapper)
    if isinstance(name, str) and name in dynamo.registered_backends():
        return name
    return recorded_name(dynamo.original_backend(wrapper))  # torch.compile's wrapper of a callable


def _write_pending(gm: Any, inputs: list[Any], backend: str) -> str | None:
    """Spool the archive a crash would leave, in the background while the backend compiles
    (``process_spool``): each storage written once per process, the weights of every
    recompile the same objects."""
    try:
        from reproarchive.context.config import config_snapshot
        from reproarchive.context.failure import pending_crash_record
        from reproarchive.replay.input_writes import written_inputs
        from reproarchive.sources.capture import gc_pause
        from reproarchive.sources.capture.capture_backend import capture_of, copy_graph_structure
        with gc_pause.paused():  # our own work, not the program's (``collector``)
            # on this thread: the graph before the backend rewrites it, the thread's grad mode
            graph = copy_graph_structure(gm)
            capture = capture_of(graph, list(inputs), config=config_snapshot(),
                                 failure=pending_crash_record(backend=backend), backend=backend,
                                 accuracy=False, capture_settings={"check_runtime": True})
            # the inputs it writes: never read before the first call forks its writer, or copied
            return spool().submit(capture, written=written_inputs(graph, inputs))
    except Exception as err:  # noqa: BLE001 - never in place of the program's own run
        from reproarchive.sources.capture.process_spool import could_not_write

        could_not_write(err)
        return None


def _marker(gm: Any) -> call_marks.Marker | None:
    """The marks of this graph's calls (``call_marks``); None where they cannot be written."""
    try:
        return call_marks.Marker(Path(os.environ[CRASH_DIR_ENV]).parent / call_marks.MARKS_DIR,
                                 call_marks.label_of(gm))
    except Exception:  # noqa: BLE001 - never in place of the program's own run
        return None


def _every_call_marked(compiled: Any, marker: call_marks.Marker | None) -> Any:
    calls = itertools.count(1)

    @functools.wraps(compiled, assigned=("__module__", "__name__", "__qualname__", "__doc__"), updated=())
    def run(*args: Any, **kwargs: Any) -> Any:
        return call_marks.marked(compiled, args, kwargs, marker, next(calls))

    return run


def _discard_after_first_call(compiled: Any, backend: str, first: FirstCall, shapes: Any = None,
                              op_graph: Any = None, marker: call_marks.Marker | None = None) -> Any:
    """``compiled`` behind a wrapper that discards spool entry ``first.pending`` when its first
    call ends (or, where PyTorch's hook watches the call's compiled backward, leaves it to the
    hook: ``first.watched``), or keeps it as the failure's archive where the call failed and the
    failure could not be dumped (``_keep``). Where ``first.finished_first`` says a compiled
    backward follows the call, the entry is finished before it rather than by a writer forked
    through that backward's compile (``ProcessSpool.wait``). ``shapes``: the shape policy with
    the guards the compile added, which a kept entry records; ``op_graph``: the graph as Dynamo
    handed it, where it calls custom ops, whose calls a kept entry records (and a failing later
    call, ``op_calls.later_call``). Every later call is marked by ``marker`` (``call_marks``): a
    crash there leaves no archive, but capture names the call."""
    done, calls = [False], [1]  # the first call, then its number from 2 on
    pending = first.pending
    first.keep = lambda exc, stage: _keep(pending, exc, backend, supersedes=_dumped_after_dynamo(exc), shapes=shapes,
                                          stage=stage, op_graph=op_graph)

    @functools.wraps(compiled, assigned=("__module__", "__name__", "__qualname__", "__doc__"), updated=())
    def run(*args: Any, **kwargs: Any) -> Any:
        if done[0]:
            calls[0] += 1
            if op_graph is None:
                return call_marks.marked(compiled, args, kwargs, marker, calls[0])
            later = (compiled, args, kwargs, op_graph, backend)
            return call_marks.marked(op_calls.later_call, later, {}, marker, calls[0])
        spool().wait(pending, fork=not first.finished_first(list(args)))
        try:
            return compiled(*args, **kwargs)
        except Exception as exc:
            if (getattr(exc, "reproarchive_not_archived", None) is not None or _undumped_after_aot(exc)
                    or _dumped_after_dynamo(exc) is not None):
                first.keep(exc, None)
            raise
        finally:
            done[0] = True
            if not first.watched:
                discard(pending)

    return run


def _undumped_after_aot(exc: Exception) -> bool:
    """Whether a first call failed under ``capture --after aot``: PyTorch's after_aot hook dumps a
    failing call of Inductor's code with fake copies of its inputs (no data), and not at all for
    a graph compiled with dynamic shapes (torch 2.13); the spool holds the call's real inputs."""
    from reproarchive.sources.capture.call_guard import is_control_flow

    return (bool(os.environ.get(AOT_DIR_ENV)) and not is_control_flow(exc)
            and getattr(exc, ARCHIVED_ATTR, None) is None)  # not archived at Inductor's door already


def _dumped_after_dynamo(exc: Exception) -> Path | None:
    """The launcher PyTorch's after_dynamo dump wrote for a failing first call, or None. That
    dump holds the graph and inputs, but not the RNG state the call began with, nor the
    program's own exception (a packed dump learns it from a replay): the spool entry holds both,
    so it is kept (``_keep``) and the dump it ``supersedes`` is left unpacked."""
    from reproarchive.sources.capture.call_guard import is_control_flow

    launcher = getattr(exc, "minifier_path", None)
    if not _hook_runs_in_backend() or not isinstance(launcher, str) or is_control_flow(exc):
        return None
    return Path(launcher) if Path(launcher).is_file() else None


def _keep(pending: str, exc: Exception, backend: str, *, supersedes: Path | None = None, shapes: Any = None,
          stage: str | None = None, op_graph: Any = None) -> None:
    """A first call failed and PyTorch's hook could not dump it (its inputs cannot be read any
    more: a device-side assert fails every later use of the device), dumps it without data
    (after AOT), or without its RNG state and exception (after Dynamo: the launcher it
    ``supersedes``). Spool entry ``pending`` holds them as they were before the call: it is
    completed into the failure's archive in ``KEPT_DIR``, which ``capture_program`` reports
    beside the dumps it packs (the dump it supersedes, and a data-less dump of the same process,
    left out), with the shape policy as the compile left it (``shapes``), as every route records it.
    ``stage``: the failure's (a watched backward's), else the exception's. A graph that calls
    custom ops (``op_graph``) gets their calls, run on the kept inputs (``kept_calls``)."""
    try:
        from reproarchive.context.failure import record_from_exception
        from reproarchive.replay.accuracy import stage_of

        folder = Path(os.environ[CRASH_DIR_ENV]).parent / KEPT_DIR
        folder.mkdir(parents=True, exist_ok=True)
        record = record_from_exception(exc, stage or stage_of(exc), backend=backend)
        target = folder / f"{os.getpid()}-{next(_counter)}.tar.zst"
        completed = spool().keep(pending, record, target, shapes=shapes)
        if completed is not None and supersedes is not None:
            _note_superseded(target, supersedes)
        if completed is not None and op_graph is not None and not completed.absent:
            from reproarchive.sources.program.kept_calls import with_op_calls

            with_op_calls(target, op_graph)
    except Exception as err:  # noqa: BLE001 - never in place of the program's own failure
        log.warning("reproarchive capture: the failing first call could not be kept from the spool either: %s: %s",
                    type(err).__name__, err)
        return
    if completed is not None:
        print(f"reproarchive: archived the failing first call from its spool, its inputs as they were before "
              f"it{completed.unwritten}", file=sys.stderr)


def _note_superseded(kept: Path, launcher: Path) -> None:
    """Beside ``kept``: the dump it stands for, by path and digest (a later failure of the same
    process rewrites that launcher, and the rewritten one is packed)."""
    import json

    try:
        path, digest = dump_identity(launcher)
        kept.with_name(kept.name.removesuffix(".tar.zst") + SUPERSEDES_SUFFIX).write_text(
            json.dumps({"launcher": path, "sha256": digest}))
    except OSError as err:  # the kept archive stands; the dump is packed beside it
        log.warning("reproarchive capture: PyTorch's dump of the kept first call will be packed too: %s", err)


def dump_identity(launcher: Path) -> tuple[str, str]:
    """(resolved path, sha256 of its text): one dump of a launcher PyTorch rewrites per failure."""
    import hashlib

    return str(launcher.resolve()), hashlib.sha256(launcher.read_bytes()).hexdigest()


def superseded_dumps(dump_dir: Path) -> set[tuple[str, str]]:
    """The dumps a kept first call stands for (``_note_superseded``): (launcher path, sha256)."""
    import json

    found = set()
    for note in (dump_dir / KEPT_DIR).glob(f"*{SUPERSEDES_SUFFIX}"):
        try:
            said = json.loads(note.read_text())
            found.add((str(said["launcher"]), str(said["sha256"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a note half-written by a dying process: its dump is packed too
    return found


def kept_archives(dump_dir: Path) -> list[Path]:
    """The failing first calls kept from the spool (``_keep``), oldest first."""
    return sorted((dump_dir / KEPT_DIR).glob("*.tar.zst"), key=lambda p: p.stat().st_mtime)


def keeper_pid(archive: Path) -> int | None:
    """The process that kept ``archive`` (its name says it: ``<pid>-<n>.tar.zst``)."""
    head = archive.name.split("-")[0]
    return int(head) if head.isdigit() else None


def pending_archives(folder: Path) -> list[Path]:
    """The archives a crashed program left, oldest first: each entry of the spools its processes
    left completed into ``pending-<pid>-<n>.tar.zst`` (and the spool removed)."""
    from reproarchive.archive.spool_folder import SPOOL_PREFIX, SpoolFolder, is_spool

    for spool_dir in sorted(folder.glob(f"{SPOOL_PREFIX}*")):
        if not is_spool(spool_dir):
            continue
        prefix = f"{PENDING_PREFIX}{spool_dir.name[len(SPOOL_PREFIX):]}-"
        list(SpoolFolder(spool_dir).complete_each(lambda name, prefix=prefix: folder / f"{prefix}{name}.tar.zst",
                                                  on_error=_not_completed))  # a damaged entry costs no other
    found = [p for p in folder.glob(f"{PENDING_PREFIX}*.tar.zst") if p.is_file()]
    return sorted(found, key=lambda p: (p.stat().st_mtime, p.name))


def _not_completed(name: str, err: Exception) -> None:
    log.warning("reproarchive capture: a graph the program left could not be completed: %s", err)
