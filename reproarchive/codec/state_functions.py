"""The state functions Dynamo puts in graphs (spec §7.3): grad mode, autocast, functorch levels.

They are the one kind of call target whose effect is outside its tensors: each changes
thread-local state, which the replay puts back afterwards (``replay.containment``), so the
effect does not outlive the replay. They are a table with its lookup, kept apart from the
effect rule (``codec.effects``) that allows them and from the graph check
(``codec.targets``) that follows the handles some of them return.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch


@dataclasses.dataclass(frozen=True)
class StateFunction:
    """A function that changes thread-local state the replay restores (``replay.containment``)."""

    state: str  # which state: "grad", "autocast", "functorch", "forward_ad", "usage_log"
    returns_handle: bool = False  # its result is an object only ``consumer`` may take
    consumer: str | None = None


STATE_FUNCTIONS: dict[str, StateFunction] = {
    "torch._C._set_grad_enabled": StateFunction("grad"),
    "torch._C._set_fwd_grad_enabled": StateFunction("forward_ad"),
    "torch.amp.autocast_mode._enter_autocast": StateFunction("autocast", True,
                                                             "torch.amp.autocast_mode._exit_autocast"),
    "torch.amp.autocast_mode._exit_autocast": StateFunction("autocast"),
    "torch._C._log_api_usage_once": StateFunction("usage_log"),
    **{f"torch._C._functorch.{n}": StateFunction("functorch") for n in (
        "_vmap_increment_nesting", "_vmap_decrement_nesting", "_add_batch_dim", "_remove_batch_dim",
        "_grad_increment_nesting", "_grad_decrement_nesting", "_wrap_for_grad", "_unwrap_for_grad",
        "_jvp_increment_nesting", "_jvp_decrement_nesting", "_wrap_functional_tensor", "_unwrap_functional_tensor",
        "_func_increment_nesting", "_func_decrement_nesting", "set_inplace_requires_grad_allowed",
        "get_inplace_requires_grad_allowed", "_set_dynamic_layer_keys_included", "maybe_current_level",
        "is_batchedtensor", "get_unwrapped", "_unwrap_batched", "_is_functionaltensor", "current_level")},
    **{f"torch._functorch.predispatch.{n}": StateFunction("functorch") for n in (
        "_add_batch_dim", "_remove_batch_dim", "_vmap_increment_nesting", "_vmap_decrement_nesting",
        "lazy_load_decompositions")},
    **{f"torch._functorch.vmap.{n}": StateFunction("functorch") for n in (
        "lazy_load_decompositions", "_check_randomness_arg")},
}


@functools.lru_cache(maxsize=1)
def _state_objects() -> dict[int, str]:
    found = {}
    for name in STATE_FUNCTIONS:
        obj: Any = torch
        try:
            for part in name.split(".")[1:]:
                obj = getattr(obj, part)
        except AttributeError:
            continue
        found[id(obj)] = name
    return found


def state_function(fn: Any) -> StateFunction | None:
    name = _state_objects().get(id(fn))
    return STATE_FUNCTIONS[name] if name else None
