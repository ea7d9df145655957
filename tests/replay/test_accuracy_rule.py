"""The accuracy rule where it departs from PyTorch's ``same()``, and the floating-only mode."""

from __future__ import annotations

import torch

from reproarchive.replay.accuracy import compare


def test_nan_in_the_fp64_reference_does_not_hide_a_wrong_result():
    """log1p computed as x + 1 (PyTorch's injector): where x < -1 eager and fp64 are NaN, so both
    RMSEs are NaN and PyTorch's rule passes the output; the elements fp64 vouches for are wrong."""
    torch.manual_seed(0)
    x = torch.randn(20, dtype=torch.float64)
    eager, fp64, compiled = torch.log1p(x.float()), torch.log1p(x), x.float() + 1
    report = compare((eager,), (compiled,), (fp64,))
    assert not report.passed and "where fp64 is finite" in report.outputs[0].rule
    # the same NaNs and otherwise close values still pass
    close = torch.where(torch.isnan(eager), eager, eager + 1e-6)
    assert compare((eager,), (close,), (fp64,)).passed


def test_floating_only_mode_ignores_bool_and_integer_outputs():
    mask, idx, y = torch.tensor([True, False]), torch.tensor([1, 2]), torch.ones(2)
    flipped = (~mask, idx + 1, y)
    assert not compare((mask, idx, y), flipped).passed
    assert compare((mask, idx, y), flipped, ignore_non_fp=True).passed
