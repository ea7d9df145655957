"""A C++ custom op (``torch.utils.cpp_extension.load``, CPU) in a failing compiled model:
its archive records the library's file name and sha256; a fresh process replays it with the
real op (``--load-library``) and without it (a stand-in); ``doctor`` names a changed library.

One build per session (about 7 s of g++ on two cores), cached under the session's tmp folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from reproarchive.codec.custom_ops import library_digest
from support.captures import capture_failure

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fresh_dynamo")]

# The few headers the op needs (ATen/ATen.h, and load_inline's torch/extension.h, cost the
# build 15 s more on two cores).
SOURCE = r"""
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mul.h>

at::Tensor scale(const at::Tensor& x, double alpha) { return at::add(at::mul(x, alpha), 1); }
at::Tensor scale_meta(const at::Tensor& x, double alpha) { return at::empty_like(x); }

TORCH_LIBRARY(ratest_cpp, m) { m.def("scale(Tensor x, float alpha) -> Tensor"); }
TORCH_LIBRARY_IMPL(ratest_cpp, CPU, m) { m.impl("scale", &scale); }
TORCH_LIBRARY_IMPL(ratest_cpp, Meta, m) { m.impl("scale", &scale_meta); }
"""


@pytest.fixture(scope="session")
def cpp_library(tmp_path_factory) -> Path:
    """The built shared library, loaded into this process (``ratest_cpp::scale``)."""
    from torch.utils.cpp_extension import load

    build = tmp_path_factory.mktemp("cpp_op_build")
    (build / "ratest_cpp.cpp").write_text(SOURCE)
    load("ratest_cpp_ext", sources=[str(build / "ratest_cpp.cpp")], is_python_module=False, build_directory=str(build),
         extra_cflags=["-O0"])
    (library,) = [Path(p) for p in torch.ops.loaded_libraries if "ratest_cpp_ext" in str(p)]
    return library


def _cli(*args, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([str(Path(sys.executable).parent / "reproarchive"), *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_cpp_custom_op_with_and_without_its_library(cpp_library, tmp_path):
    def f(x):
        return torch.relu(torch.ops.ratest_cpp.scale(x, 2.0) - 3.0)

    x = torch.linspace(-2, 2, 10)
    path = capture_failure(tmp_path / "cpp.tar.zst", f, [x], "relu_compile_error_TESTING_ONLY")
    from reproarchive.format.reader import ContainerReader

    with ContainerReader(path) as reader:
        (op,) = reader.index.custom_ops
    assert op.name == "ratest_cpp::scale.default" and "CPU" in op.dispatch_keys and op.fake
    assert op.provenance.kind == "library" and op.provenance.library == cpp_library.name
    assert op.provenance.digest == library_digest(cpp_library)
    assert len(op.calls) == 1

    # a fresh process: the library is not loaded there unless the user says so
    stood_in = _cli("run", path, "--json", cwd=tmp_path)
    assert stood_in.returncode == 1, stood_in.stderr[-2000:]
    assert json.loads(stood_in.stdout)["stand_ins"] == ["ratest_cpp::scale.default"]
    real = _cli("run", path, "--json", "--load-library", cpp_library, cwd=tmp_path)
    assert real.returncode == 1, real.stderr[-2000:]
    assert json.loads(real.stdout)["stand_ins"] == []

    changed = tmp_path / "rebuilt" / cpp_library.name
    changed.parent.mkdir()
    shutil.copy(cpp_library, changed)
    with open(changed, "ab") as f:  # another build of the library: other bytes, still loadable
        f.write(b"\0another build")
    report = _cli("doctor", path, "--json", "--load-library", changed, cwd=tmp_path)
    rows = [d for d in json.loads(report.stdout)["differences"] if d["what"] == "custom op"]
    assert len(rows) == 1 and rows[0]["important"] and "another implementation" in rows[0]["current"], report.stdout
