"""``triage --html``: the fleet's report as one self-contained page, in the style of ``view``.

One section per group: the failure (each level of its signature), the verdicts per environment,
the minified graph's code, the members. The report travels as inert JSON in the page (every
``<``, ``>`` and ``&`` escaped, so no string from an archive can close the script element) and
the page's script builds the document with ``textContent`` only; nothing is fetched.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path

from reproarchive.errors import ViewError
from reproarchive.format.atomic import atomic_file
from reproarchive.triage.fleet import TriageReport

_ESCAPES = (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029"))


def render(report: TriageReport) -> str:
    payload = json.dumps(report.to_plain(), separators=(",", ":"), default=str, ensure_ascii=False)
    for ch, esc in _ESCAPES:
        payload = payload.replace(ch, esc)
    template = resources.files("reproarchive.triage").joinpath("fleet_page.html").read_text(encoding="utf-8")
    title = report.source.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return template.replace("__TITLE__", title).replace("__REPORT_JSON__", payload)


def write_triage_page(report: TriageReport, output: str | os.PathLike) -> dict:
    """Write the page to ``output`` (atomically); what was written."""
    out = Path(output)
    page = render(report).encode("utf-8")
    try:
        with atomic_file(out, fsync=False) as f:
            f.write(page)
    except OSError as exc:
        raise ViewError(f"cannot write {out}: {exc.strerror or exc}", "choose another --html path") from None
    return {"output": str(out), "bytes": len(page), "groups": len(report.groups)}
