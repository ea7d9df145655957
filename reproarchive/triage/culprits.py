"""One bug, one group: signature groups merge when their minified culprits agree.

A signature (``grouping``) is read from what the failure *says*, and a compiler says one bug in
several ways: a node name in one message, an ``aten`` target in another, a Tensor method where
another model called the function. Each wording is a group of its own, none of them wrong, and
the fleet's view of "how many bugs" is inflated. The minifier already answers the question the
wording hides: a group's representative shrinks to the ops that still fail the same way. Two
groups whose smallest graphs fail at the same stage with the same exception type, on the same
ops (named by what they are: ``torch.sigmoid``, ``Tensor.sigmoid`` and ``aten.sigmoid.default``
are all ``sigmoid``; shapes and node names left out), are one bug.

Merging only joins: it never splits a signature group, so it cannot mix bugs that signatures
keep apart unless their culprits agree on stage, exception type and every op. A group whose
minify did not reach a verdict (not run, failed, no longer failing) has no culprit and stays as
it is.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from reproarchive.archive.graph_code import model_lines
from reproarchive.format.plain import PlainRecord
from reproarchive.format.reader import ContainerReader
from reproarchive.format.schema import COMPUTE_OPS, Index
from reproarchive.store.location import is_reference
from reproarchive.store.pull import archive_view
from reproarchive.triage.grouping import op_name

_WHERE_LINES = 3  # model lines a culprit names at most

#: Minify statuses whose archive is the culprit: shrunk, or already as small as it gets.
MINIFIED, UNCHANGED = "minified", "unchanged"


@dataclasses.dataclass(frozen=True)
class Culprit(PlainRecord):
    """What a group's smallest failing graph is: its failure's stage and exception type, and
    its compute ops by short name (sorted, with repeats)."""

    stage: str
    exception_type: str
    ops: tuple[str, ...]
    # the model lines its ops came from (format 1.7 stacks), in graph order: where the bug is
    # in this group's program, not part of what makes two culprits one
    where: tuple[str, ...] = dataclasses.field(default=(), compare=False)

    def text(self) -> str:
        """``compile|LoweringError|sigmoid``."""
        return f"{self.stage}|{self.exception_type}|{'+'.join(self.ops) or '(no ops)'}"


def culprit_of(index: Index) -> Culprit | None:
    """The culprit ``index``'s graph is, if it were the smallest failing one; None when it
    records no failure."""
    failure = index.records.failure
    if failure is None:
        return None
    graph = index.graph
    ops = Counter(op_name(graph, n) for n in graph.nodes if n.op in COMPUTE_OPS)
    return Culprit(stage=failure.stage, exception_type=failure.exception_type,
                   ops=tuple(sorted(ops.elements())), where=tuple(model_lines(graph)[:_WHERE_LINES]))


def read_culprit(location: str, storage_options: dict | None = None) -> Culprit | None:
    """The culprit of the archive at ``location`` (a path, or a store reference: only its
    inline bytes are read)."""
    if is_reference(location):
        with archive_view(location, storage_options) as (path, _):
            with ContainerReader(path) as reader:
                return culprit_of(reader.index)
    with ContainerReader(location) as reader:
        return culprit_of(reader.index)


def merge_keys(culprits: dict[tuple, Culprit | None], order: list[tuple]) -> dict[tuple, tuple]:
    """Group key -> the key of the group it merges into (the first, in ``order``, with the same
    culprit); a group without a culprit maps to itself."""
    first: dict[Culprit, tuple] = {}
    into = {}
    for key in order:
        culprit = culprits.get(key)
        if culprit is None:
            into[key] = key
            continue
        into[key] = first.setdefault(culprit, key)
    return into
