"""``reproarchive triage``: a fleet of archives grouped by bug, one per group replayed and minified."""

from __future__ import annotations

import json

import click

import reproarchive
from reproarchive import _internal as internal

from .app import emit_json, json_errors, main
from .exit_codes import INTERNAL, INTERRUPTED, STORE_UNREACHABLE, exit_codes
from .text import human_size, terminal_safe

TRIAGE_EPILOG = exit_codes(
    (0, "every task reached a verdict (the table says which groups still fail)"),
    (1, "some task crashed, ran past --max-time or could not start: the report names them, the other tasks "
        "finished"),
    (2, "usage error, or the source is one archive rather than a fleet"),
    (4, "the source folder or list is missing or cannot be read"),
    STORE_UNREACHABLE, INTERNAL, INTERRUPTED,
)


@main.command("triage", epilog=TRIAGE_EPILOG)
@click.argument("source")
@click.option("-j", "--jobs", type=click.IntRange(1), default=2, show_default=True,
              help="Tasks at a time (local engine): each in a fresh process.")
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="Where tasks run: fresh local processes, or a Ray cluster (pip install 'reproarchive[ray]').")
@click.option("--address", help="Ray: the cluster (ray://HEAD:10001, or auto); default RAY_ADDRESS, else a local Ray.")
@click.option("--task-cpus", type=float, default=1, show_default=True, help="Ray: CPUs each task asks for.")
@click.option("--task-gpus", type=float, default=0, show_default=True, help="Ray: GPUs each task asks for.")
@click.option("--task-resources", help='Ray: custom resources each task asks for, as JSON ({"H100": 1}).')
@click.option("--action", "actions", multiple=True, type=click.Choice(["replay", "minify", "bisect", "doctor"]),
              help="What to run on one archive per group (repeatable; default: replay and minify). bisect: "
                   "bisect compiler, the stage, pass or setting the failure needs (after replay reproduced it).")
@click.option("--by", "level", type=click.Choice(["failure", "node", "structure"]), default="node",
              show_default=True,
              help="Group depth: the failure signature; plus the failing node's target; plus the graph near it.")
@click.option("--no-merge", is_flag=True,
              help="Keep groups apart whose representatives minified to the same culprit (default: merged).")
@click.option("--max-time", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Stop a task past this many seconds (reported as timed out).")
@click.option("--repeat", type=click.IntRange(min=1), default=None, metavar="N",
              help="Replay each group's representative N times, each in a fresh process: one that reproduces "
                   "makes the group fail, and replays that disagree mark it flaky. Default: 4 (a cached verdict "
                   "of fewer replays is topped up).")
@click.option("--group-only", is_flag=True, help="Group and report cached verdicts; run nothing.")
@click.option("--against", metavar="ENV",
              help="Compare with another environment: which groups are fixed, still fail, fail differently. A digest "
                   "prefix reads the verdicts cached for it; an interpreter (a path) or a torch (2.14.1, a "
                   "requirement or a wheel file, built with pip once and reused) replays there each group that "
                   "still fails here.")
@click.option("--trust-backend", "trusted", multiple=True, metavar="MODULE:FUNCTION",
              help="A recorded custom compiler the replays may import (repeatable).")
@click.option("--device", help="Replay on this device instead of the recorded one.")
@click.option("--html", "html", type=click.Path(dir_okay=False), help="Also write the report as an HTML page.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (an error too).")
@click.pass_context
def triage_cmd(ctx, source, jobs, engine, address, task_cpus, task_gpus, task_resources, actions, level, no_merge,
               max_time, repeat, group_only, against, trusted, device, html, as_json):
    """Group the archives in SOURCE (a folder, a file listing archives, or a store URL) by bug,
    replay and minify one archive per group, and report each group's verdict.

    Grouping reads indexes only; groups whose representatives minified to the same culprit (the
    same stage, exception type and ops) are then merged: one bug said in several ways. Tasks
    run in fresh processes (a crash or hang costs one task), on this machine (-j N) or on Ray
    (--engine ray). Every verdict is cached next to the
    archives (the store, or SOURCE/.reproarchive-triage), keyed by archive, action and
    environment: a rerun, or a teammate's run, does only what is missing.
    """

    with json_errors(as_json):
        settings = reproarchive.ReplaySettings(device=device)
        if engine == "ray":
            resources = _resources(task_resources)
            executor = reproarchive.RayExecutor(address, num_cpus=task_cpus, num_gpus=task_gpus, resources=resources)
        else:
            executor = reproarchive.LocalExecutor(jobs)
        with executor:
            report = reproarchive.triage_fleet(source, actions=tuple(actions) or ("replay", "minify"),
                                               executor=executor,
                                         settings=settings, trusted_backends=tuple(trusted), level=level,
                                         max_time=max_time, against=against, run=not group_only,
                                         progress=_progress, merge=not no_merge, repeat=repeat)
        page = internal.write_triage_page(report, html) if html else None
    if as_json:
        emit_json(report.to_plain())
    else:
        click.echo("\n".join(format_report(report)))
        if page:
            click.echo(terminal_safe(f"wrote {page['output']} ({page['groups']} groups)"))
    ctx.exit(0 if report.complete else 1)


def _resources(text: str | None) -> dict | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict) or not all(isinstance(v, (int, float)) for v in value.values()):
        raise click.UsageError(f"--task-resources {text!r} is not a JSON object of numbers, e.g. '{{\"H100\": 1}}'")
    return value


