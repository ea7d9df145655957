"""``push`` and ``pull``: share archives through a store (an S3/GCS/Azure bucket or a folder),
and what ``ls`` prints for a store."""

from __future__ import annotations

import click

import reproarchive

from .app import emit_json, json_errors, main
from .progress_bars import byte_bars
from .text import failure_title, file_digest, human_size

STORE_HELP = """\b
STORE is an fsspec URL: s3://bucket/prefix, gs://bucket/prefix, az://container/prefix,
memory://name, file:///path, or a local folder. S3 needs `pip install 'reproarchive[store]'`
(GCS: gcsfs, Azure: adlfs). Credentials and endpoints come from the usual places
(AWS_PROFILE, AWS_ENDPOINT_URL, ...)."""

STORE_EXIT_CODES = """\b
Exit codes:
  0    success
  2    usage error (an unknown kind of store URL included), or an archive, or an object in
       the store, is invalid, damaged or does not match its digest
  4    an archive file, the store (its bucket), or the name asked for does not exist, or
       (pull) the output file exists and holds another archive (see --force)
  5    the store cannot be reached or answered an error (credentials included)
  70   internal error (a bug in reproarchive; --debug shows the traceback)
  130  interrupted (nothing is named in the store until an archive is complete)
"""


@main.command("push", epilog=STORE_EXIT_CODES)
@click.argument("archives", nargs=-1, required=True)
@click.argument("store")
@click.option("--name", metavar="NAME", help="Name for the archive in the store (one archive only). "
                                            "Default: the file name without .tar.zst, a dash and 12 digits of its "
                                            "digest.")
@click.option("-j", "--jobs", type=click.IntRange(1, 64), default=8, show_default=True, help="Parallel uploads.")
@click.option("--repair", is_flag=True,
              help="Read back every blob the store already holds for these archives and replace any whose bytes "
                   "differ from ours (a plain push trusts a blob of the right size, unless `fsck` marked it).")
@click.option("--json", "as_json", is_flag=True, help="Print what was pushed as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def push_cmd(archives: tuple[str, ...], store: str, name: str | None, jobs: int, repair: bool, as_json: bool,
             quiet: bool) -> None:
    """Upload ARCHIVE... to STORE, sending only the blobs the store does not hold yet.

    \b
    Blobs go first (each checked against its digest before it leaves), then the archive's
    own small object, then its name: an interrupted push names nothing, and pushing again
    sends only what is still missing. Archives of one model share most blobs, so the second
    failure of a model costs a fraction of the first. Prints one line per archive: its name,
    digest and how much was uploaded. A blob already there is reused unread, unless `fsck`
    recorded it damaged or --repair is given: then it is read back and, if its bytes are not
    ours, replaced (after ours are checked against its name).
    """

    if name is not None and len(archives) != 1:
        raise click.UsageError("--name names one archive; push several without it")
    with json_errors(as_json), byte_bars(not (quiet or as_json)) as progress:
        results = reproarchive.push(list(archives), store, name=name, jobs=jobs, progress=progress, repair=repair)
    if as_json:
        emit_json({"store": store, "pushed": [r.to_json() for r in results]})
        return
    for r in results:
        click.echo(push_line(r))


def push_line(r) -> str:
    moved = f" (the name pointed to {file_digest(r.replaced)} before)" if r.replaced else ""
    fixed = (f"; replaced {len(r.repaired_blobs)} damaged blob{'s' if len(r.repaired_blobs) != 1 else ''}"
             if r.repaired_blobs else "")
    return (f"pushed {r.archive} as {r.store}/{r.name}  {file_digest(r.digest)}  "
            f"sent {human_size(r.uploaded_bytes)} for {human_size(r.size)} "
            f"({r.uploaded_blobs} of {r.blobs} blobs were new{fixed}){moved}")


@main.command("pull", epilog=STORE_EXIT_CODES)
@click.argument("reference")
@click.option("-o", "--output", type=click.Path(), default=None,
              help="File to write (default: ./NAME.tar.zst; a folder gets NAME.tar.zst inside).")
