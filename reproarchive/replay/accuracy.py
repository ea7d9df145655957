"""Is a compiled result "wrong"? Per-output error figures and the pass/fail rule.

PyTorch answers with ``torch._dynamo.utils.same``, which returns one bool and logs the reason;
an archive needs the numbers, per output, so that "still wrong" can be checked on replay and
a teammate can see how wrong without running anything. The rule below is PyTorch's (so a
failure PyTorch's minifier calls an accuracy failure is one here too), with figures attached.

The rule, for each output (and, after a backward, each input gradient), ``tol`` defaulting to
PyTorch's ``repro_tolerance`` (1e-3):

1. Shapes must match and dtypes must be identical.
2. Bool tensors must be equal (PyTorch compares them as uint8 with ``allclose``, i.e. equal);
   integer tensors must be equal; non-tensor leaves (ints, strings, None, devices) must be
   equal. With ``ignore_non_fp`` these are skipped, as PyTorch's minifier does.
3. Floating / complex tensors pass when ``allclose(eager, compiled, atol=tol, rtol=tol,
   equal_nan=True)``.
4. Otherwise, when an fp64 reference is available (the graph run with its floating inputs,
   parameters and dtype arguments cast to float64), the output passes when
   ``RMSE(compiled, fp64) <= m * RMSE(eager, fp64) + tol / 10``: the compiled result may be
   less exact than eager, but only by a bounded factor. ``m`` is 2, or 3 for fp16/bf16 results,
   for outputs with fewer than 1000 elements, for 4-D outputs with a 1x1 spatial shape, or
   when ``tol >= 0.02`` (PyTorch's noise allowances). If eager has NaNs where both fp64 and
   compiled are finite and agree within 0.04, the output passes (the compiled one is better).
   If both RMSEs are NaN (the fp64 reference itself has NaNs), the rule is applied to the
   elements where fp64 is finite -- PyTorch passes such an output whatever its other elements
   hold (``log1p`` computed as ``x + 1`` on inputs with some ``x < -1`` passed). Without an fp64
   reference, step 3 decides.

The report adds, per output: max absolute error, max relative error (over elements where
eager is non-zero), the number of mismatched elements and the index of the worst one, and
both RMSEs against fp64. That is the "or better" over ``same()``: same decision, but it says
where and by how much.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from reproarchive.codec.device_runtime import devices_of, forked_rng, synchronize
from reproarchive.codec.rng import random_ops
from reproarchive.compat import inductor
from reproarchive.compat.pytree import keystr, tree_flatten_with_path, tree_leaves
from reproarchive.errors import EagerFailed
from reproarchive.format.plain import from_plain
from reproarchive.format.schema import AccuracyOutput, AccuracyReport
from reproarchive.replay.fp64_run import _requires_bwd, _scalar_loss, fp64_reference
from reproarchive.replay.input_writes import clone_inputs as clone_inputs  # moved there; runner uses it here
from reproarchive.replay.input_writes import run_inputs

DEFAULT_TOLERANCE = 1e-3
#: The accuracy rule of a graph that draws no random numbers.
PLAIN_RULE = "eager and compiled from copies of the same inputs"


@contextlib.contextmanager
def fair_to_randomness(gm: Any) -> Iterator[str]:
    """The accuracy rule for ``gm``, entered for its compile and check; yields its description.

    A graph that draws random numbers (``codec.rng.random_ops``) is compared with every run
    (eager, fp64, compiled) starting from the same generator state (``check_accuracy`` does that
    for every graph) and compiled with inductor's ``fallback_random``, so that inductor's random
    ops draw as eager's do: with its own RNG, inductor's dropout masks differ from eager's and a
    correct graph "differs from eager". Never by switching the graph to ``eval()``, which hides
    the training-mode behaviour (dropout, batch norm) that may be the bug."""

    ops = random_ops(gm)
    if not ops:
        yield PLAIN_RULE
        return
    with inductor.patched_config({"fallback_random": True}):
        yield (f"fair to randomness ({', '.join(ops)}): eager, fp64 and compiled start from the same RNG state, "
               "inductor with fallback_random")


# ---------------------------------------------------------------------------------------------
# Running a graph
# ---------------------------------------------------------------------------------------------


def _sum_loss(out: Any) -> Any:
    """Every output that requires grad, summed: each gradient seeded with ones, the scale of a
    training loss that sums. For a check run whose values nobody reads (``seed="ones"``): the
    mean's 1/numel, carried back through a deep stack of layers without normalisation, falls
    to denormal floats, which x86 computes several times slower (measured: 85 blocks of
    Linear(2048, 2048) + ReLU, a backward of 2.5 s against 0.8 s), so the check would cost
    more than the step it checks."""

    return sum(x.sum() for x in tree_leaves(out) if isinstance(x, torch.Tensor) and x.requires_grad)


def run_forward_backward(fn: Callable, args: list[Any], *, fwd_only: bool = False,
                         seed: str = "mean", backward_if: Callable[[Any], bool] | None = None) -> dict[str, Any]:
    """Call ``fn(*args)`` and, when an output requires grad and ``fwd_only`` is false (and
    ``backward_if(outputs)`` holds, when given), reduce the outputs to a scalar (``seed``:
    ``"mean"``, PyTorch's reduction, whose gradients are compared; ``"ones"``, ``_sum_loss``,
    for a run that only has to not fail) and call ``backward()``.

    Dynamo-level backends' results are always called with ``*args`` even when, like
    ``compile_fx``'s, they carry ``_boxed_call = True``, so that attribute is deliberately
    not consulted (PyTorch's ``run_fwd_maybe_bwd`` does, which
    breaks on inductor's Dynamo-level output).

    ``args`` are used as given (pass ``clone_inputs(...)``). Returns ``{"outputs": out,
    "grads": {input index: grad}}`` (grads of the tensor inputs that require grad); compare two such results with
    ``compare``. An exception from the call or from the backward gets an attribute
    ``reproarchive_stage`` = ``"forward"`` / ``"backward"`` and propagates unchanged.
    """

    devices = devices_of(args)
    try:
        out = fn(*args)
        synchronize(devices)  # an asynchronous kernel error belongs to this stage
    except Exception as exc:
        _tag(exc, "forward")
        raise
    grads: dict[int, Any] = {}
    if not fwd_only and torch.is_grad_enabled() and _requires_bwd(out) and (backward_if is None or backward_if(out)):
        try:
            (_sum_loss(out) if seed == "ones" else _scalar_loss(out)).backward()
            synchronize(devices)
        except Exception as exc:
            _tag(exc, "backward")
            raise
        grads = {i: a.grad for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad}
    return {"outputs": out, "grads": grads}


def _tag(exc: BaseException, stage: str) -> None:
    try:
        if not hasattr(exc, "reproarchive_stage"):
            exc.reproarchive_stage = stage  # type: ignore[attr-defined]
    except Exception:  # exceptions with __slots__
        pass


def stage_of(exc: BaseException, default: str = "forward") -> str:
    return getattr(exc, "reproarchive_stage", default)


def check_accuracy(
    eager_gm: Any,
    compiled_fn: Callable,
    args: Sequence[Any],
    *,
    fwd_only: bool = False,
    tol: float = DEFAULT_TOLERANCE,
    use_fp64: bool = True,
    ignore_non_fp: bool = False,
    written: frozenset[int] | None = None,
) -> AccuracyReport:
    """Run eager, fp64 and compiled on separate copies of ``args`` and ``compare`` them.

    ``written``: the inputs the graph writes (``input_writes.written_inputs``); only those are
    copied for each run, the others are aliased (``input_writes.run_inputs``). None copies all.

    Each run starts from the same RNG state (the one current at the call: a replay sets the
    recorded one first), so graphs with random ops are compared fairly as far as the backend
    allows; inductor's own RNG differs from eager's unless it compiled under
    ``fair_to_randomness``. The caller's RNG state is restored afterwards. An exception in the
    eager run is re-raised as ``EagerFailed`` (the graph itself is broken: not the backend's
    fault); an exception in the compiled run propagates tagged with its stage (see
    ``run_forward_backward``).
    """
    with forked_rng(devices_of(args)) as rng:
        try:
            eager = run_forward_backward(copy.deepcopy(eager_gm), run_inputs(args, written), fwd_only=fwd_only)
        except Exception as exc:
            raise EagerFailed(f"the graph fails in eager mode: {type(exc).__name__}: {exc}") from exc
        fp64, fp64_error = (None, "disabled")
        if use_fp64:
            rng.restore()
            fp64, fp64_error = fp64_reference(eager_gm, args, fwd_only=fwd_only, written=written)
        rng.restore()
        compiled = run_forward_backward(compiled_fn, run_inputs(args, written), fwd_only=fwd_only)
    report = compare(eager, compiled, fp64, tol=tol, ignore_non_fp=ignore_non_fp)
    return dataclasses.replace(report, fp64_reference="used" if fp64 is not None else f"unavailable ({fp64_error})",
                               fwd_only=bool(fwd_only))


# ---------------------------------------------------------------------------------------------
# Comparing results
# ---------------------------------------------------------------------------------------------


def _label(path: tuple) -> str:
    """``output[0]``, ``grad of input 3`` rather than pytree's ``['outputs'][0]``."""
    first = getattr(path[0], "key", None) if path else None
    if first == "outputs":
        return "output" + keystr(path[1:])
    if first == "grads" and len(path) > 1:
        return f"grad of input {getattr(path[1], 'key', '?')}" + keystr(path[2:])
    return keystr(path) or "output"


def _flatten(tree: Any) -> tuple[list[str], list[Any]]:
    pairs, _ = tree_flatten_with_path(tree)
    return [_label(p) for p, _ in pairs], [leaf for _, leaf in pairs]


def _fmt_dtype(t: Any) -> str:
    return str(t.dtype).replace("torch.", "")


def _float(x: Any) -> float | None:
    if x is None:
        return None
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _rmse(a: Any, b: Any) -> float:
    if a.numel() == 0:
        return 0.0
    diff = (a.to(torch.complex128 if a.is_complex() or b.is_complex() else torch.float64)
            - b.to(torch.complex128 if a.is_complex() or b.is_complex() else torch.float64))
    return float(torch.sqrt(torch.mean(diff.abs().square())).item())


def _errors(ref: Any, res: Any, tol: float) -> dict[str, Any]:
    """Element-wise figures: NaN in the same place counts as equal, NaN against a number as an
    infinite error."""

    if ref.numel() == 0:
        return {"max_abs_error": 0.0, "max_rel_error": 0.0, "mismatched_elements": 0, "worst_index": None}
    wide = torch.complex128 if ref.is_complex() else torch.float64
    r, s = ref.detach().to(wide), res.detach().to(wide)
    diff = (r - s).abs()
    both_nan = r.isnan() & s.isnan()
    diff = torch.where(both_nan, torch.zeros_like(diff), diff)
    diff = torch.where(diff.isnan(), torch.full_like(diff, math.inf), diff)
    same_inf = (r == s) & r.isinf()
    diff = torch.where(same_inf, torch.zeros_like(diff), diff)
    flat = diff.reshape(-1)
    worst = int(torch.argmax(flat).item())
    nonzero = r.abs() > 0
    rel = torch.where(nonzero, diff / r.abs().where(nonzero, torch.ones_like(r.abs())), torch.zeros_like(diff))
    mismatched = diff > (tol + tol * r.abs().nan_to_num(0.0, math.inf, math.inf))
    return {
        "max_abs_error": float(flat[worst].item()),
        "max_rel_error": float(rel.max().item()),
        "mismatched_elements": int(mismatched.sum().item()),
        "worst_index": [int(i) for i in _unravel(worst, tuple(ref.shape))],
    }


def _unravel(index: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for dim in reversed(shape):
        out.append(index % dim if dim else 0)
        index = index // dim if dim else 0
    return list(reversed(out))


def _multiplier(res: Any, fp64: Any, ref: Any, tol: float) -> float:
    m = 3.0 if res.dtype in (torch.float16, torch.bfloat16) else 2.0
    if fp64.numel() < 1000 or (ref.ndim == 4 and ref.shape[-1] == ref.shape[-2] == 1) or tol >= 2e-2:
        m = 3.0
    return m


def _compare_tensors(ref: Any, res: Any, fp64: Any, tol: float, ignore_non_fp: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "shape": list(ref.shape),
        "dtype": _fmt_dtype(ref),
        "numel": int(ref.numel()),
        "max_abs_error": None,
        "max_rel_error": None,
        "mismatched_elements": None,
        "worst_index": None,
        "rmse_vs_fp64_eager": None,
        "rmse_vs_fp64_compiled": None,
        "passed": False,
        "rule": None,
        "reason": None,
    }
    if ref.is_sparse:
        ref = ref.to_dense()
    if getattr(res, "is_sparse", False):
        res = res.to_dense()
    if tuple(ref.shape) != tuple(res.shape):
        entry.update(rule="shape", reason=f"shape {list(res.shape)} instead of {list(ref.shape)}")
        return entry
    if ref.dtype != res.dtype:
        entry.update(rule="dtype", reason=f"dtype {_fmt_dtype(res)} instead of {_fmt_dtype(ref)}")
        return entry
    if res.device != ref.device:
        res = res.to(ref.device)
    exact = not (ref.is_floating_point() or ref.is_complex())
    if exact:
        if ignore_non_fp:
            entry.update(passed=True, rule="skipped (non-floating)")
            return entry
        entry.update(_errors(ref.to(torch.int64) if ref.dtype == torch.bool else ref,
                             res.to(torch.int64) if res.dtype == torch.bool else res, 0.0))
        ok = bool(torch.equal(ref, res))
        entry.update(passed=ok, rule="exact", reason=None if ok else "values differ")
        return entry

    entry.update(_errors(ref, res, tol))
    has_fp64 = isinstance(fp64, torch.Tensor) and fp64.dtype in (torch.float64, torch.complex128) \
        and tuple(fp64.shape) == tuple(ref.shape)
    if has_fp64:
        fp64 = fp64.to(ref.device)
        entry["rmse_vs_fp64_eager"] = _rmse(fp64, ref)
        entry["rmse_vs_fp64_compiled"] = _rmse(fp64, res)
    if torch.allclose(ref, res, atol=tol, rtol=tol, equal_nan=True):
        entry.update(passed=True, rule="allclose")
        return entry
    if not has_fp64:
        entry.update(rule="allclose", reason=f"not within atol=rtol={tol:g} and no fp64 reference")
        return entry
    if (not fp64.isnan().any() and not res.isnan().any() and ref.isnan().any()
            and torch.allclose(fp64.to(res.dtype), res, atol=0.04, rtol=0.04, equal_nan=True)):
        entry.update(passed=True, rule="fp64 (eager has NaNs, compiled matches fp64)")
        return entry
    return _fp64_rule(entry, ref, res, fp64, tol)


def _fp64_rule(entry: dict[str, Any], ref: Any, res: Any, fp64: Any, tol: float) -> dict[str, Any]:
    """Step 4 of the rule: compiled's RMSE against fp64 bounded by eager's, on ``entry`` (the
    figures of an output that ``allclose`` failed, its RMSEs filled in)."""

    ref_err, res_err = entry["rmse_vs_fp64_eager"], entry["rmse_vs_fp64_compiled"]
    m = _multiplier(res, fp64, ref, tol)
    rule = f"fp64 rmse (multiplier {m:g})"
    if math.isnan(ref_err) and math.isnan(res_err):
        # NaN in the reference (log1p of x < -1, say) makes both RMSEs NaN whatever the other
        # elements hold; PyTorch lets that pass. Judge the elements the reference can vouch for.
        finite = torch.isfinite(fp64)
        if not bool(finite.any()):
            entry.update(passed=True, rule="fp64 rmse (no finite reference values)")
            return entry
        ref_err, res_err = _rmse(fp64[finite], ref[finite]), _rmse(fp64[finite], res[finite])
        rule = f"fp64 rmse over the {int(finite.sum())} elements where fp64 is finite (multiplier {m:g})"
        if math.isnan(ref_err):  # eager is broken where fp64 is not: nothing to hold compiled to
            entry.update(passed=True, rule=rule)
            return entry
    bound = m * ref_err + tol / 10.0
    ok = res_err <= bound
    entry.update(
        passed=bool(ok),
        rule=rule,
        reason=None if ok else (f"RMSE vs fp64 {res_err:.3g} > {m:g} * {ref_err:.3g} + {tol / 10:g} "
                                f"(eager's RMSE vs fp64)"),
    )
    return entry


def _compare_leaf(ref: Any, res: Any, fp64: Any, tol: float, ignore_non_fp: bool) -> dict[str, Any]:
    if isinstance(ref, float) and isinstance(res, (float, int)):
        ref, res = torch.tensor(ref, dtype=torch.float64), torch.tensor(float(res), dtype=torch.float64)
        fp64 = torch.tensor(float(fp64), dtype=torch.float64) if isinstance(fp64, (float, int)) else None
    if isinstance(ref, torch.Tensor):
        if not isinstance(res, torch.Tensor):
            return {"shape": list(ref.shape), "dtype": _fmt_dtype(ref), "passed": False, "rule": "type",
                    "reason": f"compiled returned {type(res).__name__} instead of a tensor"}
        return _compare_tensors(ref, res, fp64, tol, ignore_non_fp)
    entry: dict[str, Any] = {"shape": None, "dtype": type(ref).__name__, "rule": "equal"}
    if ignore_non_fp:
        entry.update(passed=True, rule="skipped (non-floating)")
        return entry
    try:
        ok = bool(ref == res) and type(ref) is type(res)
    except Exception:
        ok = False
    entry.update(passed=ok, reason=None if ok else f"{res!r} instead of {ref!r}"[:200])
    return entry


def compare(
    eager_out: Any,
    compiled_out: Any,
    fp64_out: Any = None,
    *,
    tol: float = DEFAULT_TOLERANCE,
    ignore_non_fp: bool = False,
) -> AccuracyReport:
    """Compare a compiled result with eager (and an optional fp64 reference) by the rule in
    this module's docstring.

    The three arguments are any pytrees (tensors, tuples, lists, dicts, scalars), typically the
    dicts ``run_forward_backward`` returns. The report has one ``AccuracyOutput`` per leaf, with
    its figures, and is what a failure record's ``accuracy`` field holds.
    """
    names, ref_leaves = _flatten(eager_out)
    res_names, res_leaves = _flatten(compiled_out)
    fp64_leaves: list[Any] | None = None
    if fp64_out is not None:
        _, fp64_leaves = _flatten(fp64_out)
        if len(fp64_leaves) != len(ref_leaves):
            fp64_leaves = None
    outputs: list[dict[str, Any]] = []
    if len(ref_leaves) != len(res_leaves):
        summary = (f"compiled returned {len(res_leaves)} values where eager returned "
                   f"{len(ref_leaves)}")
        return AccuracyReport(passed=False, tolerance=tol, summary=summary)
    for i, (name, ref, res) in enumerate(zip(names, ref_leaves, res_leaves)):
        fp64 = fp64_leaves[i] if fp64_leaves is not None else None
        entry = _compare_leaf(ref, res, fp64, tol, ignore_non_fp)
        for key in ("max_abs_error", "max_rel_error", "rmse_vs_fp64_eager", "rmse_vs_fp64_compiled"):
            entry[key] = _float(entry.get(key))
        outputs.append({"index": i, "name": name, **entry})
    failed = [o for o in outputs if not o["passed"]]
    if not failed:
        summary = f"all {len(outputs)} outputs within tolerance {tol:g}"
    else:
        parts = []
        for o in failed[:3]:
            what = f"{o['name']} ({o['dtype']}{o['shape'] if o['shape'] is not None else ''})"
            detail = o.get("reason") or "differs"
            if o.get("max_abs_error") is not None:
                detail += f"; max abs error {o['max_abs_error']:.3g}"
                if o.get("mismatched_elements") is not None:
                    detail += f" ({o['mismatched_elements']} of {o.get('numel')} elements)"
            parts.append(f"{what}: {detail}")
        more = f"; and {len(failed) - 3} more" if len(failed) > 3 else ""
        summary = (f"{len(failed)} of {len(outputs)} outputs differ from eager beyond tolerance "
                   f"{tol:g}: " + "; ".join(parts) + more)
    return AccuracyReport(passed=not failed, tolerance=tol, summary=summary,
                          outputs=tuple(from_plain(AccuracyOutput, o) for o in outputs))

