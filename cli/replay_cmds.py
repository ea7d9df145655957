"""``reproarchive run`` and ``reproarchive export``: replay an archive here, or export it as a
standalone script for a bug report."""

from __future__ import annotations

from pathlib import Path

import click

import reproarchive
from reproarchive import _internal as internal

from .app import emit_json, main
from .bug_report import minify_summary, not_original_inputs, replay_command, run_summary
from .exit_codes import ARCHIVE_MISSING, INTERNAL, INTERRUPTED, STORE_MISSING, STORE_UNREACHABLE, exit_codes
from .options import DEVICE, MAX_MEMORY, implementations
from .progress_bars import byte_bars, minify_status
from .text import difference_line, terminal_lines, terminal_safe


def _job_options(fn):
    """``run``'s options for a multi-rank job archive, torchrun's rendezvous options among them."""
    options = [
        click.option("--rank", type=click.IntRange(min=0), metavar="R",
                     help="Multi-rank archive: replay rank R alone against a fake process group (PyTorch's way; "
                          "for failures in the compiler: its collectives return made-up values)."),
        click.option("--single-process", is_flag=True,
                     help="Multi-rank archive: run every rank in this one process (LocalTensorMode): real "
                          "collective values, judged per rank, for accuracy verdicts without N processes."),
        click.option("--timeout", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
                     help="Multi-rank archive: each collective's timeout (default 60); a rank that waits longer "
                          "is reported as timed out, and the launch is bounded by twice that plus its start-up."),
    ]
    for name, meta in RENDEZVOUS_OPTIONS:
        options.append(click.option(name, metavar=meta, default=None,
                                    help=f"Passed to torchrun as {name} (a job over several machines)."))
    for option in reversed(options):
        fn = option(fn)
    return fn


#: torchrun's options that ``run`` passes through for a job over several machines.
RENDEZVOUS_OPTIONS = (("--nnodes", "N"), ("--node-rank", "K"), ("--nproc-per-node", "P"),
                      ("--rdzv-endpoint", "HOST:PORT"), ("--rdzv-backend", "NAME"), ("--rdzv-id", "ID"),
                      ("--master-addr", "HOST"), ("--master-port", "PORT"))
JOB_OPTIONS = _job_options


def launcher_passthrough(values: dict) -> tuple[str, ...]:
    """The rendezvous options given, as torchrun's arguments."""
    out: list[str] = []
    for name, _ in RENDEZVOUS_OPTIONS:
        value = values.get(name.lstrip("-").replace("-", "_"))
        if value is not None:
            out += [name, str(value)]
    return tuple(out)


RUN_EPILOG = exit_codes(
    (0, "passed: the graph compiled and ran (and matched eager with --accuracy); a job: on every rank"),
    (1, "reproduced: it failed the way the archive recorded (a job: on the rank that failed when recorded)"),
    (2, "usage error, or the archive is invalid, damaged, unsafe or too new"),
    (3, "different failure: it failed, but not the way the archive recorded"),
    ARCHIVE_MISSING, STORE_MISSING, STORE_UNREACHABLE,
    (6, "passed, compile only: the graph compiled (for the recorded GPU, without it) and nothing ran; git "
        "bisect reads 6 as bad, so map it: s=$?; [ $s -eq 6 ] && exit 0"),
    INTERNAL,
    (125, "cannot run here: the device or the backend is not available, or the archive was recorded on a "
          "device this machine lacks (--device cpu runs it on the CPU, and the verdict then says it ran on "
          "another device type) and its recorded failure is not one a compile alone shows (or this torch is a "
          "CPU-only build), or the launcher started no rank of a multi-rank job"),
    (125, "inconclusive: the recorded failure did not appear, but not under the conditions the archive "
          "records (a symbolic recording without its shape policy, random draws without the RNG state, a "
          "custom op stood in by its recorded outputs, a rank run alone on made-up collective values, inputs "
          "that require grad without the recorded grad mode, other shape guards, generated inputs after a "
          "compile), or the replay failed only because a custom op's stand-in met inputs it has no recorded "
          "output for: no evidence either way"),
    INTERRUPTED,
) + """
\b
A multi-rank job archive (one archive for every rank) is replayed by launching every rank
with torch.distributed's launcher (torchrun --standalone; gloo on the CPU, NCCL on CUDA), each
recorded process group recreated under its recorded name and members; the verdict names the
rank: "reproduced on rank 1". Over several machines, run it on each with torchrun's
rendezvous options:  --nnodes 2 --node-rank K --nproc-per-node P --rdzv-endpoint HOST:PORT
(each machine reports its own ranks).

\b
Bisecting PyTorch ("when did this start failing?"):
  git bisect start <bad-commit> <good-commit>
  git bisect run sh -c 'python setup.py develop >/dev/null && reproarchive run repro.tar.zst'
git bisect treats 0 as good, 125 as skip (so commits where the backend or device is missing,
and inconclusive replays, are skipped) and 1-127 as bad: both "reproduced" (1) and "different failure" (3) count as bad.
To bisect only the recorded failure and skip commits that fail differently:
  git bisect run sh -c 'reproarchive run repro.tar.zst; s=$?; [ $s -eq 3 ] && exit 125; exit $s'
"""

