"""The graph a replay hands a backend carries the node meta Dynamo handed it: every node's
``example_value``, fake tensors with the recorded symbols (``s77``, an unbacked ``u0``).

A backend that reads the meta and then fails (``support.meta_backend``) is captured as Dynamo
calls it, static, ``dynamic=True``, with ``mark_dynamic``, ``mark_unbacked``, with a
``nonzero()`` whose size is unbacked, and with subgraphs (``cond``, ``while_loop``, ``map``,
``invoke_subgraph``, activation checkpointing: their nodes carry theirs too); the replay calls
the same backend, and both calls wrote down the same meta. Before, the replay's op nodes had no
``example_value`` (a backend reading it saw None), and later its subgraphs' nodes had none; and
until format 1.7 no node had its ``stack_trace`` (the model line it came from)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import reproarchive
from support import meta_backend

_HERE = str(Path(__file__).resolve())
_SITE = str(Path(torch.__file__).resolve().parents[1])


def _as_archived(seen: list[tuple]) -> list[tuple]:
    """What Dynamo gave, with the paths of this machine as an archive keeps them (spec §7.1, 1.7:
    redacted as records are): this file's under the working folder, written ``.``, and torch's
    (flex_attention's frames reach into it) under ``<site-packages>``."""
    here = Path(_HERE)
    kept = f"./{here.relative_to(Path.cwd().resolve())}" if here.is_relative_to(Path.cwd().resolve()) else None
    out = []
    for entry in seen:
        stack = entry[4]
        if stack is not None and kept is not None:
            stack = stack.replace(_HERE, kept).replace(_SITE, "<site-packages>")
        out.append((*entry[:4], stack))
    return out


def _matmul(x, y):
    return (torch.relu(x) @ y).sum(0) * 2


def _nonzero(x):
    return x.nonzero().view(-1) * 2


def _control_flow(x, y):
    """``cond``, ``while_loop`` (whose fake kernel never runs its condition) and ``map`` with an
    unbacked ``nonzero()`` in its body: Dynamo gives every subgraph node an ``example_value``."""
    def small(x, y):
        return torch.relu(x) + y.sum()

    def large(x, y):
        return x - 1

    r = torch.cond(x.sum() > 0, small, large, (x, y))
    _, r = torch._higher_order_ops.while_loop(lambda i, a: i < 3, lambda i, a: (i + 1, a * 2), (torch.tensor(0), r))
    return r, torch._higher_order_ops.map(lambda row, y: row.nonzero().sum() + y, r, y)


def _marked():
    x = torch.randn(6, 3)
    torch._dynamo.mark_dynamic(x, 0, min=2, max=64)
    return x, torch.randn(3, 5)


def _unbacked():
    x = torch.randn(6, 3)
    torch._dynamo.decorators.mark_unbacked(x, 0)
    return x, torch.randn(3, 5)


@torch.compiler.nested_compile_region
def _region(x, y):
    return torch.relu(x) @ y + x.nonzero().shape[0]


def _regions(x, y):
    """A region compiled once and called twice (``invoke_subgraph``, whose value torch's fake
    propagation does not write), reading a ``torch.Size``."""
    return _region(x, y) + _region(x * 2, y)


def _checkpointed(x, y):
    """Activation checkpointing, whose kernel runs its body through an FX interpreter."""
    return torch.utils.checkpoint.checkpoint(lambda a, b: torch.relu(a) @ b, x, y, use_reentrant=False).sum()


def _marked_first(x, *rest):
    torch._dynamo.mark_dynamic(x, 0, min=2, max=64)
    return (x, *rest)


CASES = {
    "static": (_matmul, lambda: (torch.randn(4, 3), torch.randn(3, 5)), {}, {}),
    "dynamic": (_matmul, lambda: (torch.randn(4, 3), torch.randn(3, 5)), {"dynamic": True}, {}),
    "mark_dynamic": (_matmul, _marked, {}, {}),
    "mark_unbacked": (_matmul, _unbacked, {}, {}),
    "control_flow": (_control_flow, lambda: (torch.randn(4, 3), torch.randn(3)), {"fullgraph": True}, {}),
    "control_flow_marked": (_control_flow, lambda: _marked_first(torch.randn(4, 3), torch.randn(3)),
                            {"fullgraph": True}, {}),
    "invoke_subgraph": (_regions, lambda: (torch.randn(4, 4), torch.randn(4, 4)), {"fullgraph": True, "dynamic": True},
                        {"capture_dynamic_output_shape_ops": True}),
    "checkpoint": (_checkpointed, lambda: (torch.randn(4, 4, requires_grad=True), torch.randn(4, 4)),
                   {"fullgraph": True}, {}),
    "nonzero": (_nonzero, lambda: (torch.tensor([1.0, 0.0, 2.0, 3.0]),), {"fullgraph": True},
                {"capture_dynamic_output_shape_ops": True}),
}


def _dynamo_traces_it(fn, make_args, compile_options, dynamo_config) -> None:
    """Skip a case this torch's Dynamo cannot trace, reproarchive aside (CI runs this file on
    every torch of its matrix; 2.11's cannot trace a ``nonzero()`` inside ``map``'s body)."""
    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(dynamo_config):
            torch.compile(fn, backend=meta_backend.record_and_fail, **compile_options)(*make_args())
    except Exception as err:  # noqa: BLE001 - the planted failure, or Dynamo's own
        if "planted failure" not in str(err):
            pytest.skip(f"torch {torch.__version__}'s Dynamo cannot trace this program: {type(err).__name__}")
    finally:
        torch._dynamo.reset()
        meta_backend.SEEN.clear()


@pytest.mark.parametrize("name", CASES)
def test_the_replay_hands_the_backend_the_meta_dynamo_handed_it(name, tmp_path):
    fn, make_args, compile_options, dynamo_config = CASES[name]
    path = tmp_path / f"{name}.tar.zst"
    _dynamo_traces_it(fn, make_args, compile_options, dynamo_config)
    torch._dynamo.reset()
    meta_backend.SEEN.clear()
    with torch._dynamo.config.patch(dynamo_config):
        compiled = torch.compile(fn, backend=reproarchive.capture(meta_backend.record_and_fail, path=path),
                                 **compile_options)
        with pytest.raises(Exception, match="planted failure"):
            compiled(*make_args())
    torch._dynamo.reset()
    (dynamo_gave,) = meta_backend.SEEN
    assert all(meta is not None for _, op, _, meta, _ in dynamo_gave if op != "get_attr")  # a subgraph's has none
    assert all(_HERE in stack for _, op, _, _, stack in dynamo_gave if op == "call_function")
    dynamo_gave = _as_archived(dynamo_gave)
    meta_backend.SEEN.clear()
    outcome = reproarchive.run(path, backend=meta_backend.BACKEND, isolate=False)
    assert outcome.status == "reproduced", outcome.to_dict()
    assert meta_backend.SEEN == [dynamo_gave]
    # the exported script hands the backend the same (before, a static graph's nodes had none)
    reproarchive.export(path, tmp_path / "script")
    seen = tmp_path / "script-seen.json"
    tests = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(tmp_path / "script" / "repro.py"), "--backend", meta_backend.BACKEND],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, meta_backend.OUT_VARIABLE: str(seen), "PYTHONPATH": str(tests)})
    assert done.returncode == 1 and "planted failure" in done.stderr, done.stderr[-2000:]
    assert json.loads(seen.read_text()) == json.loads(json.dumps(dynamo_gave))


