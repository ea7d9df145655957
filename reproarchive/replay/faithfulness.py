"""What of the failing run a replay cannot honour that is known before it runs: random draws
from an unrecorded generator state, a grad mode that was not recorded, inputs that hold
generated values. Said once, in one set of words, for ``run``, for each rank of a job, and for
the exported scripts, which get the list as a literal (``before_replay``), so that a script and
``run`` cannot disagree about them. What only the replay itself shows (its shape guards, a
custom op the script's process lacks) is judged where it happens.

Each reason makes a pass inconclusive (``outcome.unless_faithful``), never a failure: the
replay may still reproduce.
"""

from __future__ import annotations

from typing import Any, Mapping

from reproarchive.codec.rng import random_ops
from reproarchive.codec.shapes import placeholder_names
from reproarchive.codec.tensors import FIDELITY_ABSENT
from reproarchive.format.schema import FailureRecord, Records
from reproarchive.format.schema.sections import COMPUTED_FROM_GENERATED
from reproarchive.replay.conditions import tensors_in
from reproarchive.replay.outcome import Outcome, unless_faithful, with_stand_ins


def generated_inputs(gm, fidelity: list[str], records: Records) -> list[str]:
    """The placeholders of ``gm`` whose values were generated here: no data in the archive
    (``fidelity``), or (a minified archive's ``records``) computed from such. A graph's or one
    rank's: the single-graph replay and each rank of a job judge by the same rule."""
    names = placeholder_names(gm)
    derived = records.not_original_inputs(len(names))
    return [name for i, name in enumerate(names)
            if derived.get(i) == COMPUTED_FROM_GENERATED or (i < len(fidelity) and fidelity[i] == FIDELITY_ABSENT)]


def rng_unknown(ops: list[str], rng_states: Mapping[str, Any] | None, recorded: FailureRecord | None) -> list[str]:
    """Random draws (``ops``: the graph's random calls) from another state than the failing
    run's, where its failure came after compiling (a compiler reads no random value)."""
    if ops and not rng_states and getattr(recorded, "stage", None) != "compile":
        return [f"the graph draws random numbers ({', '.join(ops)}) but the archive does not hold the RNG "
                "state of the failing run: the replay drew other numbers"]
    return []


def state_unknown(records: Records, args: list[Any]) -> list[str]:
    """What an unrecorded execution state could have changed in what this replay compiled: grad
    mode decides whether AOTAutograd compiles a joint graph for an after_dynamo graph whose
    inputs require grad. An after_aot graph is replayed with grad off, as AOTAutograd runs it,
    with its autocast casts among its ops; a graph no input of which requires grad compiles the
    same forward either way."""
    if records.execution is not None or records.graph_kind == "after_aot":
        return []
    if not any(t.requires_grad for t in tensors_in(args)):
        return []
    return ["the grad mode of the failing run was not recorded and inputs require grad: the replay compiled "
            "under this process's grad mode (forward and backward), which the failing run may not have had"]


def generated_said(names: list[str], recorded: FailureRecord | None) -> list[str]:
    """Inputs ``names`` held values generated here: a failure after compiling may depend on the
    data. A compile reads no input's values, so a compile failure's pass stays one."""
    if not names or recorded is None or recorded.stage == "compile":
        return []
    return [f"{len(names)} input(s) held generated values, not the failing run's data ({', '.join(names[:5])}"
            f"{', ...' if len(names) > 5 else ''}): a failure that depends on them may not show"]


def with_generated_inputs(outcome: Outcome, names: list[str]) -> Outcome:
    """``outcome`` of a replay in which the inputs ``names`` held generated values
    (``generated_said``): a pass is then no evidence that the failure is gone (125)."""
    said = generated_said(names, outcome.recorded)
    return unless_faithful(outcome, [*outcome.unfaithful, *said]) if said else outcome


def as_replayed(outcome: Outcome, stand_ins: list[str], generated: list[str]) -> Outcome:
    """``outcome`` judged by what its replay put in place of the failing run's: the custom ops
    and kernels ``stand_ins`` stood in for, the inputs ``generated`` held generated values. One
    step for ``run``, every rank of a job and ``--single-process``."""
    return with_generated_inputs(with_stand_ins(outcome, stand_ins), generated)


def before_replay(gm, args: list[Any], fidelity: list[str], records: Records,
                  rng_states: Mapping[str, Any] | None) -> list[str]:
    """Every reason of this module that applies to replaying ``gm`` on ``args`` under
    ``records``, in ``run``'s words (``rng_states``: those loaded; unused where ``records``
    hold none): what an exported script starts its ``NOT_AS_RECORDED`` list with."""
    rng_states = None if records.rng is None else rng_states
    return [*rng_unknown(list(random_ops(gm)), rng_states, records.failure), *state_unknown(records, args),
            *generated_said(generated_inputs(gm, fidelity, records), records.failure)]
