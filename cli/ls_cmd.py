"""``ls``: what a source holds: the archives of a store, or the compiles of a TORCH_TRACE log
(or tlparse output).

Sources are told apart here, before anything is read: a store (a URL, or a folder holding a
store marker) lists its archives grouped by failure; a trace (a log file, the folder
TORCH_TRACE pointed at, a tlparse output folder) lists its compiles; anything else is refused
with one line.
"""

from __future__ import annotations

from pathlib import Path

import click

import reproarchive
from reproarchive import _internal as internal
from reproarchive.errors import SourceError

from .app import emit_json, json_errors, main
from .exit_codes import INTERNAL, exit_codes
from .store_cmds import print_store_listing


@main.command("ls", epilog=exit_codes(
    (0, "the listing was printed"),
    (2, "usage error (a URL of no known kind of store included), or a store's marker is of a newer layout"),
    (4, "SOURCE does not exist or is neither a store nor a trace, or the store (its bucket) does not exist"),
    (5, "the store cannot be reached or answered an error (credentials included)"),
    INTERNAL))
@click.argument("source")
@click.option("--rank", type=int, default=None, help="Only compiles of this rank.")
@click.option("--failed", is_flag=True, help="Only compiles that failed (what `pack` takes by default).")
@click.option("--json", "as_json", is_flag=True, help="Print the listing as JSON.")
def ls_cmd(source: str, rank: int | None, failed: bool, as_json: bool) -> None:
    """List the archives in a store, or the compiles in a TORCH_TRACE log.

    \b
    SOURCE is a store (s3://bucket/prefix, gs://..., az://..., memory://..., file://...,
    or a folder `reproarchive push` wrote to): one group per failure signature, so that
    twenty archives of one bug read as one bug, most recent first; in each, one line per
    archive:
      NAME     what `pull`, `run` and `inspect` take after STORE/
      PUSHED   when it was pushed (UTC)
      BACKEND  the compiler backend that failed
      OPS      operations in its graph
      INPUTS   inputs with real data / inputs without (generated at replay)
      LOGICAL  bytes of input data;  STORED  size of the archive file

    \b
    SOURCE is a TORCH_TRACE log file, the folder TORCH_TRACE pointed at (one log per rank and
    process), or a tlparse output folder. One line per compile:
      COMPILE  the compile id, as tlparse shows it ([frame/compile]); `pack --compile-id` takes it
      RANK     the rank, for distributed jobs
      FRAME    the compiled function and where it starts
      OPS      operations in its graph
      STATUS   ok, failed, or incomplete (the log ends inside it: a crash or a cut log);
               "(no graph)" when Dynamo logged no graph, "(graph damaged)" when its payload
               fails its MD5: either way there is nothing to pack
      REASON   the first line of the failure

    Problems in the log (truncated lines, payloads whose MD5 does not match, interleaved ranks)
    are warnings on stderr.
    """

    if internal.is_store(source):
        if rank is not None or failed:
            raise click.UsageError("--rank and --failed apply to TORCH_TRACE logs, not to stores")
        with json_errors(as_json):
            listing = reproarchive.list_store(source)
        if as_json:
            emit_json(listing)
        else:
            print_store_listing(listing)
        return
    source = Path(source)
    listing = _list_trace(source, as_json)
    rows = [r for r in listing["compiles"] if (rank is None or r["rank"] == rank)
            and (not failed or not r["status"].startswith("ok"))]
    listing["compiles"] = rows
    if as_json:
        emit_json(listing)
        return
    for line in listing["warnings"]:
        click.echo(f"warning: {line}", err=True)
    _print_compiles(rows)
    failed_count = sum(1 for r in rows if not r["status"].startswith("ok"))
    click.echo(f"{len(rows)} compile{'s' if len(rows) != 1 else ''}, {failed_count} failed or incomplete"
               + (f"; pack them with `reproarchive pack {source}`" if failed_count else ""), err=True)


def _list_trace(source: Path, as_json: bool) -> dict:
    """The compiles of a TORCH_TRACE source; one line (and exit 4) for a path that is not one."""

    with json_errors(as_json):
        if not source.exists():
            raise SourceError(f"{source} does not exist",
                              "name a store (a URL or a folder `reproarchive push` wrote to), "
                              "a TORCH_TRACE log or the folder TORCH_TRACE pointed at")
        if not internal.is_trace(source):
            raise SourceError(f"{source} is not a store, a TORCH_TRACE log, a folder of them, or a tlparse output "
                              "folder",
                              "ls lists the archives of a store (a URL or a folder `reproarchive push` wrote to) or "
                              "the compiles of a trace: name a log (dedicated_log_torch_trace_*.log) or the folder "
                              "TORCH_TRACE pointed at")
        return internal.list_trace(source)


def _print_compiles(rows: list[dict]) -> None:
    """One line per compile under a header; RANK only for ranked logs, LOG only when several logs."""
    with_rank = any(r["rank"] is not None for r in rows)
    several_logs = len({r["log"] for r in rows}) > 1
    table = []
    for r in rows:
        frame = r["frame"] or {}
        where = f"{frame.get('name') or '?'} ({Path(str(frame.get('file') or '?')).name}:{frame.get('line') or '?'})"
        reason = (r["fail_reason"] or "").strip().splitlines()
        cells = [f"[{r['compile_id']}]"]
        if with_rank:
            cells.append("" if r["rank"] is None else str(r["rank"]))
        cells += [where, "" if r["ops"] is None else str(r["ops"]), r["status"], reason[0][:100] if reason else ""]
        if several_logs:
            cells.append(r["log"])
        table.append(cells)
    header = ["COMPILE"] + (["RANK"] if with_rank else []) + ["FRAME", "OPS", "STATUS", "REASON"] \
        + (["LOG"] if several_logs else [])
    widths = [max(len(h), *(len(row[i]) for row in table)) if table else len(h) for i, h in enumerate(header)]
    for row in [header, *table]:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
