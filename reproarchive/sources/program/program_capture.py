"""Run a whole program with PyTorch's repro dumps switched on, then pack every dump it wrote.

Why PyTorch's own hooks and not ours: ``TORCHDYNAMO_REPRO_AFTER`` wraps *every* backend that
torch.compile resolves — registered names and custom callables alike — in every process the
program starts (DataLoader workers, torchrun ranks), with no code change and no import hook
that could clash with the program's own ``sitecustomize``. The dumps go to a private scratch
folder (``TORCH_COMPILE_DEBUG_DIR``), so the user's tree stays clean, and each is packed with
``pack_dump`` (real inputs, snapshots, one replay to record the failure).

Native crashes (a segfault, an abort from C++ in compiled code) leave no PyTorch dump: the
hooks write from an ``except`` clause. For those the program also runs with
``sources.program.crash_guard`` (through a ``sitecustomize`` first on ``PYTHONPATH``), which writes an
archive before each graph is compiled and run and removes it after; what a crashed program
leaves is replayed here in a child process, and packed with the crash it shows (signal, the
crashing thread's stack) as its failure.

Limits, inherited from PyTorch's hooks (documented in ``reproarchive capture --help``):
* one dump per process: a second failure in the same process overwrites the first;
* after_dynamo level 2 runs each graph forward/backward once more to check it; the crash guard
  runs no extra step: the graph's first call is the check, outside Dynamo, and a backward the
  backend compiled is checked where the program runs it (``after_dynamo_hook``);
* failures before a graph reaches the backend (Dynamo tracing errors, graph breaks) are not
  dumped by PyTorch and so not captured.

``--accuracy`` does not use PyTorch's level-4 hook, which fails on working programs with
dynamic shapes in torch 2.13 ("sources must not be empty for symbol s22"): the crash guard hands
every graph to the in-process capture backend with its accuracy check instead, and its archives
are moved into ``out_dir``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from reproarchive.archive.spool_folder import SpoolFolder, is_spool
from reproarchive.context.environment import OWN_VARIABLES_ENV
from reproarchive.context.failure import crash_record, failure_kind
from reproarchive.errors import BackendUnavailableError, ReproArchiveError, SourceError
from reproarchive.format.schema import CaptureSource
from reproarchive.replay.isolation import run_in_child
from reproarchive.sources.capture import call_marks
from reproarchive.sources.capture.job_capture import JOB_OUT_ENV, PARTS_SUFFIX, pack_job_parts
from reproarchive.sources.dump.pack_dump import pack_dump
from reproarchive.sources.dump.scripts import LAUNCHER_NAME, holds_no_data
from reproarchive.sources.pack_report import PackReport, archive_report
from reproarchive.sources.program import crash_guard, door_archives, op_calls
from reproarchive.sources.program.crash_guard import (
    ACCURACY_DIR_ENV,
    CRASH_DIR_ENV,
    JOB_DIR_ENV,
    ON_ACCURACY_ENV,
    pending_archives,
)

if TYPE_CHECKING:
    from reproarchive.archive.writing import Capture


@dataclass
class CaptureResult:
    exit_code: int  # the program's own; 128+N when a signal N ended it
    archives: list[PackReport] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one line per dump that could not be packed
    dumps_found: int = 0
    dumps_kept: Path | None = None
    interrupted: bool = False
    #: killed by a signal: the later calls of compiled graphs the program's processes died in
    #: ("call 3 of the graph compiled as [0/0] (prog.py:12 in f)"), which no archive covers
    crashed_in: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "archives": [a.to_json() for a in self.archives],
            "errors": self.errors,
            "dumps_found": self.dumps_found,
            "dumps_kept": str(self.dumps_kept) if self.dumps_kept else None,
            "interrupted": self.interrupted,
            "crashed_in": self.crashed_in,
        }


#: Off under ``--after aot`` (``capture_env``).
AUTOGRAD_CACHE_ENV = "TORCHINDUCTOR_AUTOGRAD_CACHE"
#: The variables ``capture_env`` sets to steer the run that are also ones the environment record
#: selects: reproarchive's, not the user's (``context.environment.OWN_VARIABLES_ENV``).
OWN_VARIABLES = ("TORCH_COMPILE_DEBUG_DIR", "TORCHDYNAMO_REPRO_AFTER", "TORCHDYNAMO_REPRO_LEVEL", AUTOGRAD_CACHE_ENV)


def capture_env(dump_dir: Path, *, after: str = "dynamo", accuracy: bool = False, on_accuracy: str = "warn",
                base: dict[str, str] | None = None, out: Path | None = None) -> dict[str, str]:
    """The environment the program runs in: PyTorch's repro dumps on, written to ``dump_dir``;
    ``out``: where the archives go when it has ended (a job's ranks name it); ``on_accuracy``:
    with ``accuracy``, whether an accuracy failure only warns (the program goes on) or raises."""
    if after not in ("dynamo", "aot"):
        raise ValueError(f"after must be 'dynamo' or 'aot', not {after!r}")
    if on_accuracy not in ("warn", "raise"):
        raise ValueError(f"on_accuracy must be 'warn' or 'raise', not {on_accuracy!r}")
    env = dict(os.environ if base is None else base)
    if accuracy:
        # reproarchive's own in-process check (PyTorch's level 4 fails on dynamic shapes)
        for name in ("TORCHDYNAMO_REPRO_AFTER", "TORCHDYNAMO_REPRO_LEVEL"):
            env.pop(name, None)
        env[ACCURACY_DIR_ENV] = str(dump_dir / "accuracy")
        env[ON_ACCURACY_ENV] = on_accuracy
    else:
        env["TORCHDYNAMO_REPRO_AFTER"] = after
        env["TORCHDYNAMO_REPRO_LEVEL"] = "2"
        if after == "aot":
            # Inductor's door: compile errors with the real inputs (PyTorch's dump has none)
            env[door_archives.AOT_DIR_ENV] = str(dump_dir / "aot")
            # a hit in AOTAutograd's cache skips Inductor's door and PyTorch's hook alike (a warm
            # cache left a failure unrecorded); the config record says the compile ran without it
            env[AUTOGRAD_CACHE_ENV] = "0"
        else:  # Dynamo's door: compile errors PyTorch's dump cannot write
            env[door_archives.DYNAMO_DOOR_DIR_ENV] = str(dump_dir / "aot")
    env["TORCH_COMPILE_DEBUG_DIR"] = str(dump_dir)
    env[OWN_VARIABLES_ENV] = ",".join(OWN_VARIABLES)  # ours, not the user's: never recorded
    env[CRASH_DIR_ENV] = str(dump_dir / "crash")
    env[JOB_DIR_ENV] = str(dump_dir / "jobs")  # a multi-rank job (torchrun): one archive for the job
    if out is not None:
        env[JOB_OUT_ENV] = str(out.resolve())
    else:
        env.pop(JOB_OUT_ENV, None)
    # the crash guard's sitecustomize first, then this reproarchive (not our whole sys.path:
    # the program may run another Python), then the program's own PYTHONPATH
    shim = Path(crash_guard.__file__).resolve().parent / "crash_shim"
    root = Path(__file__).resolve().parents[3]  # the folder that holds reproarchive/ (sources/program/ here)
    env["PYTHONPATH"] = os.pathsep.join([str(shim), str(root), *filter(None, [env.get("PYTHONPATH")])])
    return env


#: The private folder ``capture --`` points PyTorch's dumps at (its name starts with this).
CAPTURE_DIR_PREFIX = "reproarchive-capture-"
#: The variables ``capture_env`` sets for the program: in an archive's environment record they
#: are reproarchive's doing, not the user's (``diff`` does not count them as differences).
CAPTURE_VARIABLES = ("TORCHDYNAMO_REPRO_AFTER", "TORCHDYNAMO_REPRO_LEVEL", "TORCH_COMPILE_DEBUG_DIR",
                     AUTOGRAD_CACHE_ENV, CRASH_DIR_ENV, ACCURACY_DIR_ENV, ON_ACCURACY_ENV, door_archives.AOT_DIR_ENV,
                     door_archives.DYNAMO_DOOR_DIR_ENV)


def set_by_capture(variables: dict[str, str]) -> frozenset[str]:
    """The variables of a recorded environment that ``capture --`` set (``CAPTURE_VARIABLES``),
    recognised by its private dump folder; empty for an archive captured any other way."""
    if CAPTURE_DIR_PREFIX not in variables.get("TORCH_COMPILE_DEBUG_DIR", ""):
        return frozenset()
    return frozenset(CAPTURE_VARIABLES)


def find_launchers(dump_dir: Path) -> list[Path]:
    """Dumps written during the run, oldest first (one ``run_*`` folder per process)."""
    root = dump_dir / "torch_compile_debug"
    found = [p for p in root.glob(f"run_*/minifier/{LAUNCHER_NAME}") if p.is_file()]
    return sorted(found, key=lambda p: (p.stat().st_mtime, str(p)))


def _next_free(out_dir: Path, stem: str = "repro") -> Path:
    """repro.tar.zst, then repro-2.tar.zst, ...: never overwrite an archive from an earlier run."""
    candidate = out_dir / f"{stem}.tar.zst"
    n = 2
    while candidate.exists():
        candidate = out_dir / f"{stem}-{n}.tar.zst"
        n += 1
    return candidate


def capture_program(
    argv: list[str],
    out_dir: str | os.PathLike = ".",
    *,
    after: str = "dynamo",
    accuracy: bool = False,
    on_accuracy: str = "warn",
    replay: bool = True,
    keep_dumps: bool = False,
    progress: Callable[[str], None] | None = None,
    imports: tuple[str, ...] = (),
    libraries: tuple[str, ...] = (),
) -> CaptureResult:
    """Run ``argv`` with repro dumps on; pack each dump into ``out_dir``; return what happened.

    The program inherits stdin/stdout/stderr and the current directory. Raises SourceError when
    the program cannot be started or ``out_dir`` is a file (a missing folder is created).
    ``imports``/``libraries``: the real implementations of custom ops to bring in where a dump
    is packed (``--import``, ``--load-library``); without them a custom op the dump calls gets
    a stand-in from the calls the program recorded. ``on_accuracy`` (with ``accuracy``): "warn"
    (default) archives an accuracy failure and lets the program go on, so its exit status stays
    its own; "raise" stops it with reproarchive's AccuracyError, as ``capture(...)`` does.
    """
    if not argv:
        raise SourceError("no program to run", "give it after --, e.g. reproarchive capture -- python train.py")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise SourceError(f"output folder {out} is a file", "choose a folder for -o")
    out.mkdir(parents=True, exist_ok=True)  # as the in-process capture backend does
    dump_dir = Path(tempfile.mkdtemp(prefix=CAPTURE_DIR_PREFIX))
    result = CaptureResult(exit_code=0)
    try:
        env = capture_env(dump_dir, after=after, accuracy=accuracy, on_accuracy=on_accuracy, out=out)
        _run_program(argv, env, result)
        launchers = find_launchers(dump_dir)
        result.dumps_found = len(launchers)
        door = door_archives.archives(dump_dir / "aot")
        kept = crash_guard.kept_archives(dump_dir)  # first calls the spool kept, with their real inputs
        launchers = _without_superseded(launchers, {door_archives.writer_pid(a) for a in door}
                                        | {crash_guard.keeper_pid(a) for a in kept},
                                        crash_guard.superseded_dumps(dump_dir))
        _pack_dumps(launchers, dump_dir, out, result, replay=replay, progress=progress, imports=imports,
                    libraries=libraries)
        _move_written(door, dump_dir, out, result)
        _pack_jobs(dump_dir, out, result)
        for pending in pending_archives(dump_dir / "crash"):
            if progress is not None:
                progress("replaying the graph the program crashed in")
            target = _next_free(out)
            try:
                result.archives.append(pack_crash(pending, target, program_exit=result.exit_code, replay=replay))
            except ReproArchiveError as err:
                result.errors.append(f"the graph the program crashed in: {err}")
    finally:
        if keep_dumps:
            result.dumps_kept = dump_dir
        else:
            shutil.rmtree(dump_dir, ignore_errors=True)
    return result


def _run_program(argv: list[str], env: dict[str, str], result: CaptureResult) -> None:
    """Run the program to its end and set ``result``'s exit code (128+N for a signal N, and the
    calls it died in: ``crashed_in``). A Ctrl-C reaches the program too (same process group):
    it gets 30 s to finish dumping, and an interrupted run that exits 0 counts as ended by SIGINT."""
    try:
        proc = subprocess.Popen(argv, env=env)
    except FileNotFoundError as err:
        raise SourceError(f"cannot run {argv[0]}: not found", "check the command after --") from err
    except PermissionError as err:
        raise SourceError(f"cannot run {argv[0]}: permission denied", "check the command after --") from err
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        # The program got the same SIGINT (same process group); let it finish dumping.
        result.interrupted = True
        try:
            code = proc.wait(timeout=30)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            proc.kill()
            code = proc.wait()
    result.exit_code = 128 - code if code < 0 else code
    if result.interrupted and result.exit_code == 0:
        result.exit_code = 128 + signal.SIGINT
    if result.exit_code > 128:  # the later calls of compiled graphs its processes died in
        result.crashed_in = call_marks.in_progress(Path(env[CRASH_DIR_ENV]).parent / call_marks.MARKS_DIR)


def _pack_dumps(launchers: list[Path], dump_dir: Path, out: Path, result: CaptureResult, *, replay: bool,
                progress: Callable[[str], None] | None, imports: tuple[str, ...],
                libraries: tuple[str, ...]) -> None:
    """Pack each of PyTorch's dumps (``launchers``) into ``out``, with the custom-op calls and
    execution notes the crash guard recorded in the same process; a dump that cannot be packed
    is one line in ``result.errors``, not the end of the others."""
    for i, launcher in enumerate(launchers, 1):
        if progress is not None:
            progress(f"packing dump {i} of {len(launchers)}")
        target = _next_free(out)
        pid = launcher.parent.parent.name.rpartition("-pid_")[2]
        recorded = op_calls.op_call_archives(dump_dir, int(pid)) if pid.isdigit() else []
        execution = crash_guard.execution_notes(dump_dir, int(pid)) if pid.isdigit() else None
        try:
            result.archives.append(pack_dump(launcher, target, replay=replay, custom_ops_from=recorded,
                                             execution_from=execution,
                                             imports=imports, libraries=libraries,
                                             own_variables=OWN_VARIABLES))
        except ReproArchiveError as err:
            result.errors.append(f"{launcher.parent.parent.name}: {err}")


def _move_written(door: list[Path], dump_dir: Path, out: Path, result: CaptureResult) -> None:
    """Move the archives the program's processes wrote whole into ``out``: the doors' (compile
    errors after AOT, and those PyTorch's after_dynamo dump could not write), the first calls
    PyTorch's hook could not dump (kept from the crash guard's spool) and the accuracy failures
    of ``--accuracy``, oldest first."""
    for written in door:
        target = _next_free(out)
        shutil.move(str(written), target)
        kind = "capture (after_aot)" if written.name.startswith(door_archives.AOT_PREFIX) else "capture"
        result.archives.append(archive_report(target, kind=kind,
                                              replay={"performed": False, "failure_from": "program"}))
    for written in crash_guard.kept_archives(dump_dir):
        target = _next_free(out)  # first calls PyTorch's hook could not dump, from the spool
        shutil.move(str(written), target)
        result.archives.append(archive_report(target, kind="capture",
                                              replay={"performed": False, "failure_from": "program"}))
    for written in sorted((dump_dir / "accuracy").glob("*.tar.zst"), key=lambda p: p.stat().st_mtime):
        target = _next_free(out)
        shutil.move(str(written), target)
        result.archives.append(archive_report(target, kind="capture"))


def _pack_jobs(dump_dir: Path, out: Path, result: CaptureResult) -> None:
    """One archive per multi-rank job (torchrun) into ``out``: the rank parts of a job some
    rank of which did not end are merged; a job whose ranks all ended left its archive whole."""
    for parts in sorted((dump_dir / "jobs").glob(f"*{PARTS_SUFFIX}")):  # after the launcher: every rank
        target = _next_free(out, parts.name.removesuffix(PARTS_SUFFIX))
        try:
            result.archives.append(pack_job_parts(parts, target))
        except ReproArchiveError as err:
            result.errors.append(f"the job's rank parts: {err}")
    for written in sorted((dump_dir / "jobs").glob("job-*.tar.zst")):  # every rank ended: parts gone
        if written.with_name(written.name.removesuffix(".tar.zst") + PARTS_SUFFIX).exists():
            continue  # merged above, with what the ranks that did not end left
        target = _next_free(out, written.name.removesuffix(".tar.zst"))
        shutil.move(str(written), target)
        result.archives.append(archive_report(target, kind="job"))


def pack_spool(spool: str | os.PathLike, out_dir: str | os.PathLike = ".") -> list[PackReport]:
    """The archives in the spool a killed process left (``archive.spool``): one per graph it
    was running, written to ``out_dir`` (``repro.tar.zst``, ``repro-2.tar.zst``, ...) with the
    ``crash`` failure recorded before the graph ran (``reproarchive run`` replays it in a child
    and learns the signal). The spool is removed once every archive is written.

    Raises SourceError when ``spool`` is not a spool or holds no graph."""

    folder = Path(spool)
    if not is_spool(folder):
        raise SourceError(f"{folder} is not a reproarchive spool", "name the spool-<pid> folder a capture left")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise SourceError(f"output folder {out} is a file", "choose a folder for -o")
    opened = SpoolFolder(folder)  # a spool this reader refuses: refused before anything is made
    if not opened.names():
        raise SourceError(f"the spool {folder} holds no graph", "a process that ended normally leaves nothing to pack")
    out.mkdir(parents=True, exist_ok=True)
    reports = []
    for done in opened.complete_each(lambda _name: _next_free(out)):
        report = archive_report(done.path, kind="capture (crash)", replay={"performed": False})
        if done.absent:
            report = dataclasses.replace(report, warnings=(
                f"the process died while {done.absent} storage(s) were still being written: they are stored as absent "
                "(generated on load)",))
        reports.append(report)
    return reports


def _without_superseded(launchers: list[Path], writer_pids: set[int | None],
                        superseded: set[tuple[str, str]]) -> list[Path]:
    """The dumps still to pack: a data-less after_aot dump (PyTorch had only fake tensors) of a
    process whose failures a door archived, or the spool kept, with their real inputs and
    exception is the same failure without its data, and is left out; so is an after_dynamo
    dump of a first call the spool kept (``superseded``: by path and digest), which lacks the
    call's RNG state and exception."""
    kept = []
    for launcher in launchers:
        pid = launcher.parent.parent.name.rpartition("-pid_")[2]
        if pid.isdigit() and int(pid) in writer_pids and holds_no_data(launcher):
            continue
        if crash_guard.dump_identity(launcher) in superseded:
            continue
        kept.append(launcher)
    return kept