def _progress(event: dict) -> None:
    if event["event"] == "building":
        click.echo(terminal_safe(f"building an environment for {event['requirement']} in {event['folder']} "
                                 "(pip install; once, then reused)"), err=True)
    elif event["event"] == "signed":
        click.echo(f"read {event['done']}/{event['total']} indexes", err=True)
    elif event["event"] == "verdict":
        v = event["verdict"]
        detail = v.signal or v.kind or ""
        click.echo(terminal_safe(f"[{event['done']}/{event['total']}] {v.action} {event['archive']}: {v.status}"
                                 f"{f' ({detail})' if detail else ''} in {v.elapsed_s:.1f} s"), err=True)


def _minified(verdict) -> str:
    if verdict is None:
        return ""
    if verdict.minified is None:
        return verdict.status
    m = verdict.minified
    return f"{m.ops} ops, {human_size(m.bytes)}"


def _clipped(text: str, width: int = 100) -> str:
    """A signature cut to ``width``, keeping its `` @target`` end (what tells merged ones apart)."""
    if len(text) <= width:
        return text
    _, at, target = text.rpartition(" @")
    tail = f"{at}{target}" if at and len(target) < width // 2 else ""
    return text[:width - len(tail) - 3] + "..." + tail


def format_report(r) -> list[str]:
    """The table: group, count, first/last seen, verdict, minified size, signature."""
    lines = [f"{r.archives} archives in {len(r.groups)} groups (by {r.level}); {r.environment.label}; "
             f"{r.tasks['run']} tasks run, {r.tasks['cached']} cached, {r.elapsed_s:.1f} s"]
    against = r.against is not None
    header = f"{'#':>3} {'count':>5}  {'first seen':<16} {'last seen':<16} {'verdict':<18} {'minified':<18}"
    header += f" {'against':<18}" if against else ""
    lines.append(header + " signature")
    for g in r.groups:
        replay = g.verdicts.get("replay")
        verdict = (replay.status + (" (cached)" if "replay" in g.cached else "")) if replay else "not run"
        if replay and replay.failed_to_run and replay.signal:
            verdict = f"{replay.status} {replay.signal}"
        row = (f"{g.number:>3} {g.count:>5}  {g.first_seen[:16].replace('T', ' '):<16} "
               f"{g.last_seen[:16].replace('T', ' '):<16} {verdict:<18} {_minified(g.verdicts.get('minify')):<18}")
        if against:
            row += f" {(g.against.status if g.against else ''):<18}"
        lines.append(terminal_safe(row + " " + _clipped(g.text)))
        if g.folded:
            lines.append(terminal_safe(f"{'':>10}one culprit, {g.culprit.text()}; merged with {len(g.folded)} "
                                       "more signature(s):"))
            lines.extend(terminal_safe(f"{'':>12}{f.count:>4}  {_clipped(f.text)}") for f in g.folded)
        if g.culprit is not None and g.culprit.where:  # the model line(s) the smallest failing graph came from
            lines.extend(terminal_safe(f"{'':>10}at {where}") for where in g.culprit.where)
        bisect = g.verdicts.get("bisect")
        if g.repeats is not None:
            lines.append(terminal_safe(f"{'':>10}replayed {replay.replay_count} times: {g.repeats.text}"))
        if bisect is not None and not bisect.failed_to_run:
            lines.append(terminal_safe(f"{'':>10}culprit: {bisect.message}"))
        if len(g.seen) > 1:  # more than this environment: the releases it fails and passes on
            seen = ", ".join(f"torch {s.torch} ({s.device}) {s.environment[7:15]}: {s.status}" for s in g.seen)
            lines.append(terminal_safe(f"{'':>10}replays cached: {seen}"))
    for u in r.unreadable:
        lines.append(terminal_safe(f"unreadable: {u.location}: {u.error}"))
    failed = [(g.number, a, v) for g in r.groups for a, v in g.verdicts.items() if v.failed_to_run]
    for number, action, v in failed:
        lines.append(terminal_safe(f"group {number}: {action} {v.status}: {v.message[:160]}"))
    lines.append(f"verdicts cached in {r.cache}")
    return lines
