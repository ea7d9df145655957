"""Shape guards as text over named inputs: what a replay's guards are compared by, with the
recorded ones and with Dynamo's.

This module is bundled whole into the scripts ``export`` writes (``standalone.shared_blocks``), so the
replay and the exported script render a compile's guards by one rule: it imports the standard
library and torch only (``tests/standalone/test_bundled_code.py`` keeps it so).

Checked with 2.11.0, 2.13.0 and 2.15.0: ``ShapeEnv.produce_guards`` renders a guard over the
names of the sources it is given, and a nested jagged tensor's only with Dynamo's symbolic
context.
"""

from __future__ import annotations

from typing import Any, Sequence

CHECKED_WITH = ("2.11.0", "2.13.0", "2.15.0")

PRIVATE_NAMES = ("torch.utils._python_dispatch.is_traceable_wrapper_subclass",)


def rendered_guards(shape_env: Any, values: Sequence[Any], sources: Sequence[Any]) -> list[str]:
    """``shape_env``'s guards over the tensors and symbolic scalars of ``values`` that have a
    source, leaving out a scalar that is the size of one of those tensors (Dynamo's ``s77``
    placeholder next to ``x``: it would only add ``L['x'].size()[0] == L['x'].size()[0]``)."""
    import torch  # compat modules import torch only when called
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    in_tensors = {s.node.expr for v in values if isinstance(v, torch.Tensor) for s in v.shape
                  if isinstance(s, torch.SymInt)}
    fakes, srcs = [], []
    for value, source in zip(values, sources):
        if source is None or not isinstance(value, (torch.Tensor, torch.SymInt)):
            continue
        if isinstance(value, torch.Tensor) and is_traceable_wrapper_subclass(value):
            continue  # a nested jagged tensor: torch renders its guards only with Dynamo's symbolic context
        if isinstance(value, torch.SymInt) and value.node.expr in in_tensors:
            continue
        fakes.append(value)
        srcs.append(source)
    return list(shape_env.produce_guards(fakes, srcs)) if fakes else []
