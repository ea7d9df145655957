"""Triage: ``diff`` (is this the same bug as that one?) and ``view`` (what does it look like?)."""

from __future__ import annotations

import sys

import click

import reproarchive
from reproarchive import _internal as internal

from .app import emit_json, json_errors, main
from .text import failure_title, index_digest, terminal_lines, terminal_safe

DIFF_EPILOG = """\b
Exit codes:
  0    the archives are identical in failure, replay settings, graph, inputs, config,
       environment and system
  1    they differ (as diff(1) does)
  2    usage error, or an archive is invalid, damaged, unsafe or too new
  4    an archive file is missing or unreadable
  70   internal error (a bug in reproarchive; --debug shows the traceback)
"""

VIEW_EPILOG = """\b
Exit codes:
  0    the page was written
  2    usage error, or the archive (or --parent) is invalid, damaged, unsafe or too new
  4    an archive file is missing or unreadable, or the page cannot be written
  70   internal error (a bug in reproarchive; --debug shows the traceback)
"""

#: Graph rows printed as text; --json has them all.
SHOWN_NODES = 25


@main.command("diff", epilog=DIFF_EPILOG)
@click.argument("a", type=click.Path(dir_okay=False))
@click.argument("b", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the whole comparison as JSON.")
@click.pass_context
def diff_cmd(ctx, a: str, b: str, as_json: bool) -> None:
    """Compare archive A with archive B: same failure? same graph? same inputs? what else differs?

    Reads only the two indexes (blobs are compared by digest, never decompressed), so it is
    instant on archives of any size. Config, environment and system are compared by the same
    code `run` uses to explain a different outcome.
    """

    with json_errors(as_json):
        report = reproarchive.diff(a, b)
    if as_json:
        emit_json(report.to_plain())
    else:
        click.echo(terminal_lines("\n".join(format_diff(report))))
    ctx.exit(0 if report.identical else 1)


def format_diff(r) -> list[str]:
    """The comparison for people: one line per section, then what differs in it."""

    a, b = r.a, r.b
    width = max(len(a.path), len(b.path))
    relation = {"b_minified_from_a": "   (minified from A)", "a_minified_from_b": ""}.get(r.relation or "", "")
    lines = [
        f"A  {a.path:<{width}}  {index_digest(a.digest)}  {_counts(a)}"
        + ("   (minified from B)" if r.relation == "a_minified_from_b" else ""),
        f"B  {b.path:<{width}}  {index_digest(b.digest)}  {_counts(b)}{relation}",
    ]
    if r.relation == "same_archive":
        lines.append("(the two files hold the same index)")
    lines += _failure(r.failure)
    lines += _rows("replay", r.replay, "same backend, accuracy check and graph kind")
    lines += _graph(r.graph)
    lines += _inputs(r.inputs, r.relation)
    for section in ("config", "environment", "system"):
        lines += _rows(section, getattr(r, section), "same")
    for name, side in (("A", r.job.a if r.job else None), ("B", r.job.b if r.job else None)):
        if side is not None:
            lines += [f"{name} {line}" if i == 0 else line for i, line in enumerate(internal.job_lines(side))]
    if r.identical:
        lines.append("=> identical (exit 0)")
    else:
        lines.append(f"=> different: {', '.join(r.differing)} (exit 1)")
    return lines


def _counts(side) -> str:
    return f"{side.nodes} nodes, {side.ops} ops, {side.inputs} inputs"


def _failure(f: dict) -> list[str]:
    def text(side):
        if side is None:
            return "no failure recorded"
        return f"{failure_title(side)}: {side['message'][:140]}".rstrip(": ")

    if f["same"]:
        return [f"{'failure':<12} same signature: {text(f['a'])}"]
    lines = [f"{'failure':<12} DIFFERENT", f"  A  {text(f['a'])}", f"  B  {text(f['b'])}"]
    if f["a"] is not None and f["b"] is not None and text(f["a"]) == text(f["b"]):
        # the same words, another group (the failing node's target, the compiler's diagnostic): show what differs
        lines += [f"  group A  {terminal_safe(f['a']['group'])}", f"  group B  {terminal_safe(f['b']['group'])}"]
    return lines


def _rows(name: str, section: dict, same_text: str) -> list[str]:
    if section["same"]:
        return [f"{name:<12} {same_text}"]
    rows = section["rows"]
    lines = [f"{name:<12} {len(rows)} difference{'s' if len(rows) != 1 else ''}"]
    for row in rows[:15]:
        status = f"  [{row['status']}]" if row.get("status") not in (None, "differs") else ""
        lines.append(f"  {row['name']}: A {_short(row['a'])}, B {_short(row['b'])}{status}")
    if len(rows) > 15:
        lines.append(f"  ... and {len(rows) - 15} more (--json has them all)")
    return lines


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _graph(g: dict) -> list[str]:
    c = g["counts"]
    if g["same"]:
        return [f"{'graph':<12} identical ({c['nodes_a']} nodes)"]
    lines = [f"{'graph':<12} {c['removed']} removed, {c['added']} added, {c['changed']} changed, "
             f"{c['matched']} unchanged ({c['nodes_a']} -> {c['nodes_b']} nodes)"]
    mark = {"removed": "-", "added": "+", "changed": "~"}
    for row in g["nodes"][:SHOWN_NODES]:
        if row["status"] == "changed":
            lines.append(f"  ~ {row['a']['line']}")
            lines.append(f"    {row['b']['line']}   ({', '.join(row['changes'])})")
        else:
            lines.append(f"  {mark[row['status']]} {(row['a'] or row['b'])['line']}")
    if len(g["nodes"]) > SHOWN_NODES:
        lines.append(f"  ... and {len(g['nodes']) - SHOWN_NODES} more (--json has them all)")
    if not g["nodes"]:
        lines.append("  the nodes are the same; the stored attributes (module state) differ")
    return lines


_INPUT_STATUS = {
    "same": "same",
    "different_data": "same metadata, different data",
    "different_metadata": "different metadata",
    "different_fidelity": "different fidelity (real vs absent)",
    "different_value": "different value",
    "different_kind": "different kind of value",
    "only_a": "only in A",
    "only_b": "only in B",
    "computed_in_a": "computed by A's graph",
    "computed_in_b": "computed by B's graph",
}


def _inputs(section: dict, relation: str | None) -> list[str]:
    rows = section["rows"]
    if section["same"]:
        return [f"{'inputs':<12} same ({len(rows)} inputs, same blobs)"]
    counts = ", ".join(f"{n} {_INPUT_STATUS[s]}" for s, n in section["counts"].items())
    paired = {"origin": "paired through B's record of where each input came from",
              "name": "paired by name", "position": "paired by position"}[section["paired_by"]]
    if section["paired_by"] == "origin" and relation == "a_minified_from_b":
        paired = "paired through A's record of where each input came from"
    lines = [f"{'inputs':<12} {counts}; {paired}"]
    not_needed = [row for row in rows if row["status"] in ("only_a", "only_b") and section["paired_by"] == "origin"]
    for row in rows:
        if row["status"] == "same" or row in not_needed:
            continue
        label = f"A[{row['a']}]" if row["a"] is not None else ""
        label += (" " if label else "") + (f"B[{row['b']}]" if row["b"] is not None else "")
        text = _INPUT_STATUS[row["status"]]
        if row.get("changes") and row["status"] != "different_data":
            text += f" ({', '.join(row['changes'])})"
        lines.append(f"  {label} {row['name'] or ''}: {text}")
        for side in ("a", "b"):
            if row[f"{side}_desc"]:
                lines.append(f"      {side.upper()}  {row[f'{side}_desc']}")
    if not_needed:
        parent = "A" if not_needed[0]["status"] == "only_a" else "B"
        names = ", ".join(str(row["a"] if parent == "A" else row["b"]) for row in not_needed)
        lines.append(f"  {parent}[{names}]: inputs of the parent that the minified graph does not need")
    for row in section["attributes"]:
        lines.append(f"  attribute {row['a'] or row['b']}: {_INPUT_STATUS[row['status']]}")
    return lines


@main.command("view", epilog=VIEW_EPILOG)
@click.argument("archive", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="The HTML file to write (default: the archive's name with .html).")
@click.option("--parent", type=click.Path(dir_okay=False),
              help="For a minified archive: its parent, to show before and after (default: looked for "
                   "next to the archive).")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
def view_cmd(archive: str, output: str | None, parent: str | None, as_json: bool) -> None:
    """Write ARCHIVE as one self-contained HTML page: the failure, the graph drawn as a picture,
    the op histogram, the inputs, the config changes and the machine.

    The page needs no network and runs nothing from the archive; open it in any browser.
    Graphs of thousands of nodes are shown in pages of a few hundred nodes.
    """

    with json_errors(as_json):
        result = reproarchive.view(archive, output, parent=parent)
    if as_json:
        emit_json(result)
        return
    pages = f", {result['pages']} pages" if result["pages"] > 1 else ""
    extra = f"; before/after with parent {result['parent']}" if result.get("parent") else ""
    if result.get("subgraphs"):
        pages += f", {len(result['subgraphs'])} higher-order ops drawn with their subgraphs"
    click.echo(terminal_safe(f"wrote {result['output']} ({result['nodes']} nodes{pages}, layout by "
                             f"{result['layout']}{extra})"))
    if result.get("warnings"):
        for w in result["warnings"]:
            click.echo(f"warning: {terminal_safe(w)}", err=True)
    if sys.stdout.isatty():
        click.echo(f"open it with: xdg-open {result['output']}  (or any browser)")
