"""The Markdown bug reports that `--summary` writes (bisect, run, run --minify): the torch config
the failing run changed, as Python to paste before compiling, the command that replays it, and
the graph. A pasted report must reproduce upstream, where reproarchive is not installed."""

from __future__ import annotations

import shlex

import click

import reproarchive
from reproarchive import _internal as internal

#: a longer graph is left out of a report (the archive has it; ``export`` writes it as a script)
MAX_GRAPH_LINES = 120

#: ``run``'s options that change what is printed or written, not the replay: left out of the
#: command a report gives
_NOT_REPLAY = frozenset({"as_json", "quiet", "summary_path", "output"})

CONFIG_TITLE = "The torch config the failing run changed from the defaults (set it before compiling)"


def recorded_settings(archive) -> list[tuple[str, str, object]]:
    """``internal.recorded_config``; [] for an archive that cannot be read here (a summary
    is still written without it)."""

    try:
        return internal.recorded_config(archive)
    except reproarchive.ReproArchiveError:
        return []


def config_code(settings) -> str:
    """``settings`` as Python: the config modules imported, then each setting assigned."""
    return "\n".join([*(f"import {m}" for m in sorted({m for m, _, _ in settings})),
                      *(f"{m}.{k} = {v!r}" for m, k, v in settings)])


def replay_command(ctx: click.Context, archive: str) -> str:
    """``reproarchive run ARCHIVE`` with the replay options given on the command line, as
    words to paste: the report's command replays what the user replayed."""
    words = ["reproarchive", "run", str(archive)]
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or param.name in _NOT_REPLAY:
            continue
        if ctx.get_parameter_source(param.name) is not click.core.ParameterSource.COMMANDLINE:
            continue
        value, name = ctx.params[param.name], max(param.opts, key=len)
        if param.is_flag:
            words.append(name if value or not param.secondary_opts else max(param.secondary_opts, key=len))
        else:
            for one in value if param.multiple else (value,):
                words += [name, ",".join(f"{k}={v}" for k, v in one.items()) if isinstance(one, dict) else str(one)]
    return shlex.join(words)


def _failure_line(failure) -> list[str]:
    if failure is None:
        return ["- failure: none recorded"]
    first = (str(failure.message or "").strip().splitlines() or [""])[0][:300]
    return [f"- failure: {failure.stage}: {failure.exception_type}" + (f": {first}" if first else "")]


def _config_and_graph(settings, code: str | None, archive: str, graph_title: str) -> list[str]:
    """The config section (when the failing run changed any) and the graph's (when it is short)."""
    lines = ["", f"{CONFIG_TITLE}:", "", "```python", config_code(settings), "```"] if settings else []
    if code is None:
        return lines
    count = code.count("\n")
    if count > MAX_GRAPH_LINES:
        return lines + ["", f"{graph_title} has {count} lines, too many for a report: "
                            f"`reproarchive export {shlex.quote(str(archive))} DIR` writes it as a script."]
    return lines + ["", f"{graph_title}:", "", "```python", code.rstrip(), "```"]


def run_summary(outcome, *, archive: str, verdict: str, command: str) -> str:
    """Markdown for a bug report of a replay: its verdict as printed, what the archive recorded,
    the command that replays it, the versions, the config that matters and the graph."""
    from .text import terminal_lines

    info = reproarchive.inspect(archive)
    try:
        code = internal.graph_code(archive)
    except reproarchive.ReproArchiveError:
        code = None
    recorded = getattr(outcome, "recorded_torch", None) or (info.system.torch if info.system else None)
    lines = ["### reproarchive run", "", "```", verdict.rstrip(), "```", "", *_failure_line(info.failure),
             f"- torch {recorded or 'unknown'} when recorded, {outcome.torch} here",
             f"- replay it: `{command}`"]
    lines += _config_and_graph(recorded_settings(archive), code, archive, "The graph")
    return terminal_lines("\n".join(lines)) + "\n"


def not_original_inputs(report) -> list[str]:
    """Lines naming the minified graph's inputs that are not the original data (shrunk,
    generated, or computed from generated data), for the terminal and the report alike; []
    when every input is."""
    entries = report.stats.get("inputs") or []
    if all(e.get("real") for e in entries):
        return []
    lines = ["inputs that are not the original data:"]
    for name, entry in zip(_placeholder_names(report.code), entries):
        if entry.get("real"):
            continue
        what = [entry.get("values", "?")]
        if entry.get("shape"):
            what.append(f"shape {entry['shape']['recorded']} -> {entry['shape']['now']}")
        if entry.get("dtype"):
            what.append(f"dtype {entry['dtype']['recorded']} -> {entry['dtype']['now']}")
        if entry.get("from_absent"):
            what.append("computed from generated data (the original archive had none)")
        lines.append(f"  {name or entry.get('origin')}: {', '.join(what)}")
    return lines


def _placeholder_names(code: str) -> list[str]:
    """The forward's parameter names, in order (readable_code prints ``def forward(self, a, b):``)."""
    for line in code.splitlines():
        line = line.strip()
        if line.startswith("def forward(self"):
            inside = line[line.index("(") + 1: line.rindex(")")]
            return [p.split(":")[0].strip() for p in inside.split(",")[1:] if p.strip()]
    return []


def minify_summary(report, *, archive: str) -> str:
    """Markdown for a bug report of a minified archive: what failed, the command that replays
    it, the versions, the config that matters and the smallest failing graph."""
    import torch

    from .text import terminal_lines

    info = reproarchive.inspect(report.output)
    recorded_torch = info.system.torch if info.system is not None else None
    s = report.stats
    lines = ["### reproarchive minify", "", *_failure_line(info.failure)]
    lines += [f"- minified: {s['initial_ops']} -> {s['final_ops']} ops, {s['initial_inputs']} -> "
              f"{s['final_inputs']} inputs ({report.status})",
              f"- torch {recorded_torch or 'unknown'} when recorded, {torch.__version__} here",
              f"- replay it: `reproarchive run {report.output}` (minified from `{archive}`)"]
    changed = not_original_inputs(report)
    if changed:  # generated or shrunk data is never passed off as the original run's
        lines += ["", f"- {changed[0]}", *(f"  - {line.strip()}" for line in changed[1:])]
    lines += _config_and_graph(recorded_settings(report.output), report.code, report.output,
                               "The smallest failing graph")
    return terminal_lines("\n".join(lines)) + "\n"
