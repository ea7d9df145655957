"""Smoke test of the real-compiler minify benchmark's harness (the benchmark itself takes hours:
it is run by hand, see benchmarks/README.md). No compiler runs here."""

from __future__ import annotations

import ast
import json

import torch

from benchmarks import minify_inductor as bench


def test_programs_have_the_planned_ops_and_one_relu():
    for n in bench.SIZES:
        text = bench.program("compile_error", n, seed=n)
        tree = ast.parse(text)
        inner = next(f for f in tree.body if isinstance(f, ast.FunctionDef))
        calls = [node for stmt in inner.body for node in ast.walk(stmt) if isinstance(node, (ast.Call, ast.BinOp))]
        assert len(calls) == n, n
        assert text.count("torch.relu(") == 1
        assert "inject_relu_bug_TESTING_ONLY = 'compile_error'" in text
    scope: dict = {}
    exec(compile(bench.program("accuracy", 10, 10).split("@torch.compile()")[1].split("torch.manual_seed")[0],
                 "program", "exec"), {"torch": torch}, scope)
    assert scope["inner"](*[torch.randn(2, 2) for _ in range(4)]).shape == (2, 2)


def test_forward_ops_and_table(tmp_path):
    code = ("class Repro:\n    def forward(self, a):\n"
            "        relu = torch.ops.aten.relu.default(a)\n        return (relu,)\n")
    assert bench._forward_ops(code) == ["relu"]
    row = {"row": "compile_error-10", "kind": "compile_error", "ops_before": 10, "minimum": 1, "dump_wall_s": 1,
           "load_before": [3.0, 3, 3], "load_after": [4.0, 4, 4], "cores": 2, "time": "t",
           "results": [{"variant": "default", "first": "torch",
                        "torch": {"ops_after": 1, "final": ["relu"], "calls": 18, "wall_s": 200.0, "cpu_s": 150.0},
                        "ours": {"ops_after": 1, "final": ["relu"], "calls": 12, "node_calls": 7, "input_calls": 5,
                                 "wall_s": 40.0, "cpu_s": 25.0, "pack_wall_s": 12.0}}]}
    (tmp_path / "compile_error-10.json").write_text(json.dumps(row))
    text = bench.table(tmp_path)
    assert "| compile_error-10 | 10 | 1 (relu) | 18 | 200 | 150 | 1 (relu) | 12 (7+5) | 40 | 25 | 12 | 20% |" in text
    assert "PyTorch 200 s, reproarchive 40 s (20%), 52 s with pack (26%)" in text
