"""``diff``: is archive B the same bug as archive A, and if not, what differs?

A triager holding two archives asks whether they are one bug (the failure signature), whether
the graphs are the same (a structural diff), whether the inputs are the same (per input: the
same blob, the same metadata with other data, other metadata, other fidelity), and what
differs in the config, environment and machine. Every answer is in the two indexes: blobs are
named by their digest, so equal data is an equal digest and no blob is ever decompressed —
diffing two 50 GiB archives costs two index reads.

The graph diff aligns the node sequences by (op, target) — placeholders and the output by
position — with ``difflib``'s longest-matching-blocks alignment, so an op inserted upstream
does not make every later node "different" just because FX renumbered its names. Aligned
nodes whose arguments (node references compared through the alignment), keyword arguments or
recorded value type differ are "changed"; so are same-kind nodes replaced one for one.

The config, environment and system comparison is the code ``run`` uses (``reproarchive.context``),
reached through ``record_differences`` only.

The inputs are paired and compared in ``triage.input_diff`` (``input_diff``).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import field
from typing import Any

from reproarchive.archive.graph_code import node_line
from reproarchive.archive.inspection import NamedByIndex
from reproarchive.archive.job_report import JobSummary, first_divergence, job_summary
from reproarchive.context.config import config_diff
from reproarchive.context.environment import environment_diff
from reproarchive.context.system import system_diff
from reproarchive.format import layout
from reproarchive.format.plain import PlainData, PlainRecord
from reproarchive.format.reader import ContainerReader
from reproarchive.format.schema import (
    ConfigRecord,
    DictArg,
    EnvironmentRecord,
    GraphKind,
    GraphRecord,
    Index,
    NodeRef,
    SliceArg,
    TupleArg,
)
from reproarchive.sources.program.program_capture import set_by_capture
from reproarchive.triage.grouping import signature_of
from reproarchive.triage.input_diff import input_diff

#: Sections of the report, in the order they are printed; any difference in one makes exit 1.
SECTIONS = ("failure", "replay", "graph", "inputs", "config", "environment", "system")


@dataclasses.dataclass(frozen=True)
class ArchiveSide(NamedByIndex):
    """One of the two archives compared."""

    path: str
    digest: str  # the index digest
    format: str
    nodes: int
    ops: int
    inputs: int
    parent: str | None


#: A section of the comparison: plain data whose ``same`` says whether it differs.
_SECTION = {"json": {"type": "object", "required": ["same"], "properties": {"same": {"type": "boolean"}}}}


@dataclasses.dataclass(frozen=True)
class DiffReport(PlainRecord):
    """What ``diff`` found; ``to_plain()`` is ``diff --json``. The sections are plain data
    (their rows depend on the section); each has ``same``."""

    a: ArchiveSide
    b: ArchiveSide
    relation: str | None  # same_archive, b_minified_from_a, a_minified_from_b
    failure: PlainData = field(metadata=_SECTION)
    replay: PlainData = field(metadata=_SECTION)
    graph: PlainData = field(metadata=_SECTION)
    inputs: PlainData = field(metadata=_SECTION)
    config: PlainData = field(metadata=_SECTION)
    environment: PlainData = field(metadata=_SECTION)
    system: PlainData = field(metadata=_SECTION)
    differing: tuple[str, ...] = ()  # the sections that differ, in SECTIONS order (then "job")
    identical: bool = False
    job: JobComparison | None = field(default=None, metadata={"omit": "none"})  # either is a multi-rank job


@dataclasses.dataclass(frozen=True)
class JobComparison(PlainRecord):
    """The ranks of either side that is a multi-rank job (spec §8 ``job``): each side's ranks,
    schedules side by side and first diverging collective; ``same`` when both are jobs whose
    ranks recorded the same collectives."""

    a: JobSummary | None
    b: JobSummary | None
    same: bool


def diff(a: str | os.PathLike, b: str | os.PathLike, *, limits: layout.Limits = layout.DEFAULT_LIMITS) -> DiffReport:
    """Compare two archives from their indexes alone.

    ``identical`` is True when nothing in any section differs; ``differing`` names the
    sections that do. Raises an ``ArchiveError`` when either file is not a readable archive
    (nothing is compared then)."""
    with ContainerReader(a, limits=limits) as ra, ContainerReader(b, limits=limits) as rb:
        ia, ib = ra.index, rb.index
        relation = _relation(ra.index_digest, ia, rb.index_digest, ib)
        sections: dict[str, Any] = {
            "failure": failure_diff(ia, ib),
            "replay": _replay_diff(ia, ib),
            "graph": graph_diff(ia.graph, ib.graph),
            "inputs": input_diff(ia, ib, relation),
            **{k: {"rows": rows, "same": not rows} for k, rows in record_differences(ia, ib).items()},
        }
        differing = tuple(s for s in SECTIONS if not sections[s]["same"])
        job = _job_comparison(ia, ib)
        differing += ("job",) if job is not None and not job.same else ()
        return DiffReport(a=_identity(a, ra.index_digest, ia), b=_identity(b, rb.index_digest, ib), relation=relation,
                          **sections, differing=differing, identical=not differing, job=job)


def _job_comparison(a: Index, b: Index) -> JobComparison | None:
    if a.job is None and b.job is None:
        return None
    same = a.job is not None and b.job is not None and first_divergence(a.job) == first_divergence(b.job) and \
        {r.rank: [c.op for c in r.schedule] for r in a.job.ranks} == \
        {r.rank: [c.op for c in r.schedule] for r in b.job.ranks}
    return JobComparison(a=job_summary(a.job, a.records) if a.job is not None else None,
                         b=job_summary(b.job, b.records) if b.job is not None else None, same=same)


# --------------------------------------------------------------------------------------------
# the records: one adapter over the comparisons run uses


def record_differences(a: Index, b: Index) -> dict[str, list[dict[str, Any]]]:
    """Config, environment and system rows that differ between two archives, each row
    ``{"name", "a", "b", "important"}`` (config rows also ``"status"``).

    The one place ``diff`` and ``view`` compare records: it calls the comparisons that ``run``
    and its no-run check use (``reproarchive.context``), with archive A as the recorded side
    and B as the current one, and only renames their columns."""
    config = [{"name": f"{r.get('module')}.{r.get('key')}", "a": r.get("recorded"), "b": r.get("current"),
               "important": r.get("status") != "differs", "status": r.get("status")}
              for r in config_diff(a.records.config or ConfigRecord(), b.records.config or ConfigRecord())]
    # run's comparison skips config modules only the current side has (imported here, they say
    # nothing about the recording); between two archives, B's own modules count too
    seen = {row["name"] for row in config}
    config += [{"name": f"{r.get('module')}.{r.get('key')}", "a": r.get("current"), "b": r.get("recorded"),
                "important": True, "status": "only_in_b"}
               for r in config_diff(b.records.config or ConfigRecord(), a.records.config or ConfigRecord())
               if f"{r.get('module')}.{r.get('key')}" not in seen
               and r.get("module") not in (a.records.config.modules if a.records.config else {})]
    env_a, env_b = a.records.environment or EnvironmentRecord(), b.records.environment or EnvironmentRecord()
    # what ``capture --`` set for the program (its private dump folder, PyTorch's dump switches)
    ours = set_by_capture(env_a.variables) | set_by_capture(env_b.variables)
    environment = [{"name": r["what"].removeprefix("env "), "a": r["recorded"], "b": r["current"],
                    "important": r["important"]}
                   for r in environment_diff(env_a, env_b) if r["what"].removeprefix("env ") not in ours]
    if a.records.system is not None and b.records.system is not None:
        system = [{"name": r["what"], "a": r["recorded"], "b": r["current"], "important": r["important"]}
                  for r in system_diff(a.records.system, b.records.system)]
    elif (a.records.system is None) != (b.records.system is None):
        system = [{"name": "system record", "a": "recorded" if a.records.system else None,
                   "b": "recorded" if b.records.system else None, "important": False}]
    else:
        system = []
    return {"config": config, "environment": environment, "system": system}


# --------------------------------------------------------------------------------------------
# identity, failure, replay settings


def _identity(path, digest: str, index: Index) -> ArchiveSide:
    return ArchiveSide(path=str(path), digest=digest, format=index.version, nodes=len(index.graph.nodes),
                       ops=index.graph.op_count(), inputs=len(index.inputs), parent=index.records.parent)


def _relation(digest_a: str, a: Index, digest_b: str, b: Index) -> str | None:
    """"b_minified_from_a" / "a_minified_from_b" when one archive records the other as its
    parent (``run --minify``), "same_archive" when the indexes are byte-identical."""
    if digest_a == digest_b:
        return "same_archive"
    if b.records.parent == digest_a:
        return "b_minified_from_a"
    if a.records.parent == digest_b:
        return "a_minified_from_b"
    return None


def failure_diff(a: Index, b: Index) -> dict:
    """Same failure means the same group signature ``triage`` groups by (``grouping``: stage,
    exception type, message with the graph's own names and the machine's paths and numbers
    masked, the compiler's first diagnostic, the failing node's target); an archive without a
    failure matches only another without one."""
    fa, fb = a.records.failure, b.records.failure
    sa, sb = signature_of(a), signature_of(b)

    def side(f, sig):
        if f is None:
            return None
        first = next((ln.strip() for ln in f.message.splitlines() if ln.strip()), "")
        return {"stage": f.stage, "exception_type": f.exception_type, "message": first[:300],
                "signature": f.signature, "backend": f.backend, "group": sig.text()}

    if sa is None or sb is None:
        same = sa is None and sb is None
    else:
        same = sa.key() == sb.key()
    return {"same": same, "a": side(fa, sa), "b": side(fb, sb)}


def _replay_diff(a: Index, b: Index) -> dict:
    """What ``run`` takes from the archive besides records: the backend, the accuracy check and
    which of PyTorch's graphs it holds (it decides how Inductor is called)."""
    rows = []
    # a capture records no graph kind: it holds Dynamo's graph, as an after_dynamo dump does
    kind_a, kind_b = (r.graph_kind or GraphKind.AFTER_DYNAMO for r in (a.records, b.records))
    for name, va, vb in (("backend", a.records.backend, b.records.backend),
                         ("accuracy", bool(a.records.accuracy), bool(b.records.accuracy)),
                         ("graph kind", kind_a, kind_b)):
        if va != vb:
            rows.append({"name": name, "a": va, "b": vb})
    return {"same": not rows, "rows": rows}


