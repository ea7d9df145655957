"""Node stacks (spec §7.1, format 1.7): what Dynamo gave each node comes back from the archive
as Dynamo printed it, with this machine's paths redacted; text that could break a line of the
code FX generates never reaches it, from a writer or from a hostile archive."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import reproarchive
from reproarchive.archive.graph_code import graph_code
from reproarchive.errors import UnsafeArchiveError
from reproarchive.format.schema import MAX_STACK_FRAMES
from support.cli import invoke
from support.hostile_corpus import parse, rebuild

HERE = Path(__file__).resolve()


def _helper(x):
    return torch.sin(x) * 2


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return _helper(self.lin(x)).relu()


def _dynamo_graph():
    seen = []

    def backend(gm, example_inputs):
        seen.append((gm, example_inputs))
        return gm

    torch._dynamo.reset()
    torch.compile(_Net(), backend=backend)(torch.randn(2, 4))
    torch._dynamo.reset()
    return seen[0]


def test_a_dynamo_graph_s_stacks_come_back_as_dynamo_printed_them(tmp_path, monkeypatch):
    gm, inputs = _dynamo_graph()
    monkeypatch.chdir(HERE.parents[2])  # the working folder is written ".", as a capture writes it
    path = reproarchive.pack(gm, inputs, tmp_path / "g.tar.zst")
    repro = reproarchive.load(path)
    relative = f"./{HERE.relative_to(Path.cwd().resolve())}"
    given = {n.name: n.meta.get("stack_trace") for n in gm.graph.nodes}
    back = {n.name: n.meta.get("stack_trace") for n in repro.gm.graph.nodes}
    assert given.keys() == back.keys()
    assert {k: v.replace(str(HERE), relative) if v else v for k, v in given.items()} == back
    assert "in _helper" in back["sin"] and "return torch.sin(x) * 2" in back["sin"]
    # each distinct stack once: the three op nodes under _helper's call share theirs
    assert len(repro.index.graph.stacks) < sum(n.op != "output" for n in gm.graph.nodes)
    assert str(HERE.parent) not in str(repro.index.graph.stacks)
    # FX's generated code names the model line above the node, as it did for Dynamo's graph
    code = repro.gm.print_readable(print_output=False)
    assert f"# File: {relative}:" in code and "code: return torch.sin(x) * 2" in code
    # and so does the archive's graph.py for people (inspect --graph), its paths redacted likewise
    stored = graph_code(path)
    assert f"# File: {relative}:" in stored and "code: return torch.sin(x) * 2" in stored
    assert str(HERE.parent) not in stored
    # inspect lists the model lines the ops came from, in graph order
    lines = reproarchive.inspect(path).graph.model_lines
    assert [line.split(" in ", 1)[1] for line in lines] == ["forward: return _helper(self.lin(x)).relu()",
                                                           "_helper: return torch.sin(x) * 2"]
    assert all(line.startswith(f"{relative}:") for line in lines)
    shown = invoke("inspect", path)
    assert shown.exit_code == 0 and f"model lines: {len(lines)}\n  {lines[0]}\n" in shown.output


def _graph_with(stack_trace: str):
    g = torch.fx.Graph()
    x = g.placeholder("x")
    node = g.call_function(torch.relu, (x,))
    node.meta["stack_trace"] = stack_trace
    g.output((node,))
    return torch.fx.GraphModule(torch.nn.Module(), g)


def test_a_writer_keeps_each_frame_on_one_line(tmp_path):
    """A ``\\r`` in a source line (a file saved with old Mac line ends) would be a line of code
    in FX's generated comment: the writer writes it as U+FFFD; a tab stays."""
    text = '  File "./m.py", line 3, in forward\n    a = f(x)\rimport os\t# two\n'
    path = reproarchive.pack(_graph_with(text), [torch.ones(2)], tmp_path / "cr.tar.zst")
    (relu,) = [n for n in reproarchive.load(path).gm.graph.nodes if n.op == "call_function"]
    assert relu.meta["stack_trace"] == '  File "./m.py", line 3, in forward\n    a = f(x)\ufffdimport os\t# two\n'


