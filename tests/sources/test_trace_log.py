"""Real logs made messy: truncated lines, payloads that fail their MD5, interleaved ranks, a log
as an older torch writes it, a cache hit that logs the runnable again, tlparse's output folder,
and a fuzz test over mutated lines. Each mutation starts from a real log of ``trace_jobs``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reproarchive
from reproarchive.errors import SourceError
from reproarchive.sources.trace import facts, log_reader
from reproarchive.sources.trace import pack_trace as trace_import
from reproarchive.sources.trace.pack_trace import list_trace, pack_trace


def _log(trace_dir: Path) -> Path:
    return next(trace_dir.glob("*.log"))


def _events(path: Path) -> list[tuple[str, dict, list[str]]]:
    """(glog prefix, envelope, payload lines) per event of a real log."""
    out: list[tuple[str, dict, list[str]]] = []
    for line in path.read_text().split("\n"):
        if line.startswith("\t"):
            out[-1][2].append(line[1:])
        elif line:
            prefix, _, rest = line.partition("] ")
            out.append((prefix + "] ", json.loads(rest), []))
    return out


def _write(path: Path, events, *, fix_md5: bool = True) -> Path:
    lines = []
    for prefix, env, payload in events:
        if "has_payload" in env and fix_md5:
            env = {**env, "has_payload": hashlib.md5("\n".join(payload).encode()).hexdigest()}
        lines.append(prefix + json.dumps(env))
        lines.extend("\t" + p for p in payload)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _kind(env: dict) -> str:
    return log_reader._event_kind(env)


def test_truncated_and_damaged_lines_are_warnings(trace_jobs, tmp_path):
    real = _log(trace_jobs["compile_error"][1])
    text = real.read_text()
    cut = tmp_path / "cut" / real.name
    cut.parent.mkdir()
    cut.write_text(text[: text.rindex('{"compilation_metrics"') + 40])  # the job died mid-line
    listing = list_trace(cut)
    assert [r["status"] for r in listing["compiles"]] == ["failed"]  # dynamo_error is still there
    assert any("not valid JSON" in w for w in listing["warnings"])

    # an edited graph payload: its MD5 no longer matches, so it is never used
    events = _events(real)
    for _, env, payload in events:
        if _kind(env) == "dynamo_output_graph":
            payload[:] = [p.replace("torch.relu", "torch.sin") for p in payload]
    edited = _write(tmp_path / "edited" / real.name, events, fix_md5=False)
    listing = list_trace(edited)
    assert any("MD5 does not match" in w for w in listing["warnings"])
    with pytest.raises(SourceError, match=r"graph payload is damaged \(MD5 mismatch at line \d+\)"):
        pack_trace(edited, tmp_path / "out")

    # a log cut inside the graph payload: the compile is incomplete and has nothing usable
    head = text[: text.index("torch.relu(", text.index('"dynamo_output_graph"'))]
    (tmp_path / "head").mkdir()
    (tmp_path / "head" / real.name).write_text(head)
    rows = list_trace(tmp_path / "head")["compiles"]
    assert rows[0]["status"] == "incomplete (graph damaged)" and "crashed or was killed" in rows[0]["fail_reason"]

    # a job that died inside the backend (a segfault in a compiler): the graph is logged, the
    # error (and with it the backend's name) never is; pack takes the incomplete compile by
    # default and, given the backend, the replay names the failure
    crashed = tmp_path / "crashed" / real.name
    crashed.parent.mkdir()
    crashed.write_text(text[: text.rindex("\n", 0, text.index('"dynamo_error"')) + 1])
    result = pack_trace(crashed.parent, tmp_path / "crash_out", backend="relu_compile_error_TESTING_ONLY")
    info = reproarchive.inspect(result.packed[0].archive).to_plain()
    assert info["source"]["status"] == "incomplete"
    assert info["source"]["replay"]["failure_from"].startswith("replay")
    assert info["failure"]["exception_type"].endswith("ReluCompileError")


def test_interleaved_ranks_and_per_rank_files(trace_jobs, tmp_path):
    a = _events(_log(trace_jobs["graph_break"][1]))
    b = _events(_log(trace_jobs["dynamic"][1]))
    tagged_a = [(p, {**e, "rank": 0}, pl) for p, e, pl in a]
    tagged_b = [(p, {**e, "rank": 1}, pl) for p, e, pl in b]
    merged = []
    for i in range(max(len(a), len(b))):
        merged += tagged_a[i:i + 1] + tagged_b[i:i + 1]
    single = _write(tmp_path / "one" / "dedicated_log_torch_trace_all.log", merged)
    listing = list_trace(single)
    assert {(r["rank"], r["compile_id"]) for r in listing["compiles"]} == {
        (0, "0/0"), (0, "1/0"), (1, "0/0"), (1, "0/1"), (1, "0/2")}
    assert any("ranks interleaved" in w for w in listing["warnings"])
    trace = log_reader.read_trace(single)
    chosen = trace.select(["0/1"], rank=1)
    assert [trace_import._archive_names(chosen, trace)[id(c)] for c in chosen] == ["repro-rank1-0_1.tar.zst"]
    assert facts.symbols(chosen[0])["s77"]["hint"] == 4
    # both ranks compiled [0/0]: without --rank, one archive each
    both = trace.select(["0/0"])
    assert sorted(trace_import._archive_names(both, trace).values()) == ["repro-rank0-0_0.tar.zst",
                                                                        "repro-rank1-0_0.tar.zst"]

    # a folder with one file per rank, as TORCH_TRACE writes them: the rank is in the name
    folder = tmp_path / "ranks"
    _write(folder / "dedicated_log_torch_trace_rank_0_ab12.log", a)
    _write(folder / "dedicated_log_torch_trace_rank_1_cd34.log", b)
    (folder / "notes.txt").write_text("not a log\n")
    rows = list_trace(folder)["compiles"]
    assert sorted({(r["rank"], r["log"]) for r in rows}) == [
        (0, "dedicated_log_torch_trace_rank_0_ab12.log"), (1, "dedicated_log_torch_trace_rank_1_cd34.log")]
    with pytest.raises(SourceError, match="no compile of rank 5"):
        pack_trace(folder, tmp_path / "out5", rank=5)


def test_a_log_from_an_older_torch(trace_jobs, tmp_path):
    """No attempt field, no describe_* events, no config or versions in the metrics, graphs
    printed without strides: the archive is built from the graph's own annotations."""
    events = []
    for prefix, env, payload in _events(_log(trace_jobs["compile_error"][1])):
        kind = _kind(env)
        if kind.startswith("describe_") or kind == "torch_version":
            continue
        env = {k: v for k, v in env.items() if k != "attempt"}
        if kind == "compilation_metrics":
            env["compilation_metrics"] = {k: v for k, v in env["compilation_metrics"].items()
                                          if not k.endswith("_config")
                                          and k not in ("python_version", "pytorch_version")}
        if kind == "dynamo_output_graph":
            payload = [p.replace("][4, 1]cpu", "]").replace("][8, 2]cpu", "]").replace("][1]cpu", "]")
                       .replace("][2, 1]cpu", "]").replace("][]cpu", "]").replace("][3, 1]cpu", "]") for p in payload]
        events.append((prefix, env, payload))
    old = _write(tmp_path / "old" / "dedicated_log_torch_trace_old.log", events)
    result = pack_trace(old, tmp_path / "out")
    archive = result.packed[0].archive
    assert any("records no config" in w for w in result.packed[0].warnings)
    info = reproarchive.inspect(archive).to_plain()
    assert info["records"]["config"] is None
    records = {r["placeholder"]: r for r in info["source"]["inputs"]}
    assert records["L_x_"]["metadata_from"] == "graph annotation" and records["L_x_"]["shape"] == [3, 4]
    reproarchive.verify(archive, progress=False)
    assert reproarchive.run(archive).status == "reproduced"