EXPORT_EPILOG = """\b
The folder holds repro.py and the input data (raw bytes, read by relative path); run it with
only PyTorch installed:  python DIR/repro.py [--device cpu] [--no-accuracy] [--dynamo]
A multi-rank job archive gives a script that launches its N ranks itself, with one exit code for
the job as run gives it (0, 1, 125):  python DIR/repro.py   or under the launcher (over several
machines):  torchrun --nproc-per-node N DIR/repro.py

\b
Exit codes:
  0    the folder was written
  2    usage error, or the archive is invalid, damaged, unsafe or too new, or its graph cannot
       be written as a script (one line says what)
  4    the archive is missing or unreadable, or the folder exists and is not empty
  70   internal error (a bug in reproarchive; --debug shows the traceback)
"""


@main.command("run", epilog=RUN_EPILOG)
@click.argument("archive", type=click.Path(dir_okay=False))
@click.option("--device", type=DEVICE, metavar="DEV",
              help="Run on DEV (cpu, cuda, cuda:1) or remap the archive's devices (cuda:0=cpu,cuda:1=cpu). "
                   "Default: the recorded devices; an archive recorded on a device this machine lacks "
                   "cannot run here (exit 125).")
@click.option("--backend", metavar="NAME",
              help="Compile with NAME instead of the recorded backend: any name torch.compile "
                   "accepts, or module:function for a custom compiler function.")
@click.option("--accuracy/--no-accuracy", default=None,
              help="Compare the compiled result with eager (judged against an fp64 run). "
                   "Default: what the archive recorded.")
@click.option("--tol", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Accuracy tolerance (default 1e-3).")
@click.option("--only-fwd", is_flag=True, help="Run forward only, never backward.")
@click.option("--compile-only/--no-compile-only", default=None,
              help="Compile the graph (of a job, every rank's) and launch nothing: for a GPU this machine lacks, "
                   "for the GPU the archive describes (fake tensors of that device, Triton compiled for its target). "
                   "Default: on when the recorded device is absent here and the recorded failure is a compile "
                   "error.")
@click.option("--isolate/--no-isolate", default=None,
              help="Replay in a child process so a segfault or abort is reported as a crash "
                   "(default: when the recorded failure is a crash, unknown or not recorded).")
@click.option("--current-config", is_flag=True,
              help="Use this machine's torch config instead of the recorded one.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@click.option("--minify", is_flag=True,
              help="Shrink the graph while the recorded failure keeps reproducing; write the result to -o.")
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="With --minify: the archive to write (default: NAME.min.tar.zst next to ARCHIVE).")
@click.option("--max-time", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="With --minify: stop after this long and keep the smallest failing graph so far.")
@click.option("--strict-accuracy", is_flag=True,
              help="With --minify: count every output that differs, bool masks and indices included, and "
                   "look for the first op whose value diverges. Default: only floating outputs and "
                   "gradients count (PyTorch's --accuracy), and the minifier looks for the op that makes "
                   "the recorded outputs wrong.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), metavar="N",
              help="With --minify --isolate: judge N candidates at once in N warm worker processes "
                   "(default: the idle cores, 1 to 4).")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
              help="With --minify: judge the archive and each candidate by up to N replays, a failure in any "
                   "making it fail (for a flaky failure, which one lucky pass would otherwise drop).")
