"""Text for people that more than one command prints."""

from __future__ import annotations

import unicodedata


def terminal_safe(text: object) -> str:
    """One line of text as a terminal may show it: every control character (C0, DEL, C1, so
    escape sequences and carriage returns), line and paragraph separator, and invisible
    formatting character (bidirectional overrides, zero-width characters, lone surrogates)
    written as its Python escape. Strings from an archive pass through here before they reach
    a terminal, so an archive cannot move the cursor, rewrite what was printed, change the
    title or hide text."""
    out = []
    for ch in str(text):
        if ch.isprintable() and unicodedata.category(ch) not in ("Cf", "Co", "Cs"):
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape", "backslashreplace").decode("ascii")
                       if ord(ch) < 0xD800 or ord(ch) > 0xDFFF else f"\\u{ord(ch):04x}")
    return "".join(out)


def terminal_lines(text: object) -> str:
    """Several lines, each ``terminal_safe``: the line breaks are ours, everything else is data."""
    return "\n".join(terminal_safe(line) for line in str(text).split("\n"))


def difference_line(d: dict) -> str:
    """One row of ``run``'s and ``doctor``'s differences for people. A side that has no such
    setting or variable says so in words: "None" would read as a value (and "recorded None,
    here None" as a difference that is not one)."""
    recorded, current = d.get("recorded"), d.get("current")
    status = d.get("status")
    if status == "missing_here":
        change = f"recorded {recorded!r}; this torch has no such setting"
    elif status == "new_here":
        change = f"the recording torch had no such setting; here it is {current!r}, not its default"
    elif status == "not_compared":
        change = (f"recorded {recorded!r} (changed there); not compared: its module is not imported here, "
                  "and a module an archive names is never imported")
    elif d.get("what") == "environment" and (recorded is None or current is None):
        change = f"unset there, here {current!r}" if recorded is None else f"recorded {recorded!r}, unset here"
    else:
        change = f"recorded {recorded!r}, here {current!r}"
        if status == "unrepresentable":
            change += " (not plain data: compared by repr)"
    return f"{d['what']:<11} {d['name']}: {change}"


def index_digest(digest: str) -> str:
    """The index's digest, as ``inspect``, ``verify``, ``diff`` and ``view`` print it. An archive
    has two digests: its index's (what names it inside the format: ``parent``, ``diff``) and
    its file's (what a store names it by: ``push``, ``pull``, ``ls``). Each is printed with its
    label, and a store reference takes either."""
    return f"index {digest[:19]}..."


def file_digest(digest: str) -> str:
    """The archive file's digest, as ``push``, ``pull`` and ``ls`` print it (see ``index_digest``)."""
    return f"file {digest[:19]}..."


def failure_title(failure: dict) -> str:
    """A failure's stage and exception type (``compile InductorError``). A crash archive written
    before the graph first ran (kept only because the process died there) has no signal: that
    is said, not left as an empty type."""
    kind = failure.get("exception_type") or ("(signal not recorded)" if failure.get("stage") == "crash" else "")
    return " ".join(str(part) for part in (failure.get("stage"), kind) if part)


def human_size(n: int) -> str:
    """Bytes for people: 512 B, 3.4 MiB."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def pack_summary(result) -> list[str]:
    """The three lines ``pack`` and ``capture`` print under an archive's ``PackReport`` (a trace
    compile's also says ``graph_from`` and ``backend``)."""
    g = result.graph
    origin = f"{result.kind}, from {result.graph_from}" if result.graph_from else result.kind
    graph = (f"graph:   {g.get('nodes', 0)} nodes, {g.get('compute_nodes', 0)} ops of {g.get('op_kinds', 0)} kinds "
             f"({origin})")
    if result.graph_from:
        graph += f", backend {result.backend or 'unknown'}"
    i = result.inputs
    inputs = (f"inputs:  {i.get('real', 0)} real / {i.get('absent', 0)} absent"
              + (f" / {i['values']} values" if i.get("values") else "")
              + f", {human_size(i.get('real_bytes', 0))} of data")
    f = result.failure
    if not f:
        return [graph, inputs, "failure: none recorded (the compile succeeded in the job)"]
    message = (f.get("message") or "").strip().splitlines()
    f = {k: terminal_safe(v) if isinstance(v, str) else v for k, v in f.items()}
    first = terminal_safe(message[0][:160]) if message else ""
    failure = f"failure: {failure_title(f)}" + (f": {first}" if first else "")
    learned = (getattr(result, "replay", None) or {}).get("failure_from")
    if learned and f.get("stage") != "unknown":
        failure += f"  [from the {terminal_safe(str(learned))}]"
    return [graph, inputs, failure]