def test_a_file_in_a_folder_the_writer_does_not_know_keeps_only_its_name(tmp_path):
    text = ('  File "/data/team-secret/model.py", line 3, in forward\n    return f(x)\n'
            '  File "C:\\Users\\ann\\lib.py", line 9, in f\n    return x.relu()\n'
            '  File "<eval_with_key>.3", line 2, in forward\n    relu = x.relu()\n')
    path = reproarchive.pack(_graph_with(text), [torch.ones(2)], tmp_path / "far.tar.zst")
    (stack,) = reproarchive.load(path).index.graph.stacks
    assert [f.file for f in stack] == ["<path>/model.py", "<path>/lib.py", "<eval_with_key>.3"]


def test_fx_s_own_tracer_s_stacks_are_kept_as_it_recorded_them(tmp_path):
    """``fx.Tracer(record_stack_traces=True)`` writes its first frame without indent."""
    tracer = torch.fx.Tracer()
    tracer.record_stack_traces = True
    gm = torch.fx.GraphModule(_Net(), tracer.trace(_Net()))
    given = [n.meta.get("stack_trace") for n in gm.graph.nodes if n.op == "call_function"]
    assert given and all(given)
    path = reproarchive.pack(gm, [torch.randn(2, 4)], tmp_path / "fx.tar.zst")
    back = [n.meta.get("stack_trace") for n in reproarchive.load(path).gm.graph.nodes if n.op == "call_function"]
    assert [len(b.split(", line ")) for b in back] == [len(g.split(", line ")) for g in given]  # every frame


def test_a_model_line_is_the_innermost_frame_outside_torch(tmp_path):
    """flex_attention's body is traced inside torch's own function: its model line is the
    user's call of it. A stack of torch's frames only names none."""
    user = '  File "./m.py", line 3, in forward\n    return flex_attention(q, k, v)\n'
    torch_frame = '  File "<site-packages>/torch/nn/attention/flex_attention.py", line 9, in flex_attention\n    x\n'
    path = reproarchive.pack(_graph_with(user + torch_frame), [torch.ones(2)], tmp_path / "flex.tar.zst")
    assert reproarchive.inspect(path).graph.model_lines == ("./m.py:3 in forward: return flex_attention(q, k, v)",)
    path = reproarchive.pack(_graph_with(torch_frame), [torch.ones(2)], tmp_path / "torch.tar.zst")
    assert reproarchive.inspect(path).graph.model_lines == () and reproarchive.load(path).index.graph.stacks


def test_only_the_innermost_frames_of_a_deep_stack_are_kept(tmp_path):
    text = "".join(f'  File "./m.py", line {i}, in f{i}\n    g()\n' for i in range(MAX_STACK_FRAMES + 40))
    path = reproarchive.pack(_graph_with(text), [torch.ones(2)], tmp_path / "deep.tar.zst")
    (stack,) = reproarchive.load(path).index.graph.stacks
    assert len(stack) == MAX_STACK_FRAMES and stack[-1].name == f"f{MAX_STACK_FRAMES + 39}"


def test_text_that_is_not_a_stack_is_not_recorded(tmp_path):
    path = reproarchive.pack(_graph_with("no frames here"), [torch.ones(2)], tmp_path / "none.tar.zst")
    repro = reproarchive.load(path)
    assert repro.index.graph.stacks is None
    assert all("stack_trace" not in n.meta for n in repro.gm.graph.nodes)


@pytest.mark.parametrize("bad", ["a\rimport os", "a\nimport os", "a\u2028b", "a\x00b"])
def test_a_hostile_frame_is_refused_before_fx_sees_it(tmp_path, bad):
    path = reproarchive.pack(_graph_with('  File "./m.py", line 3, in forward\n    a = f(x)\n'), [torch.ones(2)],
                             tmp_path / "ok.tar.zst")

    def plant(index: dict) -> None:
        index["graph"]["stacks"][0][0]["code"] = bad

    hostile = tmp_path / "hostile.tar.zst"
    hostile.write_bytes(rebuild(parse(Path(path).read_bytes()), plant))
    with pytest.raises(UnsafeArchiveError, match="control character") as refused:
        reproarchive.load(hostile)
    assert refused.value.rule == "R7.1-9"
