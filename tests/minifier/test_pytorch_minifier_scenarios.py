"""PyTorch's own minifier tests, ported to the CPU, through ``run`` and ``minify``.

The scenarios of torch's test/dynamo/test_minifier.py and test/inductor/test_minifier.py: the
same programs, the same bug injectors (the ``*_TESTING_ONLY`` backends, inductor's C++ relu
injector), captured into archives. Each must be judged the same way by ``run`` and by
``minify`` (its check of the original and its oracle: one replay for every judge), and must
shrink to the op PyTorch's minifier reaches; the minified archive reproduces too.
"""

from __future__ import annotations

import pytest
import torch

import reproarchive
from reproarchive.replay.outcome import REPRODUCED
from support.captures import capture_failure

pytestmark = [pytest.mark.usefixtures("fresh_dynamo"),
              # a minified archive's zeroed inputs are labelled as not the original data
              pytest.mark.filterwarnings("ignore:.*not the original data:UserWarning")]


def sin_relu_cos(n: int):
    """``n`` sines, a relu, ``n`` cosines: test_after_dynamo_* (10) and test_if_graph_minified (20)."""

    def inner(x):
        for _ in range(n):
            x = torch.sin(x)
        x = torch.relu(x)
        for _ in range(n):
            x = torch.cos(x)
        return x

    return inner


after_dynamo, graph_minified = sin_relu_cos(10), sin_relu_cos(20)


def non_leaf(x):
    return x + 1


class CpuDeviceModule(torch.nn.Module):
    """test_cpu_device_module_after_dynamo with both halves on the CPU."""

    def __init__(self):
        super().__init__()
        self.m_x = torch.nn.Linear(20, 20)
        self.m_y = torch.nn.Linear(20, 20)
        self.p_x = torch.nn.Parameter(torch.randn(20, 20))
        self.p_y = torch.nn.Parameter(torch.randn(20, 20))
        self.b_x = torch.nn.Buffer(torch.ones(20, 20))
        self.b_y = torch.nn.Buffer(torch.ones(20, 20))

    def forward(self, x, y):
        return self.m_x(x) + self.p_x + self.b_x, self.m_y(y) + self.p_y + self.b_y


def cpu_device_module():
    mod = CpuDeviceModule()

    def inner(x1, y1):
        x2 = torch.randn(20, 20)
        y2 = torch.randn(20, 20)
        x3, y3 = mod(x1 + x2, y1 + y2)
        return torch.relu(x3.cpu() + y3)

    return inner


# name: (program, inputs, backend, accuracy, the one op the minified graph keeps)
DYNAMO_SCENARIOS = {
    "after_dynamo_compile_error": (after_dynamo, lambda: [torch.randn(20, 20)], "relu_compile_error_TESTING_ONLY",
                                   False, "torch.relu"),
    "after_dynamo_runtime_error": (after_dynamo, lambda: [torch.randn(20, 20)], "relu_runtime_error_TESTING_ONLY",
                                   False, "torch.relu"),
    "after_dynamo_accuracy_error": (after_dynamo, lambda: [torch.randn(20, 20)], "relu_accuracy_error_TESTING_ONLY",
                                    True, "torch.relu"),
    "after_dynamo_non_leaf_compile_error": (non_leaf, lambda: [torch.randn(20, 20, requires_grad=True) + 1],
                                            "non_leaf_compile_error_TESTING_ONLY", False, "operator.add"),
    "cpu_device_module_after_dynamo": (None, lambda: [torch.randn(20, 20), torch.randn(20, 20)],
                                       "relu_compile_error_TESTING_ONLY", False, "torch.relu"),
    "if_graph_minified": (graph_minified, lambda: [torch.randn(20, 20)], "relu_compile_error_TESTING_ONLY", False,
                          "torch.relu"),
}


def _call_targets(path) -> list[str]:
    record = reproarchive.load(path).index.graph
    return [str(n.target) for n in record.nodes if n.op in ("call_function", "call_method", "call_module")]


def _same_verdict_and_minimal(path, tmp_path, expected: str) -> None:
    outcome = reproarchive.run(path, isolate=False)
    assert outcome.status == REPRODUCED, outcome.to_dict()
    report = reproarchive.minify_archive(path, tmp_path / "min.tar.zst")  # raises NotReproducedError otherwise
    assert report.status in ("minified", "unchanged"), report.status
    assert _call_targets(report.output) == [expected], report.code
    again = reproarchive.run(report.output, isolate=False)
    assert again.status == REPRODUCED, again.to_dict()


@pytest.mark.parametrize("name", sorted(DYNAMO_SCENARIOS))
def test_dynamo_minifier_scenario(name, tmp_path):
    program, inputs, backend, accuracy, expected = DYNAMO_SCENARIOS[name]
    program = program or cpu_device_module()
    path = capture_failure(tmp_path / f"{name}.tar.zst", program, inputs(), backend, accuracy=accuracy)
    _same_verdict_and_minimal(path, tmp_path, expected)


def after_aot(x):
    x = torch.relu(x)
    x = torch.cos(x)
    return x


@pytest.mark.slow
def test_inductor_cpu_compile_error_scenario(tmp_path):
    """test_after_aot_cpu_compile_error: inductor's C++ code for relu is made invalid by the
    recorded config; the replay applies it, and every candidate is a real inductor compile."""
    with torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}):
        path = capture_failure(tmp_path / "aot.tar.zst", after_aot, [torch.randn(20, 20)], "inductor")
    assert torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY is None
    _same_verdict_and_minimal(path, tmp_path, "torch.relu")
