"""A compiled function that launches user Triton kernels and fails in its backend.

    python -m tests.support.triton_program BACKEND OUT_DIR [cuda]

On CPU the kernels run through Triton's interpreter (``triton_on_cpu``)."""

import sys

import torch
import triton

if len(sys.argv) < 4 or sys.argv[3] != "cuda":
    import tests.support.triton_on_cpu  # noqa: F401

import reproarchive
from tests.support.triton_kernels import add_kernel, scale_kernel, tuned_kernel


def step(x, y):
    out = torch.empty_like(x)
    n = x.numel()
    add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)
    scale_kernel[(triton.cdiv(n, 16),)](out, n, 3.0, BLOCK=16)
    if x.is_cuda:
        tuned = torch.empty_like(out)
        tuned_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](out, tuned, n)
        out = tuned
    return torch.relu(out) * 2


if __name__ == "__main__":
    device = sys.argv[3] if len(sys.argv) > 3 else "cpu"
    torch.manual_seed(0)
    x, y = torch.randn(40, device=device), torch.randn(40, device=device)
    compiled = torch.compile(step, backend=reproarchive.capture(sys.argv[1], path=sys.argv[2]))
    try:
        compiled(x, y)
    except Exception as exc:  # noqa: BLE001 - the failure is the point
        print(f"failed as planted: {type(exc).__name__}", file=sys.stderr)
        sys.exit(1)
    sys.exit(0)