@click.option("-f", "--force", is_flag=True, help="Replace an existing output file that holds other bytes.")
@click.option("-j", "--jobs", type=click.IntRange(1, 64), default=8, show_default=True, help="Parallel downloads.")
@click.option("--json", "as_json", is_flag=True, help="Print what was pulled as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def pull_cmd(reference: str, output: str | None, force: bool, jobs: int, as_json: bool, quiet: bool) -> None:
    """Download the archive REFERENCE names (STORE/NAME or STORE/DIGEST-PREFIX), byte-identical.

    DIGEST-PREFIX is at least 4 hex digits of either digest: the file's (`push`, `ls`, `pull`
    print it as "file sha256:...") or the index's (`inspect`, `verify`, `diff` print it as
    "index sha256:...").

    \b
    The archive is rebuilt from the blobs and its own object, each checked against the
    digest and size recorded at push; the file must hash to the archive's digest and pass
    `verify` before it appears under its name. A damaged or replaced object is named, and
    nothing is written. An existing output file is kept when it already is the archive, and
    refused (exit 4) when it is not, unless --force. `run`, `inspect` and `load` take
    REFERENCE directly too.
    """

    with json_errors(as_json), byte_bars(not (quiet or as_json)) as progress:
        result = reproarchive.pull(reference, output, jobs=jobs, progress=progress, force=force)
    if as_json:
        emit_json(result.to_json())
        return
    click.echo(f"pulled {result.path} ({human_size(result.size)}, {file_digest(result.digest)}, verified)")


FSCK_EXIT_CODES = """\b
Exit codes:
  0    every blob checked is intact
  1    damaged blob objects were found (listed, with the archives they break)
  2    usage error, or the store's marker is of a newer layout
  4    the store (its bucket) does not exist, or a blob named with --blob is not in it
  5    the store cannot be reached or answered an error (credentials included)
  70   internal error (a bug in reproarchive; --debug shows the traceback)
  130  interrupted (damage found so far is not recorded)
"""


@main.command("fsck", epilog=FSCK_EXIT_CODES)
@click.argument("store")
@click.option("--sample", type=click.IntRange(1, None), default=None, metavar="N",
              help="Check N blob objects chosen at random instead of all.")
@click.option("--seed", type=int, default=None, help="Seed of the --sample choice (a repeatable sample).")
@click.option("--blob", "blobs", multiple=True, metavar="KEY",
              help="Check this blob object only (as a failed pull names it: blobs/sha256/<hex>, or a hex prefix); "
                   "repeatable.")
@click.option("--no-mark", is_flag=True, help="Only report; do not record the damage in the store.")
@click.option("-j", "--jobs", type=click.IntRange(1, 64), default=8, show_default=True, help="Parallel reads.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def fsck_cmd(store: str, sample: int | None, seed: int | None, blobs: tuple[str, ...], no_mark: bool, jobs: int,
             as_json: bool, quiet: bool) -> None:
    """Rehash the blob objects of STORE and name the damaged ones and the archives they break.

    \b
    Each blob object is decompressed and hashed against the digest in its name, and its bytes
    against the size and sha256 every archive object using it recorded. A push trusts a blob it
    finds with the right size, so damage stays until something looks: this does, and records
    each damaged blob in the store (damaged/..., spec §11.1) so that the next push of any
    archive holding a good copy replaces it. `push --repair` replaces damage without a check.
    """

    with json_errors(as_json), byte_bars(not (quiet or as_json)) as progress:
        report = reproarchive.check_store(store, sample=sample, seed=seed, blobs=blobs, mark=not no_mark, jobs=jobs,
                                          progress=progress)
    if as_json:
        emit_json(report.to_json())
    else:
        for d in report.damaged:
            users = ", ".join(d.archives[:5]) + (f" and {len(d.archives) - 5} more" if len(d.archives) > 5 else "")
            click.echo(f"DAMAGED {d.key}: {d.reason}" + (f"; breaks {users}" if users else ""))
        what = f"{report.blobs_checked} of {report.blobs_total}" if report.sampled else f"all {report.blobs_total}"
        verdict = (f"{len(report.damaged)} damaged" if report.damaged else "all intact")
        click.echo(f"checked {what} blob objects ({human_size(report.bytes_checked)}) in {report.store}: {verdict}")
        if report.damaged:
            click.echo(f"repair: `reproarchive push --repair GOOD_COPY.tar.zst {report.store}` (or any push of an "
                       "archive holding the blob, now that it is marked)", err=True)
    click.get_current_context().exit(1 if report.damaged else 0)


pull_cmd.help = (pull_cmd.help or "") + "\n\n" + STORE_HELP
push_cmd.help = (push_cmd.help or "") + "\n\n" + STORE_HELP


def print_store_listing(listing: dict) -> None:
    """One group per failure signature (most recent first), one line per archive."""
    for line in listing["warnings"]:
        click.echo(f"warning: {line}", err=True)
    header = ["NAME", "PUSHED", "BACKEND", "OPS", "INPUTS", "LOGICAL", "STORED"]
    for group in listing["groups"]:
        failure = group["failure"]
        if failure:
            what = failure_title(failure)
            message = f": {failure['message'][:100]}" if failure.get("message") else ""
            title = f"{what}{message}"
        else:
            title = group["signature"]
        count = len(group["archives"])
        click.echo(f"{title}  [{count} archive{'s' if count != 1 else ''}]")
        table = []
        for row in group["archives"]:
            inputs = row["inputs"]
            table.append([
                row["name"], row["pushed"].replace("T", " ").rstrip("Z"), row["backend"] or "?",
                "?" if row["ops"] is None else str(row["ops"]),
                f"{inputs.get('real') or 0} real / {inputs.get('absent') or 0} absent",
                "?" if row["bytes_logical"] is None else human_size(row["bytes_logical"]),
                human_size(row["bytes_stored"]),
            ])
        widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(header)]
        for row in [header, *table]:
            click.echo("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    n, groups = listing["archives"], len(listing["groups"])
    click.echo(f"{n} archive{'s' if n != 1 else ''}, {groups} distinct failure{'s' if groups != 1 else ''} in "
               f"{listing['store']}",
               err=True)