@click.option("--shrink-inputs/--no-shrink-inputs", default=True, show_default=True,
              help="With --minify: also shrink the smallest graph's inputs (halve shapes, narrow dtypes, "
                   "zeros/ones where the values do not matter); the archive labels such inputs as not "
                   "the original data.")
@click.option("--summary", "summary_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Also write a Markdown bug report to FILE: the verdict, the recorded failure, the command "
                   "that replays it, the torch versions, the config the failing run changed and the graph "
                   "(with --minify: the smallest failing graph).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar (loading) or progress line (--minify).")
@MAX_MEMORY
@JOB_OPTIONS
@implementations
@click.pass_context
def run_cmd(ctx, archive, device, backend, accuracy, tol, only_fwd, compile_only, isolate, current_config, as_json,
            minify, output, max_time, strict_accuracy, jobs, repeat, shrink_inputs, summary_path, quiet, max_memory,
            rank, single_process, timeout, imports, libraries, **rendezvous):
    """Replay ARCHIVE on this machine: does it fail here too, and is it the same failure?

    ARCHIVE is a file or a store reference (STORE/NAME, e.g. s3://team/repros/resnet-3fa2b1c09d4e),
    which is pulled once into the cache ($REPROARCHIVE_CACHE, default ~/.cache/reproarchive).

    With --minify, shrink it instead: candidates are judged by replaying them (with --isolate,
    in warm worker processes, --jobs at a time) and accepted only when they reproduce the
    recorded failure signature. Every accepted step is written to -o at once, so Ctrl-C,
    --max-time or a crash keeps the best graph found. Exit 0 when the minified archive is
    written, 3 when the archive does not reproduce here.
    """

    if not minify and (output or max_time is not None or strict_accuracy or jobs is not None or repeat != 1):
        raise click.UsageError("-o/--output, --max-time, --strict-accuracy, --jobs and --repeat only apply with "
                               "--minify")
    # run judges every output (strict); the minifier by default floating outputs only
    settings = reproarchive.ReplaySettings(
        backend=backend, accuracy=accuracy, only_fwd=only_fwd, current_config=current_config, tol=tol,
        strict_accuracy=strict_accuracy or not minify, device=device, max_memory=max_memory, imports=imports,
        libraries=libraries, compile_only=compile_only)
    launcher = launcher_passthrough(rendezvous)
    if minify and (rank is not None or single_process or launcher):
        raise click.UsageError("--rank, --single-process and the launcher's options do not apply with --minify")
    if minify:
        if internal.is_store_reference(archive):
            with byte_bars(not (quiet or as_json)) as progress:
                archive = str(internal.fetch(archive, progress=progress))
        _minify(archive, output, settings, max_time=max_time, isolate=isolate, jobs=jobs, repeat=repeat,
                shrink_inputs=shrink_inputs, as_json=as_json, quiet=quiet, timeout=timeout, summary_path=summary_path)
        return
    with byte_bars(not (quiet or as_json)) as progress:
        outcome = reproarchive.run(archive, settings, isolate=isolate, progress=progress, rank=rank,
                                   single_process=single_process, timeout=timeout, launcher=launcher)
    verdict = format_job(outcome) if isinstance(outcome, reproarchive.JobOutcome) else format_outcome(outcome)
    if summary_path:  # whole or not at all (click's atomic file: a temporary name renamed)
        # read from the cached copy of a store reference (run pulled it); the command names the reference
        local = internal.fetch(archive) if internal.is_store_reference(archive) else archive
        text = run_summary(outcome, archive=str(local), verdict=verdict, command=replay_command(ctx, archive))
        with click.open_file(summary_path, "w", encoding="utf-8", atomic=True) as f:
            f.write(text)
    if as_json:
        emit_json(outcome.to_dict())
    else:
        click.echo(terminal_lines(verdict))
    ctx.exit(outcome.exit_code)