def test_cache_hit_logs_the_runnable_again(trace_jobs):
    """A FX-graph cache hit logs fx_graph_runnable again (codecache.cache_hit_post_compile)."""
    trace = trace_jobs["inductor_real"][1]
    events = _events(_log(trace))
    at = max(i for i, (_, e, _) in enumerate(events) if _kind(e) == "fx_graph_runnable")
    prefix, env, payload = events[at]
    hit = (prefix, {**env, "artifact": {"name": "fx_graph_cache_hit", "encoding": "json"}}, ["{}"])
    events[at + 1:at + 1] = [hit, (prefix, dict(env), list(payload))]
    tmp = trace.parent / "cache_hit"
    _write(tmp / _log(trace).name, events)
    c = log_reader.read_trace(tmp).compiles[0]
    assert len(c.runnables()) == 1 and c.cache == {"hit": 1, "runnables_logged": 2}
    graph_from, event = trace_import._choose_graph(c, "auto")
    assert graph_from == "fx_graph_runnable" and event.payload == "\n".join(payload)
    shutil.rmtree(tmp)


@pytest.mark.skipif(shutil.which("tlparse", path=str(Path(sys.executable).parent)) is None
                    and shutil.which("tlparse") is None, reason="tlparse is not installed (pip install tlparse)")
