"""``reproarchive bisect compiler`` and ``reproarchive bisect torch``: whose bug is it."""

from __future__ import annotations

from pathlib import Path

import click

import reproarchive
from reproarchive import _internal as internal

from .app import emit_json, main
from .bisect_text import compiler_lines, env_line, step_line, summary, torch_lines
from .bug_report import recorded_settings
from .exit_codes import ARCHIVE_MISSING, INTERNAL, INTERRUPTED, USAGE, exit_codes
from .options import DEVICE
from .text import terminal_lines

COMPILER_EPILOG = exit_codes(
    (0, "a culprit was named (backend, and where PyTorch could tell, subsystem and bisect number)"),
    USAGE,
    (3, "no culprit: no backend shows the recorded failure here, or --max-time ran out first"),
    ARCHIVE_MISSING, INTERNAL,
    (125, "cannot run here: the archive's backend or device is not available"),
    (130, "interrupted (Ctrl-C): the replay is stopped and the bisection's state folder removed"),
)
TORCH_EPILOG = exit_codes(
    (0, "a first bad environment was named"),
    USAGE,
    (3, "no environment shows the recorded failure (each was good, failed differently or was skipped), "
        "or --max-time ran out first"),
    (4, "the archive, or an interpreter given with --env, is missing or cannot be run"),
    INTERNAL, INTERRUPTED,
)


@main.group("bisect", epilog=exit_codes(
    (0, "a culprit was named"), USAGE, (3, "no culprit named"), ARCHIVE_MISSING, INTERNAL,
    (125, "compiler: cannot run here"), INTERRUPTED))
def bisect_group() -> None:
    """Find whose bug an archive's failure is: a compiler stage, pass or lowering
    (bisect compiler), or a torch build (bisect torch)."""


def _write_summary(path, result, archive) -> None:
    """The summary, written whole or not at all (click's atomic file: a temporary name renamed)."""

    try:
        graph = internal.graph_code(archive) if archive else None
    except reproarchive.ReproArchiveError:
        graph = None
    text = summary(result, graph=graph, settings=recorded_settings(archive) if archive else [],
                   html_page=str(path).endswith((".html", ".htm")))
    with click.open_file(path, "w", encoding="utf-8", atomic=True) as f:
        f.write(text)


def _report(result, archive, lines, *, summary_path, as_json) -> None:
    """The summary file, the result (JSON or lines for people) and the exit code: 0 when a
    culprit was named, 3 when none was."""
    if summary_path:
        _write_summary(summary_path, result, archive)
    if as_json:
        emit_json(result.to_plain())
    else:
        click.echo(terminal_lines("\n".join(lines(result))))
    click.get_current_context().exit(0 if result.status == "found" else 3)


@bisect_group.command("compiler", epilog=COMPILER_EPILOG)
@click.argument("archive", type=click.Path(dir_okay=False))
@click.option("--backend", metavar="NAME",
              help="The backend that replays at PyTorch's inductor stage (default: the archive's; a recorded "
                   "custom module:function must be named here to be run).")
