"""pack -> load gives back exactly what went in: values, dtype, layout, autograd and aliasing."""

from __future__ import annotations

import math
import struct

import pytest
import torch
import torch.fx as fx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reproarchive
from reproarchive.codec.tensors import DTYPES


def identity_graph(n: int) -> fx.GraphModule:
    g = fx.Graph()
    xs = [g.placeholder(f"x{i}") for i in range(n)]
    g.output(tuple(xs))
    return fx.GraphModule(torch.nn.Module(), g)


def roundtrip(tmp_path, inputs, **kw):
    path = reproarchive.pack(identity_graph(len(inputs)), inputs, tmp_path / "r.tar.zst", **kw)
    return reproarchive.load(path)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape or a.stride() != b.stride() or a.storage_offset() != b.storage_offset():
        return False
    sa, sb = a.untyped_storage(), b.untyped_storage()
    return sa.nbytes() == sb.nbytes() and bytes(sa) == bytes(sb)


STORABLE = sorted(n for n in DTYPES if DTYPES[n].itemsize > 0)


@pytest.mark.parametrize("name", STORABLE)
def test_every_dtype_roundtrips_bit_exact(tmp_path, name):
    dt = DTYPES[name]
    raw = torch.randint(0, 256, (96,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    t = raw[: (96 // dt.itemsize) * dt.itemsize].view(dt)
    back = roundtrip(tmp_path, [t]).args[0]
    assert same_bits(t, back)


def test_nan_payloads_and_negative_zero_survive(tmp_path):
    bits = [0x7FC00001, 0xFFC12345, 0x80000000, 0x7F800000, 0x00000001]
    t = torch.tensor([struct.unpack("<f", struct.pack("<I", b))[0] for b in bits], dtype=torch.float32)
    t.view(torch.int32)[:] = torch.tensor([b - (1 << 32) if b >= 1 << 31 else b for b in bits], dtype=torch.int32)
    back = roundtrip(tmp_path, [t]).args[0]
    assert back.view(torch.int32).tolist() == t.view(torch.int32).tolist()


def test_views_keep_aliasing_strides_and_offsets(tmp_path):
    base = torch.arange(60, dtype=torch.float32)
    a = base[5:25].view(4, 5)
    b = base.view(6, 10).t()[2:]
    c = base.as_strided((3, 3), (7, 2), 11)
    other = torch.arange(60, dtype=torch.float32)  # equal bytes, separate storage
    back = roundtrip(tmp_path, [a, b, c, other]).args
    for x, y in zip([a, b, c, other], back):
        assert same_bits(x, y)
    assert (back[0].untyped_storage().data_ptr() == back[1].untyped_storage().data_ptr()
            == back[2].untyped_storage().data_ptr())
    assert back[3].untyped_storage().data_ptr() != back[0].untyped_storage().data_ptr()
    back[0][0, 0] = 1234.0  # writes through the shared storage, as it would have originally
    flat = torch.empty(0, dtype=torch.float32).set_(back[1].untyped_storage())
    assert flat[5] == 1234.0 and base[5] != 1234.0
    assert float(back[3][5]) == 5.0


def test_requires_grad_and_non_leaf(tmp_path):
    leaf = torch.randn(3, requires_grad=True)
    nonleaf = leaf * 3
    plain = torch.randn(3)
    back = roundtrip(tmp_path, [leaf, nonleaf, plain]).args
    assert back[0].requires_grad and back[0].is_leaf
    assert back[1].requires_grad and not back[1].is_leaf and back[1].grad_fn is not None
    assert not back[2].requires_grad and back[2].is_leaf
    assert torch.equal(back[1].detach(), nonleaf.detach())


def test_scalars_symints_and_nesting(tmp_path):
    seen = []

    def backend(gm, inputs):
        seen.append(list(inputs))
        return gm.forward

    torch.compile(lambda x, n: x * n + x.shape[0], backend=backend, dynamic=True)(torch.randn(5, 2), 3)
    symints = [v for v in seen[0] if isinstance(v, torch.SymInt)]
    assert symints, "dynamic compile should hand SymInts to the backend"
    values = [7, -2.5, float("inf"), True, None, "text", (1, [2.0, None], (False,)), symints[0]]
    repro = roundtrip(tmp_path, values)
    assert repro.args[:7] == [7, -2.5, float("inf"), True, None, "text", (1, [2.0, None], (False,))]
    assert repro.args[7] == symints[0].node.hint and type(repro.args[7]) is int
    sym = repro.index.inputs[7]
    assert sym.kind == "symint" and sym.expr


def test_zero_storage_is_stored_without_blob_and_duplicate_content_once(tmp_path):
    z = torch.zeros(1000, dtype=torch.float32)
    a = torch.arange(1000, dtype=torch.float32)
    b = a.clone()
    repro = roundtrip(tmp_path, [z, a, b])
    info = reproarchive.inspect(repro.path).to_plain()
    assert info["storage"]["zero_filled"] == 1
    assert info["storage"]["blobs"] == 1
    assert info["storage"]["bytes_after_dedup"] == 4000 and info["storage"]["bytes_logical"] == 12000
    assert torch.equal(repro.args[0], z) and torch.equal(repro.args[2], b)


def test_absent_inputs_are_generated_and_labelled(tmp_path):
    absent = reproarchive.AbsentTensor((4, 5), torch.float16, device="cuda:0")
    with pytest.warns(UserWarning, match="no data"):
        repro = roundtrip(tmp_path, [absent, torch.ones(2)])
    assert repro.fidelity == ["absent", "real"]
    here = "cuda" if torch.cuda.is_available() else "cpu"  # generated where the recorded device is, if here
    assert repro.args[0].shape == (4, 5) and repro.args[0].dtype == torch.float16 and repro.args[0].device.type == here
    assert reproarchive.inspect(repro.path).inputs[0].fidelity == "absent"


def test_device_mapping_and_unavailable_device(tmp_path):
    path = reproarchive.pack(identity_graph(1), [torch.ones(3)], tmp_path / "r.tar.zst")
    assert reproarchive.load(path, device="cpu").args[0].device.type == "cpu"
    assert reproarchive.load(path, device={"cpu": "cpu"}).args[0].device.type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(reproarchive.ReproArchiveError) as err:
            reproarchive.load(path, device="cuda")
        assert err.value.exit_code == 125


def test_graph_with_modules_attributes_and_device_constants(tmp_path):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.seq = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3, padding=1), torch.nn.ReLU(),
                                           torch.nn.BatchNorm2d(3))
            self.register_buffer("offset", torch.tensor(0.5))
            self.weight = torch.nn.Parameter(torch.randn(3))

        def forward(self, x):
            y = self.seq(x) + self.offset
            return y * self.weight.view(1, 3, 1, 1) + torch.ones(1, device=torch.device("cpu"), dtype=torch.float32)

    net = Net().eval()
    gm = fx.symbolic_trace(net)
    x = torch.randn(2, 2, 5, 5)
    path = reproarchive.pack(gm, [x], tmp_path / "m.tar.zst")
    repro = reproarchive.load(path)
    assert torch.equal(repro.gm(*repro.args), gm(x))
    conv = repro.gm.get_submodule("seq.0")
    assert isinstance(conv, torch.nn.Conv2d) and conv.padding == (1, 1)
    assert "torch.nn.modules.conv.Conv2d" in {getattr(e, "class_name", None) for e in repro.index.graph.module_state}


def test_higher_order_subgraphs(tmp_path):
    captured = []

    def backend(gm, inputs):
        captured.append((gm, list(inputs)))
        return gm.forward

    def f(x):
        return torch.cond(x.sum() > 0, lambda y: y.sin(), lambda y: y.cos(), (x,))

    x = torch.randn(4)
    torch.compile(f, backend=backend, fullgraph=True)(x)
    gm, inputs = captured[0]
    path = reproarchive.pack(gm, inputs, tmp_path / "c.tar.zst")
    repro = reproarchive.load(path)
    assert torch.equal(repro.gm(*repro.args)[0], gm(*inputs)[0])
    kinds = {type(e).__name__ for e in repro.index.graph.module_state}
    assert "SubgraphEntry" in kinds


def test_pack_rejects_what_it_cannot_store(tmp_path):
    with pytest.raises(reproarchive.errors.PackError, match="placeholders"):
        reproarchive.pack(identity_graph(2), [torch.ones(1)], tmp_path / "x.tar.zst")
    with pytest.raises(reproarchive.errors.PackError, match="cannot be stored"):
        reproarchive.pack(identity_graph(1), [object()], tmp_path / "x.tar.zst")
    with pytest.raises(reproarchive.errors.PackError, match="to_dense"):
        reproarchive.pack(identity_graph(1), [torch.eye(3).to_sparse()], tmp_path / "x.tar.zst")
    assert not any(tmp_path.iterdir()), "a failed pack must leave nothing behind"


tensors = st.builds(
    lambda dtype, shape, seed, transpose, offset: _make(dtype, shape, seed, transpose, offset),
    st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8, torch.int64, torch.bool,
                     torch.complex64, torch.uint16]),
    st.lists(st.integers(0, 5), min_size=0, max_size=3),
    st.integers(0, 2**16),
    st.booleans(),
    st.integers(0, 3),
)


def _make(dtype, shape, seed, transpose, offset):
    numel = math.prod(shape) + offset
    raw = torch.randint(0, 256, (numel * dtype.itemsize,), dtype=torch.uint8,
                        generator=torch.Generator().manual_seed(seed))
    t = raw.view(dtype)[offset:].view(shape) if numel else torch.empty(shape, dtype=dtype)
    if transpose and t.dim() >= 2:
        t = t.transpose(0, 1)
    return t


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(tensors, min_size=1, max_size=4), st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=2))
def test_property_roundtrip(tmp_path, values, alias_pairs):
    # Make some inputs views of others to exercise storage sharing.
    values = list(values)
    for a, b in alias_pairs:
        if a < len(values) and b < len(values) and values[b].numel():
            src = values[b]
            values[a] = src.as_strided((src.numel() - 1,), (1,), src.storage_offset())
    back = roundtrip(tmp_path, values).args
    for x, y in zip(values, back):
        assert same_bits(x, y)
    ptr = lambda t: t.untyped_storage()._cdata  # noqa: E731
    for i in range(len(values)):
        for j in range(len(values)):
            if ptr(values[i]) == ptr(values[j]):
                assert back[i].untyped_storage().data_ptr() == back[j].untyped_storage().data_ptr()
