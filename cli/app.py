"""The click group, its global options, and how errors turn into exit codes."""

from __future__ import annotations

import contextlib
import json
import os
import select
import sys
import traceback
import warnings

import click

# torch prints this on import when numpy is absent (torch does not require numpy, and neither do
# we); it would turn every one-line error of ours into three lines.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

from reproarchive import ReproArchiveError, warm_children  # noqa: E402 (after the filter above)
from reproarchive.errors import ErrorCode  # noqa: E402

from .text import terminal_safe  # noqa: E402

EXIT_CODES_HELP = """\b
Exit codes:
  0    success (run: the graph passed; bisect: a culprit was named)
  1    run: the recorded failure reproduced; diff: the archives differ
  2    usage error (a store URL of no known kind included), or the archive is invalid,
       damaged, unsafe or too new
  3    run: a different failure than the recorded one; bisect: no culprit named
  4    an input file or folder (an archive included) is missing or unusable, or a store
       or the name asked for in it does not exist
  5    a store cannot be reached or answered an error (push, pull, ls, --store)
  6    run: passed, compile only (compiled for the recorded GPU without it; nothing ran)
  70   internal error (a bug in reproarchive; --debug shows the traceback)
  125  run: cannot run here (device or backend unavailable; or a multi-rank job's collectives,
       which replay only with its ranks launched)
  130  interrupted (Ctrl-C); partial results are removed or kept as stated
  141  the reader of stdout went away (piped into head): stops quietly, as Unix tools do
"""


class _Group(click.Group):
    """Turns our errors into one line and an exit code, never a traceback (unless --debug)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """``--debug`` is the group's option, and a user types it after the command too
        (``reproarchive run --debug X``): taken from there, up to ``--`` or, for a command that
        runs a program (``capture``), up to the program's first word, which owns the rest."""
        try:
            return super().parse_args(ctx, _debug_first(self, args))
        except click.UsageError as err:  # an option of the group itself (``reproarchive --bogus``)
            if type(err).__name__ == "NoArgsIsHelpError":  # plain ``reproarchive``: the help, as click gives it
                raise
            ctx.ensure_object(dict)["argv"] = list(args)
            _fail(ctx, f"{err.format_message()} (see `reproarchive --help`)", 2)

    def invoke(self, ctx: click.Context):
        warnings.showwarning = _show_warning
        protected = getattr(ctx, "_protected_args", None)
        ctx.ensure_object(dict)["argv"] = [*(ctx.protected_args if protected is None else protected), *ctx.args]
        try:
            return super().invoke(ctx)
        except ReproArchiveError as err:
            _fail(ctx, str(err), err.exit_code)
        except KeyboardInterrupt:
            _fail(ctx, "interrupted", 130)
        except BrokenPipeError:
            if not _stdout_closed():
                raise
            _quiet_exit()
        except OSError as err:
            what = f"{err.strerror or err}: {err.filename or ''}".rstrip(": ")
            _fail(ctx, f"{what}; check the path (and that you may read or write it)", 4)
        except click.UsageError as err:  # click's own usage errors: one line too, exit 2
            where = f"reproarchive {err.ctx.command_path.split(' ', 1)[1]}" if err.ctx and " " in err.ctx.command_path \
                else "reproarchive"
            _fail(ctx, f"{err.format_message()} (see `{where} --help`)", 2)
        except (click.exceptions.Exit, click.ClickException, SystemExit):
            raise
        except Exception as err:  # a bug of ours: still one line, the traceback behind --debug
            _fail(ctx, f"unexpected {type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''} "
                       "(rerun with --debug and report this)", 70)


def _debug_first(group: click.Group, args: list[str]) -> list[str]:
    at = next((i for i, a in enumerate(args) if a in group.commands), None)
    if at is None:
        return args
    command = group.commands[args[at]]
    interspersed = command.context_settings.get("allow_interspersed_args", True)
    end = len(args)
    for i in range(at + 1, len(args)):
        if args[i] == "--" or (not interspersed and not args[i].startswith("-")):
            end = i
            break
    if "--debug" not in args[at + 1:end]:
        return args
    return ["--debug", *[a for i, a in enumerate(args) if not (at < i < end and a == "--debug")]]


def _stdout_closed() -> bool:
    """Whether the reader of stdout went away (``reproarchive ls STORE | head``), as opposed to
    some other pipe breaking."""

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return True


def _quiet_exit() -> None:
    """Stop as a Unix tool stops when its reader goes away: no message, the status a shell
    reports for SIGPIPE. stdout now points at /dev/null, so that flushing what is left on
    the way out cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sys.exit(141)


def _fail(ctx: click.Context, message: str, code: int) -> None:
    exc = sys.exc_info()[1]
    if (ctx.obj or {}).get("debug"):
        traceback.print_exc()
        if getattr(exc, "child_traceback", None):  # raised in a child process: its own traceback
            click.echo(f"in the child process:\n{exc.child_traceback}", err=True, nl=False)
    if "--json" in (ctx.obj or {}).get("argv", ()) and not getattr(exc, "json_emitted", False):
        emit_json(error_document(message, code, exc))  # every command with --json says it in JSON too
    click.echo(f"error: {terminal_safe(message)}", err=True)  # one line, whatever the archive said
    sys.exit(code)


def error_document(message: str, code: int, exc: BaseException | None) -> dict:
    """What a failing ``--json`` command prints: ``{"error": {"message", "what", "hint",
    "code", "class", "rule", "exit_code"}, "exit_code"}``. ``what``/``hint`` are the two halves
    of our own errors; ``code`` is the stable code to match on (README "Exit codes"), ``class``
    the error's class and ``rule`` the spec rule an archive broke (or null)."""
    error = {"message": message, "exit_code": code, "code": str(_error_code(exc)),
             "class": type(exc).__name__ if exc is not None else None, "rule": None}
    if isinstance(exc, ReproArchiveError):
        error.update(what=exc.what, hint=exc.hint, rule=str(exc.rule) if exc.rule else None)
    return {"error": error, "exit_code": code}


def _error_code(exc: BaseException | None) -> ErrorCode:
    """The stable code of what ended the command: ours, or the CLI's own four."""
    if isinstance(exc, ReproArchiveError):
        return exc.code
    if isinstance(exc, click.UsageError):
        return ErrorCode.USAGE
    if isinstance(exc, KeyboardInterrupt):
        return ErrorCode.INTERRUPTED
    if isinstance(exc, OSError):
        return ErrorCode.IO
    return ErrorCode.INTERNAL


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Python warnings (ours and torch's) as one ``warning:`` line each, terminal-safe: their
    text can quote an archive."""
    click.echo(f"warning: {terminal_safe(message)}", err=True)


@click.group(cls=_Group, epilog=EXIT_CODES_HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show Python tracebacks for errors.")
@click.version_option(package_name="reproarchive")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Pack, verify, replay and minify torch.compile failures as one portable file."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    # a command that starts several children of a kind (pack of a dump folder, triage) pays the
    # torch import once; one child costs what a started one does
    ctx.with_resource(warm_children())


def emit_json(obj) -> None:
    """Machine-readable output: one JSON document on stdout."""
    click.echo(json.dumps(obj, indent=2, sort_keys=True, default=str))


@contextlib.contextmanager
def json_errors(as_json: bool):
    """With --json, an error still prints one JSON document on stdout (``error_document``)
    before the usual one line on stderr and the exit code."""
    try:
        yield
    except ReproArchiveError as err:
        if as_json:
            emit_json(error_document(str(err), err.exit_code, err))
            err.json_emitted = True
        raise