def format_job(job) -> str:
    """A job's verdict: one line, then one line per rank, where the ranks diverged, warnings."""
    label = {"passed": "PASSED", "reproduced": "REPRODUCED", "different failure": "DIFFERENT FAILURE",
             "inconclusive": "INCONCLUSIVE"}
    head = label.get(job.status, job.status.upper())
    where = f" ON RANK {job.rank}" if job.status != "passed" and job.rank is not None else ""
    only = job.compile_only
    lines = [f"{head}{' (COMPILE ONLY)' if only else ''}{where}{versions_clause(job)} (exit {job.exit_code}): "
             f"{job.summary} of {job.world_size}"]
    how = ("with torchrun " + " ".join(job.launcher) if job.launcher
           else "each compiled alone" if only else "in one process")
    recorded = f", failed on rank {job.recorded_rank} when recorded" if job.recorded_rank is not None else ""
    timeout = f", collective timeout {job.timeout_s:g}s" if job.timeout_s else ""
    lines.append(f"  replayed  {len(job.ranks)} of {job.world_size} ranks {how}{timeout}, {job.wall_s:.1f}s{recorded}")
    if only:
        lines.append(f"  compiled  {terminal_safe(only)}; nothing was launched")
    for r in job.ranks:
        seen = r.outcome.observed if r.outcome is not None else None
        what = _describe(seen) if seen is not None else ""
        extra = "; ".join(x for x in (what, r.note) if x)
        lines.append(f"  rank {r.rank:<4}{r.status}{' (timed out in a collective)' if r.timed_out else ''}"
                     + (f": {terminal_safe(extra)}" if extra else ""))
        for reason in r.outcome.unfaithful if r.outcome is not None else ():  # why a pass is no evidence
            lines.append(f"            not as recorded: {terminal_safe(reason)}")
    if job.divergence:
        lines.append(f"  diverged  {job.divergence}")
    for w in job.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(lines)


def _minify(archive, output, settings, *, as_json, quiet, timeout=None, summary_path=None, **options) -> None:
    if not output:
        output = str(default_minified_path(archive))
    progress = None if (quiet or as_json) else minify_status()
    report = reproarchive.minify_archive(archive, output, settings, progress=progress, timeout=timeout, **options)
    if summary_path:  # whole or not at all (click's atomic file: a temporary name renamed)
        with click.open_file(summary_path, "w", encoding="utf-8", atomic=True) as f:
            f.write(minify_summary(report, archive=str(archive)))
    s = report.stats
    if as_json:
        emit_json(report.to_dict())
        if s["stop_reason"] == "interrupted":
            raise SystemExit(130)
        return
    click.echo("", err=True)
    click.echo(terminal_lines(report.code.rstrip()))
    click.echo(
        f"{report.status}: {s['initial_ops']} -> {s['final_ops']} ops, {s['initial_inputs']} -> {s['final_inputs']} "
        f"inputs; {s['calls']} candidates replayed, {s['cache_hits']} cache hits, "
        f"{s['wall_s']:.1f}s ({s['stop_reason']})"
    )
    for line in not_original_inputs(report):
        click.echo(line)
    click.echo(terminal_safe(f"wrote {report.output} (minified from {report.parent[:19]}...); "
                             f"replay it with: reproarchive run {report.output}"))
    if s["stop_reason"] == "interrupted":
        raise SystemExit(130)


