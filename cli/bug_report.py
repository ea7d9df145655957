"""The parts of a Markdown bug report that `--summary` writes (bisect, run --minify): the torch
config the failing run changed, as Python to paste before compiling, and the minified graph's
report. A pasted report must reproduce upstream, where reproarchive is not installed."""

from __future__ import annotations

import reproarchive

CONFIG_TITLE = "The torch config the failing run changed from the defaults (set it before compiling)"


def recorded_settings(archive) -> list[tuple[str, str, object]]:
    """``reproarchive.recorded_config``; [] for an archive that cannot be read here (a summary
    is still written without it)."""

    try:
        return reproarchive.recorded_config(archive)
    except reproarchive.ReproArchiveError:
        return []


def config_code(settings) -> str:
    """``settings`` as Python: the config modules imported, then each setting assigned."""
    return "\n".join([*(f"import {m}" for m in sorted({m for m, _, _ in settings})),
                      *(f"{m}.{k} = {v!r}" for m, k, v in settings)])


def minify_summary(report, *, archive: str) -> str:
    """Markdown for a bug report of a minified archive: what failed, the command that replays
    it, the versions, the config that matters and the smallest failing graph."""
    import torch

    from .text import terminal_lines

    info = reproarchive.inspect(report.output)
    settings, failure = recorded_settings(report.output), info.failure
    recorded_torch = info.system.torch if info.system is not None else None
    s = report.stats
    lines = ["### reproarchive minify", ""]
    if failure is not None:
        first = (str(failure.message or "").strip().splitlines() or [""])[0][:300]
        lines.append(f"- failure: {failure.stage}: {failure.exception_type}" + (f": {first}" if first else ""))
    lines += [f"- minified: {s['initial_ops']} -> {s['final_ops']} ops, {s['initial_inputs']} -> "
              f"{s['final_inputs']} inputs ({report.status})",
              f"- torch {recorded_torch or 'unknown'} when recorded, {torch.__version__} here",
              f"- replay it: `reproarchive run {report.output}` (minified from `{archive}`)"]
    if settings:
        lines += ["", f"{CONFIG_TITLE}:", "", "```python", config_code(settings), "```"]
    lines += ["", "The smallest failing graph:", "", "```python", report.code.rstrip(), "```"]
    return terminal_lines("\n".join(lines)) + "\n"
