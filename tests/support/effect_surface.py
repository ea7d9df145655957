"""Every verdict of the effect rule over torch's public tensor surface, as one table.

The surface: every public callable of the namespaces ``torch.overrides`` indexes (``torch``,
``torch.functional``, ``torch.nn.functional``, ``torch.nn.init``, ``torch.linalg``, ``torch.fft``,
``torch.special`` and ``torch.Tensor``, the functions it ignores included), every method a graph
can call on a tensor (``call_method``), and every overload the dispatcher knows. Run as a script
(``python -m support.effect_surface``) it prints ``{name: reason or null}`` as JSON: the test runs
it in a fresh process, so operators that other tests register do not change the table.
"""

from __future__ import annotations

import json
import sys
import types
import warnings


def verdicts() -> dict[str, str | None]:
    import torch
    import torch.overrides

    from reproarchive.codec import effects

    table: dict[str, str | None] = {}
    _, index = torch.overrides._get_overridable_functions()
    for fn, name in index.items():
        if name.endswith(("__get__", "__set__")):
            continue  # property accessors: a graph reads data attributes with getattr (checked per node)
        table[name] = effects.callable_problem(fn)
    for functions in torch.overrides.get_overridable_functions().values():
        for fn in functions:
            name = index.get(fn) or f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"
            table.setdefault(name, effects.callable_problem(fn))
    for name in dir(torch.Tensor):
        table[f"call_method Tensor.{name}"] = effects.method_problem(name)
    for qualified in sorted(torch._C._dispatch_get_all_op_names()):
        ns, _, rest = qualified.partition("::")
        op_name, _, overload = rest.partition(".")
        try:
            op = getattr(getattr(getattr(torch.ops, ns), op_name), overload or "default")
        except (AttributeError, RuntimeError):
            continue
        if isinstance(op, types.FunctionType):
            continue
        table[f"torch.ops.{ns}.{op_name}.{overload or 'default'}"] = effects.overload_problem(op)
    return table


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    json.dump(verdicts(), sys.stdout, sort_keys=True)