# --------------------------------------------------------------------------------------------
# the graph


def _key(node) -> tuple:
    return (node.op,) if node.op == "output" else (node.op, node.target)


def align(ga: GraphRecord, gb: GraphRecord) -> list[tuple[int | None, int | None]]:
    """The two node sequences aligned, in graph order: ``(i, j)`` for matched nodes, ``(i, None)``
    for a node only A has, ``(None, j)`` for one only B has. Nodes match by (op, target) in
    order; a same-length run of same-kind nodes replaced one for one counts as matched."""
    ka, kb = [_key(n) for n in ga.nodes], [_key(n) for n in gb.nodes]
    # identical prefix and suffix first: the common case, and it keeps the matcher's work small
    lo = 0
    while lo < min(len(ka), len(kb)) and ka[lo] == kb[lo]:
        lo += 1
    hi = 0
    while hi < min(len(ka), len(kb)) - lo and ka[-1 - hi] == kb[-1 - hi]:
        hi += 1
    out: list[tuple[int | None, int | None]] = [(i, i) for i in range(lo)]
    middle = difflib.SequenceMatcher(None, ka[lo:len(ka) - hi], kb[lo:len(kb) - hi], autojunk=False)
    for tag, i1, i2, j1, j2 in middle.get_opcodes():
        i1, i2, j1, j2 = i1 + lo, i2 + lo, j1 + lo, j2 + lo
        if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1
                              and all(ga.nodes[i].op == gb.nodes[j].op for i, j in zip(range(i1, i2), range(j1, j2)))):
            out.extend(zip(range(i1, i2), range(j1, j2)))
        else:
            out.extend((i, None) for i in range(i1, i2))
            out.extend((None, j) for j in range(j1, j2))
    out.extend((len(ka) - hi + k, len(kb) - hi + k) for k in range(hi))
    return out