def test_flex_attention_s_score_mod_and_mask_mod_get_the_values_dynamo_gave_them(tmp_path):
    """``flex_attention`` makes its subgraphs' inputs itself (a score and four indices) and its
    fake kernel does not call them as modules: the replay makes them as Dynamo does. Dynamo's
    vmap bookkeeping nodes of the top graph carry no ``example_value``; the replay's carry one,
    so the comparison is over the nodes Dynamo gave one."""
    from torch.nn.attention.flex_attention import flex_attention

    def attend(q, k, v):
        return flex_attention(q, k, v, score_mod=lambda score, b, h, q_idx, kv_idx: score + (q_idx - kv_idx))

    path = tmp_path / "flex.tar.zst"
    torch._dynamo.reset()
    meta_backend.SEEN.clear()
    compiled = torch.compile(attend, backend=reproarchive.capture(meta_backend.record_and_fail, path=path),
                             fullgraph=True)
    with pytest.raises(Exception, match="planted failure"):
        compiled(*[torch.randn(1, 1, 8, 4) for _ in range(3)])
    torch._dynamo.reset()
    (dynamo_gave,) = meta_backend.SEEN
    dynamo_gave = _as_archived(dynamo_gave)
    meta_backend.SEEN.clear()
    assert {where for where, *_ in dynamo_gave} == {"", "score_mod_0", "mask_fn_0"}
    assert reproarchive.run(path, backend=meta_backend.BACKEND, isolate=False).status == "reproduced"
    (replayed,) = meta_backend.SEEN
    assert [e[:3] for e in replayed] == [e[:3] for e in dynamo_gave]
    given = [i for i, entry in enumerate(dynamo_gave) if entry[3] is not None]
    assert [replayed[i] for i in given] == [dynamo_gave[i] for i in given]