def test_tlparse_output_folder(trace_jobs, tmp_path):
    trace = trace_jobs["dynamic"][1]
    exe = shutil.which("tlparse", path=str(Path(sys.executable).parent)) or shutil.which("tlparse")
    subprocess.run([exe, str(_log(trace)), "-o", str(tmp_path / "tl"), "--no-browser"], check=True,
                   capture_output=True, timeout=120)
    assert [r["compile_id"] for r in list_trace(tmp_path / "tl")["compiles"]] == ["0/0", "0/1", "0/2"]
    result = pack_trace(tmp_path / "tl", tmp_path / "out", compile_ids=["0/1"], replay=False)
    src = reproarchive.inspect(result.packed[0].archive).to_plain()["source"]
    assert src["trace_format"] == "tlparse" and src["frame"]["name"] == "f"
    page = src["tlparse"]["pages"]["dynamo_output_graph"]
    assert page.startswith("-_0_1_0/dynamo_output_graph_") and (tmp_path / "tl" / page).is_file()


# --------------------------------------------------------------------------------------------
# fuzz: any mutation of a real log's lines is a Trace or one SourceError, never a traceback


@pytest.fixture(scope="module")
def log_lines(trace_jobs) -> list[str]:
    return _log(trace_jobs["graph_break"][1]).read_text().split("\n")


_mutation = st.tuples(st.sampled_from(["delete", "truncate", "duplicate", "garble", "swap", "insert", "tab"]),
                      st.integers(0, 10_000), st.integers(0, 10_000))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutations=st.lists(_mutation, min_size=1, max_size=6), junk=st.text(max_size=40))
def test_fuzz_mutated_lines(log_lines, tmp_path_factory, mutations, junk):
    lines = list(log_lines)
    for op, i, j in mutations:
        i %= len(lines)
        if op == "delete":
            del lines[i]
        elif op == "truncate":
            lines[i] = lines[i][: j % (len(lines[i]) + 1)]
        elif op == "duplicate":
            lines.insert(i, lines[i])
        elif op == "garble" and lines[i]:
            k = j % len(lines[i])
            lines[i] = lines[i][:k] + junk + lines[i][k + 1:]
        elif op == "swap":
            k = j % len(lines)
            lines[i], lines[k] = lines[k], lines[i]
        elif op == "insert":
            lines.insert(i, junk)
        elif op == "tab":
            lines.insert(i, "\t" + junk)
        if not lines:
            lines = [""]
    folder = tmp_path_factory.mktemp("fuzz")
    path = folder / "dedicated_log_torch_trace_fuzz.log"
    path.write_text("\n".join(lines), encoding="utf-8", errors="surrogatepass")
    try:
        trace = log_reader.read_trace(path)
    except SourceError:
        return
    for c in trace.compiles:
        json.dumps(c.row())  # what ls prints
        try:
            job = trace_import._job(trace, c, graph="auto", backend=None, accuracy=False, replay=False,
                                    out=folder / "x.tar.zst", cwd=folder)
        except trace_import._Unpackable:
            continue
        json.dumps(job)  # what the child gets