@click.option("--device", type=DEVICE, metavar="DEV", help="Run on DEV or remap devices, as for `run`.")
@click.option("--tol", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Accuracy tolerance (default 1e-3).")
@click.option("--current-config", is_flag=True, help="Use this machine's torch config instead of the recorded one.")
@click.option("--from", "first_backend", metavar="STAGE",
              help="Start at PyTorch's bisection backend STAGE (e.g. inductor), taking the ones before as good "
                   "without replaying them.")
@click.option("--max-time", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Stop starting replays after this long (status incomplete, exit 3).")
@click.option("--config-only", is_flag=True,
              help="Only find which recorded non-default Inductor settings the failure needs (a few replays), "
                   "without the stage search.")
@click.option("--summary", "summary_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Also write a summary for a bug report to FILE (Markdown; HTML for .html).")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
              help="Replay each step up to N times, one that shows the recorded failure making it bad (for a "
                   "flaky failure, which one lucky pass would move past its culprit).")
@click.option("--sidecar/--no-sidecar", default=True, show_default=True,
              help="Store a culprit found next to the archive as ARCHIVE.bisect.json.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines.")
def compiler_cmd(archive, backend, device, tol, current_config, first_backend, max_time, config_only, summary_path,
                 repeat, sidecar, as_json, quiet):
    """Find the compiler stage that makes ARCHIVE fail, with PyTorch's compiler bisector.

    Backends eager, aot_eager, aot_eager_decomp_partition and inductor are tried in turn; in the
    first that fails, each subsystem (pre/joint/post-grad passes, config changes, lowerings ...)
    is turned off, and the application that makes the failure appear is found by binary search.
    Every replay runs in a child process judged by the recorded failure's signature (a
    different failure does not count as the failure); the bisector's state lives in a private
    folder, removed at the end, so later compiles are untouched. Prints the settings that make
    the failure appear and disappear. When the stage is inductor, the recorded Inductor settings
    that differ from their defaults are then put back to their defaults, all, then halves, to
    name the ones the failure needs (a report without them does not fail upstream).
    """

    settings = reproarchive.ReplaySettings(backend=backend, device=device, tol=tol, current_config=current_config)
    show = None if (quiet or as_json) else (lambda step: click.echo(terminal_lines(step_line(step)), err=True))
    result = reproarchive.bisect_compiler(archive, settings, max_time=max_time, on_step=show,
                                          first_backend=first_backend, config_only=config_only, repeat=repeat)
    # an unfinished search never replaces a finished one, nor a search of the settings alone a stage's
    if sidecar and result.status == "found" and not config_only:
        internal.write_bisection(result, archive)
    _report(result, archive, compiler_lines, summary_path=summary_path, as_json=as_json)


@bisect_group.command("torch", epilog=TORCH_EPILOG)
@click.argument("archive", type=click.Path(dir_okay=False))
@click.option("--env", "interpreters", multiple=True, metavar="PYTHON",
              help="An environment to replay in: the path of its Python interpreter. Give several, in order "
                   "(oldest torch first); each replays with its own installed reproarchive, or with this "
                   "one's code when it has none.")
@click.option("--torch", "torch_specs", multiple=True, metavar="SPEC",
              help="Instead of --env: an environment for this torch (2.13.0, a requirement such as "
                   "'torch>=2.12,<2.13', or a wheel file), built with pip once and reused. Give several, in order.")
@click.option("--torch-nightly", "nightlies", metavar="FROM..TO",
              help="After any --torch: the nightly builds dated FROM..TO (2026-11-01..2026-11-20), oldest first, "
                   "as pip finds them (pre-releases, and --index-url), each built once and reused.")
@click.option("--index-url", metavar="URL",
              help="With --torch-nightly: an index that serves the nightlies, besides pip's own "
                   "(https://download.pytorch.org/whl/nightly/cpu).")
@click.option("--search", type=click.Choice(["binary", "linear"]), default="binary", show_default=True,
              help="binary: replay (and build) about log2(N)+2 of the N environments, as git bisect does; "
                   "linear: every one, in order.")
@click.option("--env-cache", type=click.Path(file_okay=False), metavar="DIR",
              help="Where --torch environments are kept (default: ~/.cache/reproarchive/torch-envs).")
@click.option("--backend", metavar="NAME", help="Replay with NAME in every environment (default: the archive's).")
@click.option("--max-time", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Stop after this long (status incomplete, exit 3).")
@click.option("--repeat", type=click.IntRange(min=1), default=None, metavar="N",
              help="Replay up to N times in each environment: one failure makes it bad, and replays that "
                   "disagree are reported as flaky. Default: once each, then the first bad environment 4 times "
                   "to measure its failure rate, and the good ones before it as often as that rate needs to "
                   "miss a failure under 1% of the time (at most 20; once for a failure that never passed).")
@click.option("--summary", "summary_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Also write a summary for a bug report to FILE (Markdown; HTML for .html).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines.")
def torch_cmd(archive, interpreters, torch_specs, nightlies, index_url, search, env_cache, backend, max_time,
              repeat, summary_path, as_json, quiet):
    """Replay ARCHIVE under several Python environments and name the first where it fails.

    Verdicts: good, bad (the recorded failure's signature), different failure, or cannot load
    here (that environment's reproarchive refuses the archive, or its torch lacks the backend,
    device or an operator: skipped, as git bisect skips 125). The torch commits between the last
    good and the first bad environment come from torch.version.git_version.
    """

    if index_url and not nightlies:
        raise click.UsageError("--index-url only applies with --torch-nightly")
    show = None if (quiet or as_json) else (lambda v: click.echo(terminal_lines(env_line(v)), err=True))

    def building(requirement, folder):
        if not (quiet or as_json):
            click.echo(terminal_lines(f"building an environment for {requirement} in {folder} (pip install; "
                                      "once, then reused)"), err=True)

    result = reproarchive.bisect_torch(archive, list(interpreters), backend=backend, max_time=max_time,
                                       on_verdict=show, repeat=repeat, torch_specs=tuple(torch_specs),
                                       env_cache=Path(env_cache) if env_cache else None, on_build=building,
                                       nightlies=nightlies, index_url=index_url, search=search)
    _report(result, archive, torch_lines, summary_path=summary_path, as_json=as_json)