def graph_diff(ga: GraphRecord, gb: GraphRecord) -> dict:
    """Nodes removed (only in A), added (only in B) and changed (aligned, but with another
    target, other arguments or another recorded value type), in graph order."""
    aligned = align(ga, gb)
    b_of_a = {ga.nodes[i].name: j for i, j in aligned if i is not None and j is not None}
    index_b = {n.name: j for j, n in enumerate(gb.nodes)}

    def ref_a(name):
        return ("node", b_of_a.get(name, f"a:{name}"))

    def ref_b(name):
        return ("node", index_b.get(name))

    rows: list[dict[str, Any]] = []
    counts = {"nodes_a": len(ga.nodes), "nodes_b": len(gb.nodes), "matched": 0, "changed": 0, "removed": 0, "added": 0}
    for i, j in aligned:
        if j is None:
            counts["removed"] += 1
            rows.append({"status": "removed", "a": _node(ga.nodes[i], i), "b": None})
            continue
        if i is None:
            counts["added"] += 1
            rows.append({"status": "added", "a": None, "b": _node(gb.nodes[j], j)})
            continue
        na, nb = ga.nodes[i], gb.nodes[j]
        changes = []
        if na.target != nb.target and na.op != "output":
            changes.append("target")
        if _canon(na.args, ref_a) != _canon(nb.args, ref_b):
            changes.append("args")
        if _canon(na.kwargs, ref_a) != _canon(nb.kwargs, ref_b):
            changes.append("kwargs")
        if None not in (_value(na), _value(nb)) and _value(na) != _value(nb):
            changes.append("value")
        if changes:
            counts["changed"] += 1
            rows.append({"status": "changed", "changes": changes, "a": _node(na, i), "b": _node(nb, j)})
        else:
            counts["matched"] += 1
    ops_a, ops_b = ga.op_histogram(), gb.op_histogram()
    op_changes = {k: [ops_a.get(k, 0), ops_b.get(k, 0)] for k in sorted(set(ops_a) | set(ops_b))
                  if ops_a.get(k, 0) != ops_b.get(k, 0)}
    same = not rows and _state_paths(ga) == _state_paths(gb)
    return {"same": same, "counts": counts, "nodes": rows, "op_counts": op_changes}