def pack_crash(pending: Path, target: Path, *, program_exit: int, replay: bool = True) -> PackReport:
    """The archive for a graph the program died in: ``pending`` (written by ``crash_guard``
    before the graph ran) with the crash as its failure.

    The program's own output went to the user's terminal, so the signal and the crashing
    thread's stack come from replaying the graph once more in a child process; when that replay
    does not crash (or ``replay`` is off), the record keeps the signal the program died of and
    says what the replay gave instead.
    """

    from reproarchive.archive.loading import load
    from reproarchive.archive.writing import write_capture
    signal_name = _signal_name(program_exit)
    how = f"was killed by {signal_name}" if signal_name else f"exited with status {program_exit}"
    observed, notes, not_replayed = None, {"performed": False}, None
    if replay:
        try:
            outcome = run_in_child(pending)
            observed, notes = outcome.observed, {"performed": True, "isolated": True}
        except BackendUnavailableError as err:  # a custom compiler function: never imported on an archive's say-so
            notes, not_replayed = {"performed": False, "reason": err.what}, err
    if observed is not None and observed.stage == "crash":
        failure = dataclasses.replace(
            observed, message=f"the program {how} while this graph ran; replayed alone: {observed.message}")
    else:
        said = f"; replayed alone here it gave: {failure_kind(observed)}" if notes["performed"] else ""
        failure = crash_record(signal_name or f"exit status {program_exit}",
                               f"the program {how} while this graph ran{said}", "")
    repro = load(pending)
    # not replayed: the archive keeps the signal the program died of, and says how to replay it
    hint = () if not_replayed is None else (
        f"not replayed: {not_replayed.what}; the archive records the signal the program died of. If you trust "
        f"that module, replay it with: reproarchive run --backend {repro.records.backend} {target}",)
    if "absent" in (repro.fidelity or []):
        # the program died while the spool was still writing these inputs (a crash during
        # compilation): the archive keeps them absent, and says so, rather than pass generated
        # data off as the program's
        shutil.move(str(pending), target)
        return dataclasses.replace(
            archive_report(target, kind="capture (crash)", replay=notes),
            warnings=(f"the program died while {repro.fidelity.count('absent')} input(s) were still being written: "
                      "they are stored as absent (generated on load)", *hint))
    write_capture(capture_of(repro, failure, replay_notes=notes, program_exit=program_exit), target, prefixes={})
    pending.unlink()
    report = archive_report(target, kind="capture (crash)", replay=notes)
    return dataclasses.replace(report, warnings=(*report.warnings, *hint)) if hint else report


SOURCE_RECORD = CaptureSource


def capture_of(pending: Any, failure: Any, *, replay_notes: dict[str, Any], program_exit: int) -> Capture:
    """The graph the program died in (``pending``: the loaded archive the crash guard wrote
    before it ran) with the crash as its failure and how the program ended."""
    recorded = pending.records.source if isinstance(pending.records.source, CaptureSource) else CaptureSource()
    source = dataclasses.replace(recorded, stage="crash", written_before_run=True, replay=replay_notes,
                                 program_exit=program_exit)
    from reproarchive.archive.writing import Capture

    return Capture(pending.gm, list(pending.args),
                   dataclasses.replace(pending.records, accuracy=False, failure=failure, source=source),
                   rng_states=pending.rng_states)


def _signal_name(exit_code: int) -> str | None:
    if exit_code <= 128:
        return None
    try:
        return signal.Signals(exit_code - 128).name
    except ValueError:
        return None