def _describe(record) -> str:
    if not record:
        return "none recorded"

    kind = internal.failure_kind(record)
    etype = record.exception_type
    message = record.message.strip().splitlines()
    first = message[0] if message else ""
    if len(first) > 160:
        first = first[:157] + "..."
    return f"{kind}: {etype}{': ' if etype and first else ''}{first}" if (etype or first) else kind


def _compiler_lines(record) -> list[str]:
    """The compiler's own first error lines under a failure (a C++ or Triton compile error)."""

    if record is None:
        return []
    return [f"            {terminal_safe(d)}" for d in internal.compiler_errors(record.message)[:3]]


def format_outcome(outcome) -> str:
    lines = []
    label = {"passed": "PASSED", "reproduced": "REPRODUCED", "different failure": "DIFFERENT FAILURE",
             "inconclusive": "INCONCLUSIVE"}
    moved = ("" if outcome.same_device_type
             else f" ON ANOTHER DEVICE TYPE ({outcome.device}, recorded on {outcome.recorded_device})")
    only = getattr(outcome, "compile_only", None)
    lines.append(f"{label.get(outcome.status, outcome.status.upper())}{' (COMPILE ONLY)' if only else ''}{moved}"
                 f"{versions_clause(outcome)} (exit {outcome.exit_code})")
    for reason in outcome.unfaithful:  # what the replay could not honour: a pass is no evidence
        lines.append(f"  not as recorded: {terminal_safe(reason)}")
    lines.append(f"  replayed  backend {outcome.backend} on {outcome.device}, {outcome.config} config"
                 + (", isolated" if outcome.isolated else "")
                 + ("" if only or (outcome.observed is not None and outcome.observed.stage in ("compile", "crash"))
                    else ", forward+backward" if outcome.ran_backward else ", forward only"))
    if only:
        lines.append(f"  compiled  {terminal_safe(only)}; nothing was launched")
    if outcome.stand_ins:
        lines.append(f"  stand-ins {', '.join(outcome.stand_ins)} "
                     "(custom ops or Triton kernels not here: see the warnings)")
    if outcome.randomness:
        lines.append(f"  randomness {terminal_safe(outcome.randomness)}")
    lines.append(f"  recorded  {_describe(outcome.recorded)}")
    lines.extend(_compiler_lines(outcome.recorded))
    lines.append(f"  observed  {_describe(outcome.observed) if outcome.observed else 'no failure'}")
    lines.extend(_compiler_lines(outcome.observed))
    shapes_line = _shapes_line(outcome.shapes)
    if shapes_line:
        lines.append(f"  shapes    {shapes_line}")
    if outcome.observed is not None and outcome.observed.stage == "crash" and outcome.observed.traceback:
        said = outcome.observed.message.splitlines()[1:]  # the native runtime's last words
        stack = [t for t in outcome.observed.traceback.strip().splitlines() if t.strip()]
        lines.append("  the crashed process said:")
        lines.extend(f"    {terminal_safe(t)}" for t in [*said, *stack][:12])
    acc = outcome.accuracy
    if acc:
        lines.append(f"  accuracy  tolerance {acc.tolerance}, fp64 reference {acc.fp64_reference or '?'}")
        if outcome.accuracy_rule:
            lines.append(f"    rule: {terminal_safe(outcome.accuracy_rule)}")
        for out in acc.outputs:
            if not out.passed:
                if out.max_abs_error is None:  # a shape, dtype or type mismatch
                    lines.append(f"    {out.name}: {out.reason or out.rule or 'mismatch'}")
                    continue
                lines.append(
                    f"    {out.name}: max abs error {_g(out.max_abs_error)}, "
                    f"{out.mismatched_elements} of {out.numel} elements, "
                    f"RMSE vs fp64 compiled {_g(out.rmse_vs_fp64_compiled)} / eager {_g(out.rmse_vs_fp64_eager)}"
                )
    if outcome.differences:
        shown = [d for d in outcome.differences if d.get("important")] or outcome.differences
        more = len(outcome.differences) - len(shown[:12])
        lines.append("differences from the recording machine that could change the outcome:")
        for d in shown[:12]:
            lines.append(f"  {difference_line(d)}")
        if more > 0:
            lines.append(f"  ... and {more} more (see --json)")
    for w in outcome.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(lines)