def _node(node, index: int) -> dict:
    return {"index": index, "name": node.name, "op": node.op, "target": node.target, "line": node_line(node)}


def _value(node) -> Any:
    """The value summary reproarchive recorded for a node (shape, dtype, device), where it
    could: a graph imported from a dump has none (``{"value": None}``, a node whose example
    value was not known), so a missing summary is no difference."""
    value = node.meta.get("val") if isinstance(node.meta, dict) else None
    return None if value == {"value": None} else value


def _state_paths(graph: GraphRecord) -> list[tuple[str, str]]:
    return [(type(e).__name__, e.path) for e in graph.module_state]


def _canon(value: Any, ref) -> Any:
    """An argument as comparable plain data, node references replaced by ``ref(name)``."""
    if isinstance(value, NodeRef):
        return ref(value.name)
    if isinstance(value, TupleArg):
        return ("tuple", tuple(_canon(v, ref) for v in value.items))
    if isinstance(value, (list, tuple)):
        return ("list", tuple(_canon(v, ref) for v in value))
    if isinstance(value, dict):
        return ("kwargs", tuple((k, _canon(v, ref)) for k, v in sorted(value.items())))
    if isinstance(value, DictArg):
        return ("dict", tuple((_canon(k, ref), _canon(v, ref)) for k, v in value.items))
    if isinstance(value, SliceArg):
        return ("slice", _canon(value.start, ref), _canon(value.stop, ref), _canon(value.step, ref))
    return (type(value).__name__, value)  # 1 and 1.0 and True are different arguments
