"""``pack`` (import a PyTorch repro dump or a TORCH_TRACE log) and ``capture`` (run a program with dumps
switched on)."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from pathlib import Path

import click

import reproarchive
from reproarchive import _internal as internal

from .app import emit_json, json_errors, main
from .exit_codes import INTERNAL, INTERRUPTED, exit_codes
from .options import implementations
from .progress_bars import step_bar
from .store_cmds import push_line
from .text import human_size, pack_summary, terminal_safe

PACK_STAGES = 6  # the events reproarchive.sources.dump.pack_child reports

PACK_EXIT_CODES = exit_codes(
    (0, "every archive was written (and pushed, with --store)"),
    (2, "usage error, or the dump or log holds something that cannot be packed safely"),
    (4, "no dump or log is found, SOURCE is neither (an archive already packed included), or nothing can be packed"),
    (5, "the archives were written but the store could not take them"),
    INTERNAL, INTERRUPTED)

CAPTURE_EXIT_CODES = """\b
Exit codes:
  N    the program's own exit code (128+N if signal N ended it), so capture can wrap a command
""" + exit_codes((2, "usage error (-o naming a file included)"), (4, "the program cannot be started"),
                 INTERNAL).split("Exit codes:\n", 1)[1]


def _print_pack_result(result) -> None:
    click.echo(f"wrote {result.archive} ({human_size(result.size)})")
    for line in pack_summary(result):
        click.echo(f"  {line}")


def _warn(lines) -> None:
    for line in lines:
        click.echo(f"warning: {line}", err=True)


@main.command("pack", epilog=PACK_EXIT_CODES)
@click.argument("source", required=False, type=click.Path(path_type=Path))
@click.option("-o", "--output", "out", type=click.Path(path_type=Path),
              help="Archive to write (default: ./repro.tar.zst; a folder gets repro.tar.zst inside). "
                   "For a TORCH_TRACE log: the folder for the archives (default: .), or one .tar.zst.")
@click.option("--no-replay", is_flag=True,
              help="Do not replay the graph to record/confirm the failure; a dump's failure is then 'unknown', "
                   "a log's is taken as logged.")
@click.option("--compile-id", "compile_ids", multiple=True, metavar="ID",
              help="TORCH_TRACE log: pack this compile (0/1 or [0/1], as `reproarchive ls` shows it). Repeatable.")
@click.option("--all", "all_compiles", is_flag=True, help="TORCH_TRACE log: pack every compile, not only failed ones.")
@click.option("--rank", type=int, default=None, help="TORCH_TRACE log: only compiles of this rank.")
@click.option("--graph", type=click.Choice(["auto", "dynamo", "aot"]), default="auto", show_default=True,
              help="TORCH_TRACE log: the Dynamo graph (any backend) or Inductor's fx_graph_runnable (aot); "
                   "auto takes the runnable when Inductor logged one.")
@click.option("--backend", metavar="NAME",
              help="TORCH_TRACE log: the backend the job used (a log names it only when it failed).")
@click.option("--accuracy", is_flag=True,
              help="TORCH_TRACE log: the job failed on accuracy (never logged); replay compares with eager.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar, no candidate note.")
@click.option("--store", metavar="STORE", envvar="REPROARCHIVE_STORE", show_envvar=True,
              help="Also push every archive written to STORE (an fsspec URL or a folder; see `reproarchive push`).")
@implementations
@click.pass_context
def pack_cmd(ctx: click.Context, source: Path | None, out: Path | None, no_replay: bool, compile_ids: tuple[str, ...],
             all_compiles: bool, rank: int | None, graph: str, backend: str | None, accuracy: bool, as_json: bool,
             quiet: bool, store: str | None, imports: tuple[str, ...], libraries: tuple[str, ...]) -> None:
    """Bundle a PyTorch repro dump, or compiles of a TORCH_TRACE log, into portable archives.

    \b
    SOURCE is a repro script PyTorch wrote (minifier_launcher.py, repro.py) or a folder holding
    one. Without SOURCE, the newest dump below the current directory is used:
      torch_compile_debug/run_*/minifier/minifier_launcher.py   (TORCHDYNAMO_REPRO_LEVEL=2|4)
      ./repro*.py                                                (TORCHDYNAMO_REPRO_LEVEL=1)
    (and below $TORCH_COMPILE_DEBUG_DIR when it is set).

    \b
    Both dump kinds are read: after_dynamo (torch-level graph) and after_aot (ATen graph for
    Inductor). Inputs keep their real data from the dump's checkpoints/storages; inputs PyTorch
    saved without data, missing storage files, and module parameters PyTorch replaced by
    torch.randn are stored as 'absent' (generated at load time, with a warning), never as real.
    The dump is executed in a child process (it is your own script): this process's
    environment, torch config and directory are not touched. Because PyTorch's dumps do not
    record the error, the dump is replayed once there to record the failure (--no-replay skips
    that); a failure learned on generated inputs is printed and recorded as such. Generated
    integers the graph uses as indices stay inside the dimension they index. Paths of this machine
    are replaced by <cwd>, <dump>, ~ and similar in the archive.

    \b
    SOURCE may also be the job-<key>.parts folder the ranks of a multi-rank job left (each
    rank's capture writes its part there; a rank that crashed leaves its part and its signal):
    its parts are merged into one archive for the job (job-<key>.tar.zst beside it).
    SOURCE may also be the spool-<pid> folder a process killed during capture left (next to
    its archives, or in capture's scratch folder): one archive per graph it was running, into
    the folder -o names (default: .), each with the crash recorded before the graph ran.

    \b
    SOURCE may also be a TORCH_TRACE log, the folder TORCH_TRACE pointed at (one log per rank),
    or a tlparse output folder: then one archive is written per compile, named by rank and
    compile id (repro-0_1.tar.zst, repro-rank3-0_1.tar.zst), by default for the compiles that
    failed (--compile-id and --all choose others; `reproarchive ls SOURCE` lists them). Each
    holds the compile's graph, its inputs as 'absent' with the logged metadata (real where a
    TORCH_COMPILE_DEBUG_SAVE_REAL copy lies next to the log), and the config, torch version and
    failure from the log. The graph is rebuilt and replayed once in a child process to confirm
    the failure. Runtime and accuracy failures never reach the log: name such a compile with
    --compile-id and give --backend (and --accuracy); the replay then records the failure.

    Prints where each archive went, its size, and three summary lines: graph, inputs, failure.
    With --store (or $REPROARCHIVE_STORE) every archive written is also pushed there.
    """

    if source is not None and internal.is_job_parts(source):
        _pack_job_parts(source, out, as_json=as_json, quiet=quiet, store=store)
    elif source is not None and internal.is_spool(source):
        _pack_spool(source, out, as_json=as_json, quiet=quiet, store=store)
    elif source is not None and internal.is_trace(source):
        _pack_trace(ctx, source, out, no_replay=no_replay, compile_ids=compile_ids, all_compiles=all_compiles,
                    rank=rank, graph=graph, backend=backend, accuracy=accuracy, as_json=as_json, quiet=quiet,
                    store=store, imports=imports, libraries=libraries)
    else:
        _refuse_trace_options(compile_ids, all_compiles, rank, graph, backend, accuracy)
        _pack_dump(ctx, source, out, no_replay=no_replay, as_json=as_json, quiet=quiet, store=store, imports=imports,
                   libraries=libraries)


def _pack_spool(source: Path, out: Path | None, *, as_json: bool, quiet: bool, store: str | None) -> None:
    """One archive per graph a process killed during capture was running (its spool-<pid> folder)."""

    with json_errors(as_json):
        reports = internal.pack_spool(source, out if out is not None else Path("."))
        if as_json:
            emit_json({"archives": [r.to_json() for r in reports],
                       **_push_to_store([r.archive for r in reports], store, quiet=True)})
            return
    for report in reports:
        _print_pack_result(report)
    _push_to_store([r.archive for r in reports], store, quiet=quiet)


def _refuse_trace_options(compile_ids, all_compiles: bool, rank, graph: str, backend, accuracy: bool) -> None:
    """The options that choose among a TORCH_TRACE log's compiles are a usage error for a dump."""
    trace_only = [name for name, used in (("--compile-id", compile_ids), ("--all", all_compiles),
                                          ("--rank", rank is not None), ("--graph", graph != "auto"),
                                          ("--backend", backend), ("--accuracy", accuracy)) if used]
    if trace_only:
        raise click.UsageError(f"{', '.join(trace_only)} only apply to a TORCH_TRACE log or tlparse folder as SOURCE")


def _pack_dump(ctx: click.Context, source: Path | None, out: Path | None, *, no_replay: bool, as_json: bool,
               quiet: bool, store: str | None, imports=(), libraries=()) -> None:
    """Pack a repro script PyTorch dumped (SOURCE, or the newest found below the current directory)."""

    debug = bool((ctx.obj or {}).get("debug"))
    log = _debug_log(debug)
    try:
        with json_errors(as_json), step_bar(not quiet and not as_json, PACK_STAGES - int(no_replay),
                                            "packing dump") as step:
            result = reproarchive.pack_dump(source, out, replay=not no_replay, progress=step, keep_log=log,
                                            imports=imports, libraries=libraries)
    finally:
        _show_debug_log(log, "the process that imported the dump")
    if as_json:
        with json_errors(True):
            emit_json({**result.to_json(), **_push_to_store([result.archive], store, quiet=True)})
        return
    if len(result.candidates) > 1 and not quiet:
        _note_candidates(result)
    _warn(result.warnings)
    _print_pack_result(result)
    _push_to_store([result.archive], store, quiet=quiet)


def _note_candidates(result) -> None:
    """Which of several dumps found was taken, and (some of) the others, on stderr."""
    cwd = Path.cwd()
    click.echo(f"took {_rel(result.script, cwd)}: {result.discovery_reason}", err=True)
    others = [c for c in result.candidates if c != result.script]
    for c in others[:3]:
        click.echo(f"  also found {_rel(c, cwd)}", err=True)
    if len(others) > 3:
        click.echo(f"  ... and {len(others) - 3} more; name one as SOURCE to choose", err=True)


def _push_to_store(archives, store: str | None, *, quiet: bool) -> dict:
    """Push what a command wrote when --store (or $REPROARCHIVE_STORE) is given; a store error
    ends the command with exit 5 after the local archives were written."""
    if not store or not archives:
        return {}

    results = reproarchive.push([str(a) for a in archives], store)
    if not quiet:
        for r in results:
            click.echo(push_line(r))
    return {"pushed": [r.to_json() for r in results]}


def _debug_log(debug: bool) -> Path | None:
    if not debug:
        return None
    fd, name = tempfile.mkstemp(prefix="reproarchive-pack-", suffix=".log")
    os.close(fd)
    return Path(name)


def _show_debug_log(log: Path | None, whose: str) -> None:
    if log is None:
        return
    if log.exists() and log.stat().st_size:
        click.echo(f"--- log of {whose} ({log}) ---", err=True)
        click.echo(log.read_text(errors="replace")[-20000:], err=True)
    else:
        log.unlink(missing_ok=True)


def _pack_trace(ctx: click.Context, source: Path, out: Path | None, *, no_replay: bool, compile_ids, all_compiles: bool,
                rank, graph: str, backend, accuracy: bool, as_json: bool, quiet: bool, store: str | None,
                imports=(), libraries=()) -> None:
    with json_errors(as_json):
        log = _debug_log(bool((ctx.obj or {}).get("debug")))
        try:
            result = reproarchive.pack_trace(source, out, compile_ids=compile_ids, all_compiles=all_compiles,
                                             rank=rank, graph=graph, backend=backend, accuracy=accuracy,
                                             replay=not no_replay, progress=_stage_notes(not quiet and not as_json),
                                             keep_log=log, imports=imports, libraries=libraries)
        finally:
            _show_debug_log(log, "the processes that rebuilt the compiles")
        archives = [packed.archive for packed in result.packed] + ([result.job.archive] if result.job else [])
        if as_json:
            emit_json({**result.to_json(), **_push_to_store(archives, store, quiet=True)})
            return
        _print_trace_result(result)
        _push_to_store(archives, store, quiet=quiet)


def _print_trace_result(result) -> None:
    """What packing a TORCH_TRACE log did: its warnings, the compiles skipped, each archive written."""
    _warn(result.warnings)
    for skipped in result.skipped:
        where = "" if skipped["rank"] is None else f" rank {skipped['rank']}"
        click.echo(f"warning: not packed [{skipped['compile_id']}]{where}: {skipped['reason']}", err=True)
    cwd = Path.cwd()
    for packed in result.packed:
        _warn(packed.warnings)
        frame = packed.frame or {}
        where = f"{frame.get('name')} ({Path(str(frame.get('file') or '?')).name}:{frame.get('line')})" \
            if frame.get("name") else ""
        click.echo(f"wrote {_rel(packed.archive, cwd)} ({human_size(packed.size)})  {packed.label} {where}".rstrip())
        for line in pack_summary(packed):
            click.echo(f"  {line}")
    if result.job is not None:  # several ranks' compiles: one archive for the job too
        click.echo(f"wrote {_rel(result.job.archive, cwd)} ({human_size(result.job.size)})  one archive for the job")
        for line in pack_summary(result.job):
            click.echo(f"  {line}")


def _stage_notes(show: bool):
    """A ``progress=`` callback: each stage as one "reproarchive: ..." line on stderr (nothing unless ``show``)."""
    def note(stage: str) -> None:
        if show:
            click.echo(f"reproarchive: {stage}", err=True)

    return note


def _pack_job_parts(source: Path, out: Path | None, *, as_json: bool, quiet: bool, store: str | None) -> None:
    with json_errors(as_json):
        result = internal.pack_job_parts(source, out)
        if as_json:
            emit_json({**result.to_json(), **_push_to_store([result.archive], store, quiet=True)})
            return
        click.echo(f"wrote {_rel(result.archive, Path.cwd())} ({human_size(result.size)})  one archive for the job")
        for line in pack_summary(result):
            click.echo(f"  {line}")
        _push_to_store([result.archive], store, quiet=quiet)


def _rel(path: Path, cwd: Path) -> str:
    try:
        return str(path.relative_to(cwd.resolve()))
    except ValueError:
        return str(path)


@main.command("capture", epilog=CAPTURE_EXIT_CODES,
              context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-o", "--output-dir", "out_dir", type=click.Path(path_type=Path, file_okay=False), default=Path("."),
              show_default=True, help="Folder for the archives (repro.tar.zst, repro-2.tar.zst, ...).")
@click.option("--after", type=click.Choice(["dynamo", "aot"]), default="dynamo", show_default=True,
              help="Where PyTorch intercepts: the Dynamo graph (any backend) or the AOT graph (Inductor).")
@click.option("--accuracy", is_flag=True,
              help="Also check every compiled graph against eager (reproarchive's in-process check; "
                   "PyTorch's level-4 hook fails on dynamic shapes). --after does not apply.")
@click.option("--on-accuracy", type=click.Choice(["warn", "raise"]), default="warn", show_default=True,
              help="With --accuracy, what an accuracy failure does to the program: warn (archived; the program "
                   "goes on and exits as it would) or raise (it stops with an AccuracyError).")
@click.option("--no-replay", is_flag=True, help="Pack without replaying each dump; failures are 'unknown'.")
@click.option("--keep-dumps", is_flag=True, help="Keep PyTorch's dump folder and print where it is.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@click.option("-q", "--quiet", is_flag=True, help="No progress output.")
@click.option("--store", metavar="STORE", envvar="REPROARCHIVE_STORE", show_envvar=True,
              help="Also push every archive written to STORE (an fsspec URL or a folder; see `reproarchive push`).")
@implementations
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def capture_cmd(out_dir: Path, after: str, accuracy: bool, on_accuracy: str, no_replay: bool, keep_dumps: bool,
                as_json: bool, quiet: bool, store: str | None, imports: tuple[str, ...], libraries: tuple[str, ...],
                command: tuple[str, ...]) -> None:
    """Run a program and pack every torch.compile failure in it, without code changes.

    \b
    Example:
      reproarchive capture -o repros -- python train.py --epochs 1

    \b
    How: the program runs with PyTorch's own repro hooks switched on
    (TORCHDYNAMO_REPRO_AFTER=dynamo|aot, TORCHDYNAMO_REPRO_LEVEL=2), which wrap every backend
    torch.compile uses, in every process the program starts. Their dumps go to a private
    temporary folder (TORCH_COMPILE_DEBUG_DIR), and after the program ends each dump is packed
    as by `reproarchive pack` (real inputs, snapshots, one replay to record the failure), then
    the dumps are deleted (--keep-dumps keeps them).

    \b
    Native crashes leave no PyTorch dump, so a crash guard (a sitecustomize first on
    PYTHONPATH; the program's own still runs) writes an archive of each graph before it is
    compiled and first run, and removes it after; a program that dies inside leaves it, and it
    is replayed in a child process and packed with the crash (signal, stack) as its failure.

    \b
    With --accuracy, PyTorch's hooks stay off: through the same guard every graph goes to
    reproarchive's in-process capture backend (reproarchive.capture(..., accuracy=True)), which
    compares the compiled result and gradients with eager and an fp64 run at the first call
    and archives accuracy, compile and runtime failures (PyTorch's level-4 hook fails on
    working programs with dynamic shapes in torch 2.13). An accuracy failure is archived and
    the program goes on (its exit status stays its own); --on-accuracy raise stops it there.

    \b
    Limits (PyTorch's hooks):
      - one dump per process: a later failure in the same process replaces an earlier one;
      - PyTorch's after_dynamo check runs each graph forward/backward inside the backend;
        here the graph's first call is the check instead (nothing runs twice), and the
        backward it made is checked where the program runs it: a backward the program never
        runs is not checked;
      - errors before a graph reaches the backend (Dynamo tracing errors) are not dumped;
      - --after aot dumps of compile errors carry no input data (PyTorch had only fake
        tensors): such a graph is archived instead at Inductor's own door, with the
        program's real inputs and exception (a failing later call too), and the data-less
        dump is left out; AOTAutograd's cache is off (a hit would skip both doors).

    \b
    With --store (or $REPROARCHIVE_STORE) every archive written is also pushed there, so a CI
    job can share each failure it sees (`reproarchive ls STORE` then groups them by failure).

    \b
    The archives written are listed on stdout (one path per line with --quiet); -o is created
    if it does not exist. A push that fails is reported on stderr ("error: could not push
    ...") and leaves the exit code (the program's own) alone.
    """

    result = reproarchive.capture_program(
        list(command), out_dir, after=after, accuracy=accuracy, on_accuracy=on_accuracy, replay=not no_replay,
        keep_dumps=keep_dumps, progress=_stage_notes(not quiet and not as_json), imports=imports, libraries=libraries)
    _report_capture(result, store, as_json=as_json, quiet=quiet, accuracy=accuracy)
    sys.exit(result.exit_code)


def _report_capture(result, store: str | None, *, as_json: bool, quiet: bool, accuracy: bool) -> None:
    """Push what capture wrote (a failed push is one line on stderr, never the exit code), then report it."""

    pushed: dict = {}
    try:
        pushed = _push_to_store([a.archive for a in result.archives], store, quiet=quiet or as_json)
    except reproarchive.ReproArchiveError as err:
        click.echo(f"error: could not push to {store}: {err}", err=True)
        pushed = {"push_error": str(err)}
    if as_json:
        emit_json({**result.to_json(), **pushed})
        return
    for line in result.errors:
        click.echo(f"error: could not pack {line}", err=True)
    if quiet:
        for archive in result.archives:
            click.echo(str(archive.archive))
        return
    if not result.archives:
        _say_nothing_captured(result, accuracy=accuracy)
    for archive in result.archives:
        _warn(archive.warnings)
        _print_pack_result(archive)
    if result.dumps_kept:
        click.echo(f"reproarchive: PyTorch's dumps kept in {result.dumps_kept}", err=True)


def _say_nothing_captured(result, *, accuracy: bool) -> None:
    """Why capture wrote no archive, on stderr."""
    if result.errors:
        click.echo("reproarchive: a failure was dumped, but no archive could be made of it (the error above says "
                   "why)", err=True)
    elif result.exit_code > 128 and not result.interrupted and result.crashed_in:
        name = _signal_name(result.exit_code - 128)
        click.echo(f"reproarchive: the program was killed by {name} (exit {result.exit_code}) in "
                   f"{terminal_safe('; '.join(result.crashed_in))}, and nothing was archived: capture guards a "
                   "compiled graph's compile and first call against a crash, not its later calls (to archive it, "
                   "make the failing input that graph's first call: run the failing step alone)", err=True)
    elif result.exit_code > 128 and not result.interrupted:
        name = _signal_name(result.exit_code - 128)
        click.echo(f"reproarchive: the program was killed by {name} (exit {result.exit_code}) outside every "
                   "compiled graph's compile and call that capture saw, and nothing was archived", err=True)
    elif result.exit_code != 0:
        click.echo(f"reproarchive: the program exited with {result.exit_code} but PyTorch wrote no "
                   "repro dump (the failure was not inside a compiler backend)", err=True)
    elif not accuracy:
        click.echo("reproarchive: no torch.compile failure was captured (a compiled graph that gives "
                   "wrong numbers raises nothing: capture one with --accuracy)", err=True)
    else:
        click.echo("reproarchive: no torch.compile failure was captured", err=True)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