def versions_clause(outcome) -> str:
    """`` on torch 2.13.0 (recorded on 2.15.0)`` when the replay crossed torch releases: the
    verdict is then about this torch; else nothing."""
    return f" on torch {outcome.torch} (recorded on {outcome.recorded_torch})" if outcome.across_versions else ""


def _shapes_line(shapes) -> str | None:
    """The shape policy the replay used, in one line (details and guards: --json, inspect)."""
    if not shapes:
        return None
    if shapes.get("policy") != "recorded":
        return "policy not recorded: replayed with static shapes" + (
            " (the recording was symbolic)" if shapes.get("symbolic") else "")
    if not shapes.get("symbolic"):
        return None
    dims, unbacked = shapes.get("symbolic_dims") or [], shapes.get("unbacked") or []
    what = ", ".join([*dims[:4], *(["..."] if len(dims) > 4 else []), *(f"{u} unbacked" for u in unbacked[:3])])
    match = {True: "guards equal the recorded ones", False: "guards DIFFER from the recorded ones",
             None: "guards not compared"}[shapes.get("guards_match")]
    if shapes.get("guards_compared_at") == "backend entry" and shapes.get("guards_match") is not None:
        match = f"{match.replace('guards', 'guards at backend entry', 1)} ({shapes.get('guards_compared_because')})"
    return f"recorded symbolic policy ({what}); {match}"


def _g(x) -> str:
    return "n/a" if x is None else f"{x:.3g}"


@main.command("export", epilog=EXPORT_EPILOG)
@click.argument("archive", type=click.Path(dir_okay=False))
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder to create (must not exist, or be empty).")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
@MAX_MEMORY
@implementations
def export_cmd(archive, out_dir, as_json, max_memory, imports, libraries):
    """Write ARCHIVE as a folder with a standalone repro.py that needs only PyTorch.

    A custom op missing here replays from its recorded outputs in repro.py too; --import and
    --load-library are written into repro.py, which then brings the real implementation."""

    report = reproarchive.export(archive, out_dir, reproarchive.ReplaySettings(
        max_memory=max_memory, imports=imports, libraries=libraries))
    if as_json:
        emit_json(report.to_plain())
    else:
        click.echo(f"wrote {report.script} ({len(report.files)} files, {report.bytes} bytes)")
        job = reproarchive.inspect(archive).job
        if job is not None and job.world_size > 1:
            click.echo(f"run it with: python {report.script} (it launches the {job.world_size} ranks here), "
                       f"or torchrun --nproc-per-node {job.world_size} {report.script}")
        else:
            click.echo(f"run it with: python {report.script}")


def default_minified_path(archive: str) -> Path:
    """``repro.tar.zst`` -> ``repro.min.tar.zst``, in the folder of the archive."""
    path = Path(archive)
    stem = path.name.removesuffix(".tar.zst").removesuffix(".zst")
    return path.with_name(f"{stem}.min.tar.zst")


def _add_minify_alias() -> None:
    """``reproarchive minify ARCHIVE``: PyTorch's launcher calls this step ``minify``."""

    @click.pass_context
    def minify_cmd(ctx, **options):
        ctx.invoke(run_cmd, minify=True, **options)

    params = [p for p in run_cmd.params if p.name != "minify"]
    main.add_command(click.Command(
        "minify", params=params, callback=minify_cmd, epilog=RUN_EPILOG,
        help="Shrink ARCHIVE to the smallest graph that still fails the recorded way: the same as "
             "`reproarchive run --minify`. Writes NAME.min.tar.zst next to ARCHIVE unless -o says "
             "otherwise.",
        short_help="Shrink a failing archive (run --minify)."))


_add_minify_alias()
