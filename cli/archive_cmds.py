"""Commands over an existing archive: verify, inspect, doctor, unpack."""

from __future__ import annotations

import click

import reproarchive
from reproarchive import _internal as internal

from .app import emit_json, main
from .exit_codes import ARCHIVE_MISSING, INTERNAL, STORE_MISSING, STORE_UNREACHABLE, USAGE, exit_codes
from .options import implementations
from .progress_bars import byte_bars
from .text import difference_line, failure_title, human_size, index_digest, terminal_safe


def _say(text: str) -> None:
    """A line of inspect's report: it quotes the archive, so it goes out terminal-safe."""
    click.echo(terminal_safe(text))


VERIFY_EXIT_CODES = exit_codes((0, "the archive is valid"), USAGE, ARCHIVE_MISSING, INTERNAL)
INSPECT_EXIT_CODES = exit_codes((0, "the archive is valid and was shown"), USAGE, ARCHIVE_MISSING, STORE_MISSING,
                                STORE_UNREACHABLE, INTERNAL)
UNPACK_EXIT_CODES = exit_codes((0, "the archive is valid and was extracted"), USAGE, ARCHIVE_MISSING,
                               (4, "the output folder exists and is not empty, or cannot be written"), INTERNAL)


@main.command(epilog=VERIFY_EXIT_CODES)
@click.argument("archive", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def verify(archive: str, as_json: bool, quiet: bool) -> None:
    """Check ARCHIVE against every rule of the format and rehash every blob.

    Exit 0 when it is intact and readable by this version; otherwise exit 2 with one line
    saying what is wrong. A call target this torch lacks (a custom op whose library is not
    loaded, a newer torch's function) is not damage: it is listed as "not replayable here"
    (`run` answers 125 for it) and the archive still verifies.
    """

    with byte_bars(not (quiet or as_json)) as progress:
        report = reproarchive.verify(archive, progress=progress)
    if as_json:
        emit_json(report.to_plain())
    else:
        click.echo(
            f"ok: {archive} is a valid reproarchive {report.format} "
            f"({report.blobs} blobs, {human_size(report.uncompressed_bytes)} -> {human_size(report.file_bytes)}, "
            f"{index_digest(report.digest)})"
        )
        click.echo(terminal_safe(f"  {report.randomness}"))
        for what in report.not_replayable_here:
            click.echo(terminal_safe(f"warning: not replayable here: {what}"), err=True)


@main.command(epilog=INSPECT_EXIT_CODES)
@click.argument("archive", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print everything as JSON (includes the full records).")
@click.option("--graph", "show_graph", is_flag=True,
              help="Print the graph as readable code (with shapes, strides and devices) instead.")
def inspect(archive: str, as_json: bool, show_graph: bool) -> None:
    """Show what ARCHIVE holds: graph, inputs, storage sizes, system, config and failure.

    Reads only the index (and, with --graph, the small graph.py member): fast on archives of
    any size, and nothing is executed. ARCHIVE may be a store reference (STORE/NAME): then
    only the archive's small object is downloaded.
    """

    if show_graph:
        code = internal.graph_code(archive)
        if as_json:
            emit_json({"path": archive, "code": code})
        else:
            click.echo(code.rstrip("\n"))
        return
    info = reproarchive.inspect(archive)
    if as_json:
        emit_json(info.to_plain())
        return
    g = info.graph
    _say(f"{info.path}  (format {info.format}, {index_digest(info.digest)})")
    if info.parent:
        _say(f"minified from the archive of {index_digest(info.parent)}")
    _say(f"backend: {info.backend or 'unknown'}   accuracy check: {bool(info.accuracy)}")
    _trace_origin(info.source)
    _say(f"graph: {g.nodes} nodes, {g.ops} ops, {g.placeholders} inputs, {g.submodules} stored attributes")
    _say(f"randomness: {info.randomness}")
    for what in info.not_replayable_here:
        _say(f"not replayable here: {what}")
    _say_extensions(info)
    for name, count in list(g.op_histogram.items())[:12]:
        _say(f"  {count:5d}  {name}")
    if len(g.op_histogram) > 12:
        _say(f"  ... {len(g.op_histogram) - 12} more kinds")
    if g.model_line_count:  # (format 1.7) where in the model the ops came from
        _say(f"model lines: {g.model_line_count}")
        for line in g.model_lines:
            _say(f"  {line}")
        if g.model_line_count > len(g.model_lines):
            _say(f"  ... {g.model_line_count - len(g.model_lines)} more (inspect --graph shows each op's)")
    _say("inputs:")
    for row in info.inputs:
        _say(f"  {row.index:3d} {str(row.name or ''):40.40s} {_input_description(row):40s} {row.fidelity}")
    _say("shape policy:")
    for line in info.shape_policy:
        _say(f"  {line}")
    _say_storage(info.storage)
    _say_failure(info.failure)
    if info.system:
        _say("system: " + ", ".join(f"{k} {v}" for k, v in info.system.to_plain().items() if v not in (None, [])))
    if info.config_changed:
        for module, values in info.config_changed.items():
            for key, value in values.items():
                _say(f"config: {module}.{key} = {value!r}")
    if info.job is not None:
        for line in internal.job_lines(info.job):
            _say(line)


def _say_extensions(info) -> None:
    """inspect's lines for the custom ops and user Triton kernels the graph calls."""
    for op in info.custom_ops:
        _say(f"custom op: {op.name}  {op.schema}  ({op.provenance}; {op.calls} recorded call(s))")
        _say(f"  here: {op.here}")
    for k in info.triton_kernels:
        where = f"{k.module}." if k.module else ""
        _say(f"triton kernel: {where}{k.name}  {k.digest[:19]}...  ({k.launches} recorded launch(es), "
             f"{k.configs} autotuning config(s))")
        _say(f"  here: {k.here}")


def _input_description(row) -> str:
    """What one input of inspect's table is: dtype/shape/device, a subclass, or a value."""
    if row.kind == "tensor":
        desc = f"{row.dtype}{list(row.shape)} on {row.device}"
        if row.dynamic:
            desc += f" dynamic dims {list(row.dynamic)}"
    elif row.kind == "subclass":
        desc = str(row.value)
    elif row.fidelity == "derived":  # a size or stride of another input (a ragged size, j1)
        desc = f"{row.kind} {row.value}" + (f" ({row.expr})" if row.expr else "")
    else:
        desc = f"{row.kind} = {'...' if row.items is not None else row.value}"
    return desc


def _say_storage(s) -> None:
    """inspect's storage line, and a warning when some storages have no data."""
    _say(
        f"storage: {s.storages} storages, {human_size(s.bytes_logical)} logical, {human_size(s.bytes_after_dedup)} "
        f"after dedup ({s.blobs} blobs, {s.zero_filled} all-zero), {human_size(s.bytes_compressed)} compressed; file "
        f"{human_size(s.file_bytes)}"
    )
    if s.absent:
        _say(f"WARNING: {s.absent} storages have no data (absent); replay will generate values for them")


def _say_failure(failure) -> None:
    """inspect's failure line, with the first compiler errors its message names."""

    if failure:
        _say(f"failure: {failure_title(failure.to_plain())}: "
             f"{failure.message.splitlines()[0][:160] if failure.message else ''}")
        errors = internal.compiler_errors(failure.message)
        for line in (["compiler errors:", *errors[:5]] if errors else []):
            _say(f"  {line}")
    else:
        _say("failure: not recorded")


DOCTOR_EXIT_CODES = exit_codes((0, "the report was printed, whether or not anything differs"), USAGE, ARCHIVE_MISSING,
                               STORE_MISSING, STORE_UNREACHABLE, INTERNAL)


@main.command(epilog=DOCTOR_EXIT_CODES)
@click.argument("archive", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@implementations
def doctor(archive: str, as_json: bool, imports: tuple[str, ...], libraries: tuple[str, ...]) -> None:
    """List what differs between the machine that recorded ARCHIVE and this one.

    Torch config, environment variables, torch/CUDA/Triton versions, GPU, CPU, packages: the
    differences `run` would list, without loading inputs or compiling anything (only the
    index is read). One line each, those that could change `run`'s outcome first; config
    values that merely differ are applied from the archive by `run`. ARCHIVE may be a store
    reference (STORE/NAME). A warning comes first when the torch here is not a release this
    reproarchive was tested with.
    """

    report = reproarchive.doctor(archive, imports=imports, libraries=libraries)
    if as_json:
        emit_json(report.to_plain())
        return
    if not report.torch_tested:
        _say(f"warning: torch {report.torch} here: this reproarchive was tested with torch "
             f"{', '.join(report.tested_torch)}; it reads torch's private modules, which change in every release")
    rows = report.differences
    for row in rows:
        mark = "! " if row.get("important") else "= " if _applied_by_run(row) else "  "
        _say(mark + difference_line(row) + _applied_note(row))
    if not rows:
        _say("no differences that could change the outcome")
        return
    _say(doctor_summary(rows, report.important))


def _applied_by_run(row: dict) -> bool:
    """A recorded config value that merely differs here: `run` sets it from the archive."""
    return row.get("what") == "config" and row.get("status") == "differs" and not row.get("important")


def _testing_only(row: dict) -> bool:
    return _applied_by_run(row) and str(row.get("name", "")).endswith("_TESTING_ONLY")


def _applied_note(row: dict) -> str:
    if _testing_only(row):
        return ("  (a testing-only setting, such as a bug injector: `run` applies it, "
                "so it may be what makes the archive fail)")
    return "  (`run` applies the recorded value)" if _applied_by_run(row) else ""


def doctor_summary(rows: list[dict], important: int) -> str:
    """The last line of ``doctor``: how many differences, which could change `run`'s outcome,
    and which `run` takes from the archive (those are part of the failure, not a difference
    in how it replays)."""
    noun = "difference" if len(rows) == 1 else "differences"
    parts = [f"{len(rows)} {noun} from the recording machine"]
    applied = [r for r in rows if _applied_by_run(r)]
    if important:
        parts.append(f"{important} could change the outcome of `reproarchive run` (marked !)")
    if applied:
        parts.append(f"{len(applied)} recorded config value{'s are' if len(applied) != 1 else ' is'} applied by "
                     "`reproarchive run` as recorded (marked =)")
    testing = [r["name"] for r in rows if _testing_only(r)]
    if testing:
        parts.append(f"{', '.join(testing)} is set in the archive: a testing-only setting that `run` applies too")
    if not important:
        parts.append("nothing else is likely to change the outcome" if applied
                     else "none is likely to change the outcome of `reproarchive run`")
    return "; ".join(parts)


def _trace_origin(source) -> None:
    """For an archive packed from a TORCH_TRACE log: which compile of which log, and where
    tlparse shows it, so the reader can go back to the log."""
    if not isinstance(source, dict) or source.get("kind") != "torch_trace":
        return
    rank = "" if source.get("rank") is None else f" rank {source['rank']}"
    frame = source.get("frame") or {}
    where = f", {frame.get('name')} ({frame.get('file')}:{frame.get('line')})" if frame.get("name") else ""
    _say(f"from: TORCH_TRACE log {source.get('log')}, compile [{source.get('compile_id')}]{rank}{where}")
    tlparse = source.get("tlparse") or {}
    pages = tlparse.get("pages") or {}
    page = pages.get(source.get("graph_from")) if isinstance(pages, dict) else None
    _say(f"tlparse: {page or (str(tlparse.get('directory')) + '/')}   graph: {source.get('graph_from')}")


@main.command(epilog=UNPACK_EXIT_CODES)
@click.argument("archive", type=click.Path(dir_okay=False))
@click.option("-C", "--directory", "directory", type=click.Path(file_okay=False), default=None,
              help="Folder to create (default: the archive's name without .tar.zst). Must not exist or be empty.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
def unpack(archive: str, directory: str | None, quiet: bool, as_json: bool) -> None:
    """Verify ARCHIVE and extract its members into a new folder.

    Writes only paths it builds from validated member names (never tar's own extraction), and
    leaves nothing behind if any check fails. `zstd -dc ARCHIVE | tar -x` gives the same files.
    """

    with byte_bars(not (quiet or as_json)) as progress:
        dest = reproarchive.unpack(archive, directory, progress=progress)
    if as_json:
        files = sorted(p for p in dest.rglob("*") if p.is_file())
        emit_json({"archive": archive, "directory": str(dest), "files": [p.relative_to(dest).as_posix() for p in files],
                   "bytes": sum(p.stat().st_size for p in files)})
    else:
        click.echo(f"unpacked {archive} into {dest}/")

