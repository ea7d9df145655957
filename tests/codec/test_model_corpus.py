"""Real model architectures are never refused: every call target in every Dynamo
graph of ``support.model_corpus`` is allowed by the effect rule, and every graph packs,
verifies, loads bit-exact, replays (eager backend) and exports; and, with a compile failure
planted on a target chosen from the graph itself (``support.planted_failure``), reproduces
(``run`` exit 1) and minifies to that target, and the minified graph exports.

The default suite runs ``model_corpus.SAMPLE`` (one model of each family, MobileNetV3 among
them); the whole corpus (58 models) runs with ``REPROARCHIVE_CORPUS=1 pytest -m corpus
tests/codec/test_model_corpus.py``.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch

import reproarchive
from reproarchive.codec import effects
from reproarchive.replay.outcome import PASSED, REPRODUCED
from support import model_corpus, planted_failure

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

FULL = bool(os.environ.get("REPROARCHIVE_CORPUS"))
REST = [n for n in model_corpus.names() if n not in model_corpus.SAMPLE]


def _refusals(gm: torch.fx.GraphModule) -> list[str]:
    found = []
    for gm_ in [gm, *(m for m in gm.modules() if isinstance(m, torch.fx.GraphModule) and m is not gm)]:
        for node in gm_.graph.nodes:
            if node.op == "call_function":
                why = effects.callable_problem(node.target)
            elif node.op == "call_method":
                why = effects.method_problem(node.target)
            else:
                continue
            if why is not None:
                found.append(f"{node.op} {node.target}: {why}")
    return found


def _same_tensor(a, b) -> bool:
    return (a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
            and a.requires_grad == b.requires_grad and torch.equal(a.detach(), b.detach()))


# The planted failure needs one call of its target, and the minifier cuts every other node into
# an input, so a minimal graph is that one call, plus the ``getitem`` a multi-output target
# (``split``) needs or Python-number arithmetic the search does not cut into an input; the whole
# corpus minifies to 1 op (73 graphs) or 2 (funnel's split+getitem, mul+add).
MAX_MINIFIED_OPS = 3


def check_planted_failure_minifies(gm, inputs, path, monkeypatch) -> None:
    """Plant a compile failure on a target of ``gm``, then ``run`` reproduces it and ``minify``
    keeps that target in a graph of at most MAX_MINIFIED_OPS ops, which reproduces and exports."""
    planted = planted_failure.pack_planted(gm, inputs, path, monkeypatch)
    backend = planted_failure.BACKEND
    outcome = reproarchive.run(path, backend=backend, isolate=False)
    assert (outcome.status, outcome.exit_code) == (REPRODUCED, 1), outcome.to_dict()
    report = reproarchive.minify_archive(path, path.with_name(path.name.replace(".tar.zst", "-min.tar.zst")),
                                         backend=backend)
    kept = planted_failure.compute_keys(reproarchive.load(report.output).gm)
    assert planted in kept and len(kept) <= MAX_MINIFIED_OPS, (planted, kept)
    outcome = reproarchive.run(report.output, backend=backend, isolate=False)
    assert (outcome.status, outcome.exit_code) == (REPRODUCED, 1), outcome.to_dict()
    exported = path.with_name(path.name.replace(".tar.zst", "-min-export"))
    reproarchive.export(report.output, exported)
    assert (exported / "repro.py").is_file()


def check_model(name: str, tmp_path, monkeypatch) -> None:
    if name in model_corpus.TRANSFORMERS:
        pytest.importorskip("transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graphs = model_corpus.graphs(name)
    assert graphs, f"{name}: Dynamo produced no graph"
    refused = [r for gm, _ in graphs for r in _refusals(gm)]
    assert not refused, f"{name}: " + "\n".join(sorted(set(refused)))
    for i, (gm, inputs) in enumerate(graphs):
        path = reproarchive.pack(gm, inputs, tmp_path / f"{name}-{i}.tar.zst", backend="eager")
        assert reproarchive.verify(path).valid
        repro = reproarchive.load(path)
        assert len(repro.args) == len(inputs)
        for got, want in zip(repro.args, inputs):
            assert _same_tensor(got, want) if isinstance(want, torch.Tensor) else got == want, name
        outcome = reproarchive.run(path, isolate=False)
        assert outcome.status == PASSED and outcome.exit_code == 0, outcome.to_dict()
        written = reproarchive.export(path, tmp_path / f"{name}-{i}-export")
        assert (tmp_path / f"{name}-{i}-export" / "repro.py").is_file(), written
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check_planted_failure_minifies(gm, inputs, tmp_path / f"{name}-{i}-planted.tar.zst", monkeypatch)


@pytest.mark.parametrize("name", model_corpus.SAMPLE)
def test_sample_model_graphs_are_allowed_and_go_through_the_whole_flow(name, tmp_path, monkeypatch):
    check_model(name, tmp_path, monkeypatch)


@pytest.mark.corpus
@pytest.mark.skipif(not FULL, reason="the whole model corpus: REPROARCHIVE_CORPUS=1 pytest -m corpus")
@pytest.mark.parametrize("name", REST)
def test_corpus_model_graphs_are_allowed_and_go_through_the_whole_flow(name, tmp_path, monkeypatch):
    check_model(name, tmp_path, monkeypatch)


def test_the_corpus_spans_the_families_and_at_least_fifty_models():
    names = model_corpus.names()
    assert len(names) >= 50, len(names)
    for family in ("mobilenet_v3_small", "efficientnet", "convnext", "regnet", "resnet", "vit", "swin", "deit", "bert",
                   "gpt2", "t5", "llama", "yolos", "wav2vec2"):
        assert family in names, family


def test_a_mobilenet_v3_failure_replays_minifies_and_exports(tmp_path):
    """The MobileNetV3 family's graph (hard-swish, hard-sigmoid) through the failure flow:
    PyTorch's relu injector fails on its squeeze-excitation's relu; ``run`` reproduces it,
    ``minify`` reaches the one relu, and both archives export."""
    from reproarchive.replay.outcome import REPRODUCED
    from support.captures import capture_failure

    model, inputs = model_corpus.build("mobilenet_v3_small")
    with torch.no_grad():
        path = capture_failure(tmp_path / "mnv3.tar.zst", model, [inputs["x"]], "relu_compile_error_TESTING_ONLY")
    targets = [str(n.target) for n in reproarchive.load(path).index.graph.nodes]
    assert "torch.nn.functional.hardswish" in targets and "torch.nn.functional.hardsigmoid" in targets
    assert reproarchive.run(path, isolate=False).status == REPRODUCED
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = reproarchive.minify_archive(path, tmp_path / "min.tar.zst")
    kept = [str(n.target) for n in reproarchive.load(report.output).index.graph.nodes
            if n.op in ("call_function", "call_method", "call_module")]
    assert kept == ["torch.relu"], report.code
    for archive, out in ((path, "export"), (report.output, "export-min")):
        reproarchive.export(archive, tmp_path / out)
        assert (tmp_path / out / "repro.py").is_file()
