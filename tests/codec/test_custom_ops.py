"""Custom ops as data, below the archive: which namespaces are torch's own, the content key a
recorded call is matched by, and the operator a custom op's name resolves to."""

from __future__ import annotations

import subprocess
import sys

import torch

from reproarchive.codec import custom_ops as co


def test_every_namespace_torch_registers_is_listed_as_torchs_own():
    """In a fresh process (this one may hold test ops), every operator namespace torch itself
    registers on import, and on importing inductor, is in TORCH_NAMESPACES."""
    code = ("import torch, torch._inductor.compile_fx\n"
            "print(' '.join(sorted({n.split('::')[0] for n in torch._C._dispatch_get_all_op_names()})))")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                           check=True).stdout.split()
    assert "aten" in found
    assert set(found) <= co.TORCH_NAMESPACES, sorted(set(found) - co.TORCH_NAMESPACES)


def test_tensor_key_is_the_content_whatever_the_layout():
    base = torch.arange(12, dtype=torch.float32).view(3, 4)
    strided = base[:, ::2]
    assert co.tensor_key(strided) == co.tensor_key(strided.contiguous())
    assert co.tensor_key(strided) != co.tensor_key(strided + 1)
    assert co.tensor_key(torch.tensor(1.5)).startswith("float32[] sha256:")
    assert co.tensor_key(torch.ones(2, dtype=torch.bfloat16), content=False) == "bfloat16[2]"
    schema = torch._C.parse_schema("ns::op(Tensor x, float alpha=2.0, *, int k=1) -> Tensor")
    key = co.argument_key(schema, (base,), {"k": 3})
    assert key == (co.tensor_key(base), 2.0, 3)
    assert co.meta_key(key) == ("float32[3, 4]", 2.0, 3)


def test_a_custom_op_s_name_resolves_to_the_op_registered_now_not_one_destroyed_before():
    """A library destroyed and defined again in this process (a stand-in withdrawn, the user's
    ``--import``) leaves a freed registration behind: a graph built after it must call the live
    operator (calling the freed one segfaulted a replay now and then)."""
    from reproarchive.codec.targets import resolve_function

    def define(factor):
        lib = torch.library.Library("ra_resolve_test", "FRAGMENT")  # noqa: TOR901 - destroyed below
        lib.define("scale(Tensor x) -> Tensor")
        lib.impl("scale", lambda x: x * factor, "CompositeExplicitAutograd")
        return lib

    name = "torch.ops.ra_resolve_test.scale.default"
    first = define(2)
    assert resolve_function(name)(torch.ones(2)).tolist() == [2.0, 2.0]
    first._destroy()
    second = define(3)
    try:
        op = resolve_function(name)
        assert op is torch.ops.ra_resolve_test.scale.default
        assert op(torch.ones(2)).tolist() == [3.0, 3.0]
    finally:
        second._destroy()
