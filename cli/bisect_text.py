"""What ``bisect compiler`` and ``bisect torch`` print for people, and the summary they write for
a bug report (Markdown, or HTML for a ``.html`` file)."""

from __future__ import annotations

import html

from .bug_report import CONFIG_TITLE, MAX_GRAPH_LINES, config_code


def step_line(step) -> str:
    """One progress line per replay of ``bisect compiler``."""
    where = step.backend + (f" / {step.subsystem}" if step.subsystem else "")
    state = f" {step.state}" if step.state else ""
    if step.bisect_range:
        low, high = step.bisect_range
        state += f" [{low}, {high}] on up to {(low + high) // 2}"
    if not step.replayed:
        return f"bisect: {where}: taken as good (before --from)"
    seen = f" ({step.observed})" if step.observed and step.verdict != "bad" else ""
    return f"bisect: {where}{state}: {step.verdict}{seen} in {step.seconds:.1f}s"


def env_line(verdict) -> str:
    """One progress line per environment of ``bisect torch``."""
    extra = f" ({verdict.reason})" if verdict.reason else ""
    return f"bisect: {verdict.label}: torch {verdict.torch or '?'}: {verdict.verdict}{extra}"


def compiler_lines(result) -> list[str]:
    """The result of ``bisect compiler`` with the settings that make the failure appear and go."""
    lines = [result.summary]
    if result.status == "found":
        if result.debug_info:
            lines.append(f"  debug info (PyTorch): {result.debug_info}")
        if result.appear is not None:
            lines.append("  the failure appears with:")
            lines.append("    " + _trial_text(result.appear, result.archive))
        if result.disappear is not None:
            lines.append("  and disappears with:")
            lines.append("    " + _trial_text(result.disappear, result.archive))
    lines += _flag_lines(result)
    lines.append(f"  {result.replays} replays in {result.seconds:.0f}s (torch {result.torch}, "
                 f"replayed with {result.replayed_backend} at the inductor stage)")
    if result.other_failures:
        lines.append(f"  {result.other_failures} replays failed differently from the recorded failure; "
                     "they counted as not reproducing it (see --json)")
    return lines


def _flag_lines(result) -> list[str]:
    """What the search of the recorded Inductor settings found (``bisect.config_flags``)."""
    flags = result.config_flags
    if flags is None:
        return []
    lines = []
    if flags.status == "needed":
        lines.append("  the recorded settings it needs (with them at their defaults it is gone):")
        lines += [f"    {f.setting} = {f.recorded}  (default {f.default})" for f in flags.needed]
    elif flags.status == "none needed":
        lines.append(f"  it fails with all {len(flags.searched)} recorded Inductor setting(s) at their defaults: "
                     "none is needed")
    else:
        lines.append(f"  recorded settings: {flags.text}")
    lines += [f"  not searched: {what}" for what in flags.left_out]
    return lines


def _trial_text(trial, archive: str) -> str:
    config = "".join(f"  # with {k} = {v}" for k, v in sorted(trial.config.items()))
    return trial.command(archive) + config


def torch_lines(result) -> list[str]:
    lines = [result.summary]
    for v in result.verdicts:
        lines.append(f"  {v.verdict:<18} {v.label}  torch {v.torch or '?'} ({v.git_version or 'no git version'}), "
                     f"read by {v.reader}" + (f": {v.reason}" if v.reason else ""))
    if result.commit_range:
        lines.append(f"  commits to look at: {result.commit_range}")
    return lines


def summary(result, *, graph: str | None, html_page: bool, settings=()) -> str:
    """A summary to paste into a bug report: what was found, how to see it, the torch config
    the failing run changed (``settings``: (module, key, value), as a replay applies them), the
    graph."""
    if hasattr(result, "verdicts"):
        body, title = torch_lines(result), "bisect torch"
    else:
        body, title = compiler_lines(result), "bisect compiler"
    if graph is not None and graph.count("\n") > MAX_GRAPH_LINES:
        graph = None
    config, config_title = config_code(settings), CONFIG_TITLE
    if html_page:
        parts = [f"<!doctype html><meta charset=utf-8><title>reproarchive {title}</title>",
                 f"<h1>reproarchive {title}</h1>", "<pre>" + html.escape("\n".join(body)) + "</pre>"]
        if settings:
            parts += [f"<h2>{html.escape(config_title)}</h2>", "<pre>" + html.escape(config) + "</pre>"]
        if graph is not None:
            parts += ["<h2>The graph</h2>", "<pre>" + html.escape(graph) + "</pre>"]
        return "\n".join(parts) + "\n"
    parts = [f"### reproarchive {title}", "", "```", *body, "```"]
    if settings:
        parts += ["", f"{config_title}:", "", "```python", config, "```"]
    if graph is not None:
        parts += ["", "The graph:", "", "```python", graph.rstrip(), "```"]
    return "\n".join(parts) + "\n"
