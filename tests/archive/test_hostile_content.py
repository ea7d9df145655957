"""Hostile content: archives that pass every byte-level check, written with
reproarchive's own writer or by editing a valid index, still cannot write, read or run anything.

Every attack goes through the commands that read an archive. For each: nothing outside the
target changed (a victim tree and the working folder are hashed before and after), no marker
from a payload appeared, a refusal is one line with exit 2, and there is no traceback and no
exit 70.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reproarchive.child import ForkServer
from reproarchive.format.schema import FORMAT_VERSION
from support import content_attacks as ca
from support import hostile_corpus as hc
from support.cli import invoke
from support.shared_fixture import built_once


def _tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` with its digest (what an attack could have changed)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() or p.is_symlink()}


def _cli(args: list[str], cwd: Path, timeout: int = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    entry = "from reproarchive.cli import main; main()"
    full_env = dict(os.environ, PYTHONPATH=str(hc.ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", entry, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def _in_process(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """The same command in this process (no torch import per call), in ``cwd``."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        result = invoke(*args)
    finally:
        os.chdir(old)
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def _one_line_refusal(proc: subprocess.CompletedProcess, what: str) -> None:
    assert proc.returncode == 2, (what, proc.returncode, proc.stderr[-800:])
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, (what, proc.stderr[-800:])
    assert "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    """A working folder, a victim tree next to it, and the archives of every target attack."""
    root = tmp_path_factory.mktemp("content")
    victim = root / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("user data\n")
    work = root / "work"
    work.mkdir()
    return {"root": root, "victim": victim, "work": work,
            "targets": ca.target_archives(root, victim / "precious.txt")}


@pytest.mark.parametrize("label", [a[0] for a in ca.TARGET_ATTACKS])
def test_target_attacks_are_refused_by_every_reader(scene, label):
    """Targets by effect, not name: every attack archive is refused by verify, inspect, load
    (library) and by the CLI's verify, inspect, run and export, and touches nothing."""
    path = scene["targets"][label]
    before = _tree(scene["victim"]), _tree(scene["work"])
    for op in ("verify", "inspect", "load"):
        res = hc.run_library_op(op, path, scene["work"])
        assert res["outcome"] == "archive_error" and res["type"] == "UnsafeArchiveError", (label, op, res)
    for argv in (["verify", "-q", str(path)], ["inspect", str(path)], ["unpack", "-q", str(path), "-C", "out"],
                 ["run", "--no-isolate", str(path)], ["run", "--minify", str(path), "-o", "min.tar.zst"],
                 ["run", "--compile-only", str(path)],
                 ["run", "--minify", "--compile-only", str(path), "-o", "m.tar.zst"],
                 ["export", str(path), "-o", "out"]):
        _one_line_refusal(_in_process(argv, scene["work"]), f"{label} {argv[0]}")
    assert (_tree(scene["victim"]), _tree(scene["work"])) == before, label


#: (format 1.7) stack frames that would be code where FX pastes them as a comment, or drive a terminal
_STACK_ATTACKS = {"code_line_break": ("code", "x\rimport os; os.remove({victim!r})"),
                  "file_newline": ("file", "m.py\nimport os"),
                  "name_escape": ("name", "forward\x1b]0;owned\x07")}


@pytest.mark.parametrize("label", _STACK_ATTACKS)
def test_a_hostile_stack_frame_is_refused_by_every_reader(scene, label):
    """A node's stack frame is pasted by FX into the code it generates, shown by inspect and
    view and written into export's script: one with a line break or an escape is refused by
    the library's readers and by every command, in one line, touching nothing."""
    key, text = _STACK_ATTACKS[label]
    frame = {"file": "./m.py", "line": 3, "name": "forward", "code": "y = x.relu()",
             key: text.format(victim=str(scene["victim"] / "precious.txt"))}

    def plant(index: dict) -> None:
        index["graph"]["stacks"] = [[frame]]
        next(n for n in index["graph"]["nodes"] if n["op"] == "call_function")["stack"] = 0

    path = scene["root"] / f"stack_{label}.tar.zst"
    path.write_bytes(hc.rebuild(ca.valid_parsed(scene["root"] / f"stack_{label}"), plant))
    before = _tree(scene["victim"]), _tree(scene["work"])
    for op in ("verify", "inspect", "load"):
        res = hc.run_library_op(op, path, scene["work"])
        assert res["outcome"] == "archive_error" and res["type"] == "UnsafeArchiveError", (label, op, res)
    for argv in (["verify", "-q", str(path)], ["inspect", str(path)], ["inspect", "--graph", str(path)],
                 ["unpack", "-q", str(path), "-C", "out"], ["run", "--no-isolate", str(path)],
                 ["run", "--minify", str(path), "-o", "min.tar.zst"], ["export", str(path), "-o", "out"],
                 ["run", "--compile-only", str(path)], ["view", str(path), "-o", "page.html"]):
        _one_line_refusal(_in_process(argv, scene["work"]), f"{label} {argv[0]}")
    assert (_tree(scene["victim"]), _tree(scene["work"])) == before, label


@pytest.fixture(scope="module")
def context_scene(tmp_path_factory):
    """An archive whose recorded config and environment would run a program, import a module it
    names and write logs and traces; a module of that name waits in the working folder."""
    root = tmp_path_factory.mktemp("context")
    work = root / "work"
    work.mkdir()
    marker = root / "MARKER"
    module = "reproarchive_evil_config_module"
    (work / f"{module}.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('imported')\n")
    archive = ca.context_archive(root / "context.tar.zst", marker, module)
    return {"root": root, "work": work, "marker": marker, "archive": archive, "module": module}


@pytest.mark.parametrize("argv", [["run", "--no-isolate", "--json"], ["run", "--isolate", "--json"]],
                         ids=["run", "run-isolate"])
def test_recorded_config_and_environment_cannot_run_import_or_write(context_scene, argv):
    """A real inductor compile with the recorded context applied through the one filter: the
    compiler setting, the module section, and every log/trace/debug writer are refused and
    named; nothing appears in the working folder and the payload never runs."""
    work = context_scene["work"]
    before = _tree(work)
    proc = _cli([*argv, str(context_scene["archive"])], work, timeout=420)
    assert proc.returncode in (0, 1, 3), proc.stderr[-1500:]
    assert "Traceback" not in proc.stderr
    outcome = json.loads(proc.stdout)
    assert not context_scene["marker"].exists(), "the recorded config ran a program or imported a module"
    assert _tree(work) == before, sorted(set(_tree(work)) - set(before))
    refused = " ".join(outcome["warnings"])
    for name in ("cpp.cxx", "trace.enabled", "debug_dir_root", "TORCH_LOGS_OUT", "TORCH_COMPILE_DEBUG", "LD_PRELOAD",
                 context_scene["module"]):
        assert name in refused, (name, outcome["warnings"])
    # TORCH_TRACE and TORCHINDUCTOR_CACHE_DIR name places on the recording machine: never copied


def test_exported_script_embeds_only_filtered_context(context_scene, tmp_path):
    """export's repro.py applies no refused setting, imports no module the archive names, and
    running it in a scratch folder writes nothing there but what it is for."""
    out = tmp_path / "exported"
    proc = _cli(["export", str(context_scene["archive"]), "-o", str(out)], context_scene["work"])
    assert proc.returncode == 0, proc.stderr[-800:]
    script = (out / "repro.py").read_text()
    ast.parse(script)
    for needle in ("cpp.cxx", "sh -c", "trace.enabled", "TORCH_LOGS_OUT", "LD_PRELOAD", context_scene["module"]):
        assert f"{needle!r}" not in script and f'"{needle}"' not in script, needle
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    module_file = f"{context_scene['module']}.py"
    (scratch / module_file).write_text((context_scene["work"] / module_file).read_text())
    before = _tree(scratch)
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPROARCHIVE")}
    env["PYTHONPATH"] = str(scratch)  # the archive's module is importable, to prove it is not imported
    ran = subprocess.run([sys.executable, str(out / "repro.py"), "--backend", "eager"], cwd=scratch,
                         capture_output=True, text=True, timeout=300, env=env)
    assert "Traceback" not in ran.stderr or "RuntimeError" in ran.stderr, ran.stderr[-1500:]
    assert not context_scene["marker"].exists()
    assert _tree(scratch) == before


@pytest.fixture
def importable(tmp_path, monkeypatch):
    """A working folder on ``sys.path`` holding ``ca.EVIL_MODULE``, whose import writes a marker:
    an archive naming it would import it if a replay imported a name the archive gives."""
    work = tmp_path / "work"
    work.mkdir()
    marker = tmp_path / "MARKER"
    ca.evil_module(work, marker)
    monkeypatch.syspath_prepend(str(work))
    assert importlib.util.find_spec(ca.EVIL_MODULE) is not None  # importable (finding it runs nothing)
    assert ca.EVIL_MODULE not in sys.modules and not marker.exists()
    yield work, marker
    sys.modules.pop(ca.EVIL_MODULE, None)


def _refused_by_every_replay(archive: Path, work: Path, marker: Path, code: int, says: str, *,
                             export: tuple[int, str] | None = None) -> None:
    """run (text and --json), export, minify and run --minify, the commands that rebuild an
    archive's graph and inputs, each refuse ``archive`` in one line naming ``says`` with exit
    ``code``, import nothing the archive names and write nothing in ``work``."""
    before = _tree(work)
    for argv in (["run", "--no-isolate", str(archive)], ["export", str(archive), "-o", "out"],
                 ["minify", str(archive), "-o", "min.tar.zst"], ["run", "--minify", str(archive), "-o", "min.tar.zst"]):
        proc = _in_process(argv, work)
        want, what = export if export is not None and argv[0] == "export" else (code, says)
        assert proc.returncode == want, (argv, proc.returncode, proc.stderr[-500:])
        assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, (argv, proc.stderr)
        assert what in proc.stderr and "Traceback" not in proc.stderr, (argv, proc.stderr)
    proc = _in_process(["run", "--json", "--no-isolate", str(archive)], work)
    assert proc.returncode == code and json.loads(proc.stdout)["exit_code"] == code, proc.stdout[-500:]
    assert not marker.exists() and ca.EVIL_MODULE not in sys.modules
    assert _tree(work) == before


@pytest.mark.parametrize("cls", [f"{ca.EVIL_MODULE}.Evil", "os.system"])
def test_a_subclass_torch_does_not_define_is_never_imported(importable, cls, tmp_path):
    """(1.3) A tensor subclass is rebuilt from a fixed table of torch's own classes: a class the
    archive names elsewhere is neither imported by run, by export (whose script would need it)
    nor by minify; each says so in one line and exits 125 (E_NOT_REPLAYABLE), writing nothing."""
    work, marker = importable
    archive = ca.subclass_archive(tmp_path / "subclass.tar.zst", cls)
    _refused_by_every_replay(archive, work, marker, 125, f"tensor subclass {cls}")


@pytest.mark.parametrize("hop,operator", [("with_effects", f"{ca.EVIL_MODULE}.op"),
                                          ("auto_functionalized_v2", "os.system"),
                                          ("with_effects", "torch.ops.aten._print.default")],
                         ids=["module-in-cwd", "os-system", "effectful-print"])
def test_an_operator_argument_outside_torch_is_refused_by_every_replay(importable, hop, operator, tmp_path):
    """(1.3) The operator an ``operator`` argument names is judged as a call target before
    anything runs: one outside torch, or one whose effect is refused, is refused by run, export
    and minify (not only by load) in one line with exit 2 (E_UNSAFE), importing and writing nothing."""
    work, marker = importable
    archive = ca.operator_archive(tmp_path / "operator.tar.zst", hop, operator)
    _refused_by_every_replay(archive, work, marker, 2, operator)


def _neutralised_cases(folder: Path) -> list[dict]:
    """For each of ``ca.HOSTILE_TEXT``: its archive in a folder of its own, ``inspect`` and
    ``export`` of it (in process), and the exported repro.py run."""
    cases = []
    for i, text in enumerate(ca.HOSTILE_TEXT):
        case = folder / f"text{i}"
        case.mkdir()
        archive = ca.text_archive(case / "t.tar.zst", case / "MARKER", text)
        shown = _in_process(["inspect", str(archive)], case)
        out = case / "exported"
        exported = _in_process(["export", str(archive), "-o", str(out)], case)
        # a bug report carries the record's strings too (its failure line, the verdict as printed)
        reported = _in_process(["run", "--no-isolate", "--summary", "bug.md", str(archive)], case)
        cases.append({"folder": str(case), "ran": None, "shown": [shown.returncode, shown.stdout, shown.stderr],
                      "exported": [exported.returncode, exported.stdout, exported.stderr],
                      "reported": [reported.returncode, reported.stderr]})
    # each exported repro.py as ``python repro.py --backend eager`` in the case's folder, in a
    # process of its own forked from one that imported torch (``support.script_child``)
    with ForkServer("support.script_child", env=dict(os.environ)) as server:
        for c in cases:
            script = Path(c["folder"]) / "exported" / "repro.py"
            if c["exported"][0] != 0 or not script.exists():
                continue
            ran, died = server.run({"script": str(script), "cwd": c["folder"], "args": ["--backend", "eager"]},
                                   keep_log=Path(c["folder"]) / "ran.log", timeout=300)
            c["ran"] = ran["code"] if died is None else (died.returncode if died.started else None)  # None: never ran
    return cases


@pytest.fixture(scope="module")
def neutralised(tmp_path_factory):
    return built_once(tmp_path_factory, "hostile-text", _neutralised_cases)


@pytest.mark.parametrize("i", range(len(ca.HOSTILE_TEXT)), ids=[f"text{i}" for i in range(len(ca.HOSTILE_TEXT))])
def test_record_strings_are_neutralised_for_terminals_and_code(neutralised, i):
    case = neutralised[i]
    folder = Path(case["folder"])
    marker = folder / "MARKER"
    code, stdout, stderr = case["shown"]
    assert code == 0, stderr
    def raw_controls(text):
        return [hex(ord(c)) for c in text if (ord(c) < 32 and c != "\n") or 0x7f <= ord(c) < 0xa0
                or c in "\u202e\u202c\u2028"]

    assert not raw_controls(stdout)
    code, stderr = case["reported"]
    assert code in (0, 1, 3) and "Traceback" not in stderr, stderr[-800:]
    assert not raw_controls((folder / "bug.md").read_text())
    code, _, stderr = case["exported"]
    assert code == 0, stderr[-800:]
    ast.parse((folder / "exported" / "repro.py").read_text())  # the strings are data in the script, never code
    assert case["ran"] is not None  # the script ran, in a process of its own
    assert not marker.exists(), (folder / "ran.log").read_text()[-500:]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(min_size=1, max_size=200))
def test_fuzzed_record_strings_never_reach_terminal_or_code(text, tmp_path_factory):
    """Any string in the failure and source records: inspect prints no raw control character,
    and export's repro.py still parses (the string is data there)."""
    work = tmp_path_factory.mktemp("fuzz")
    archive = ca.text_archive(work / "t.tar.zst", work / "MARKER", text)
    shown = _in_process(["inspect", str(archive)], work)
    assert shown.returncode == 0, shown.stderr
    assert not [c for c in shown.stdout if (ord(c) < 32 and c != "\n") or 0x7f <= ord(c) < 0xa0]
    exported = _in_process(["export", str(archive), "-o", str(work / "out")], work)
    assert exported.returncode == 0, exported.stderr[-500:]
    ast.parse((work / "out" / "repro.py").read_text())


def test_offset_past_int64_is_one_line_not_exit_70(tmp_path):
    parsed = ca.valid_parsed(tmp_path)

    def edit(index):
        next(v for v in index["inputs"] if isinstance(v, dict) and "storage" in v)["offset"] = (1 << 64) - 1

    path = ca.edited(tmp_path / "offset.tar.zst", parsed, edit)
    for argv in (["verify", "-q", str(path)], ["inspect", str(path)], ["run", "--no-isolate", str(path)]):
        _one_line_refusal(_in_process(argv, tmp_path), argv[0])


def test_declared_memory_is_checked_before_allocating(tmp_path):
    """A small archive declaring more memory than allowed is refused with one line (exit 2)."""
    import torch
    import torch.fx as fx

    import reproarchive
    from reproarchive.codec.tensors import AbsentTensor

    g = fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    g.output((g.call_function(torch.add, (x, 1)), y))
    gm = fx.GraphModule(torch.nn.Module(), g)
    # 4 MiB of zeros (stored as no blob at all: the file stays small, the load does not)
    zeros = reproarchive.pack(gm, [torch.zeros(1024, 1024), 1], tmp_path / "zeros.tar.zst", backend="eager",
                              snapshot=False)
    assert zeros.stat().st_size < 4096
    for argv in (["run", "--no-isolate", "--max-memory", "1M", str(zeros)],
                 ["export", "--max-memory", "1M", str(zeros), "-o", str(tmp_path / "out")]):
        proc = _in_process(argv, tmp_path)
        _one_line_refusal(proc, argv[0])
        assert "--max-memory" in proc.stderr or "memory" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()
    # a terabyte of absent data declared in a small archive, against the machine's own memory
    huge = reproarchive.pack(gm, [AbsentTensor((1 << 38,), torch.float32), 1], tmp_path / "huge.tar.zst",
                             backend="eager", snapshot=False)
    assert huge.stat().st_size < 4096
    _one_line_refusal(_in_process(["run", "--no-isolate", str(huge)], tmp_path), "absent terabyte")


def test_unpack_keeps_few_files_open(tmp_path):
    """1,100 storages unpack under a 256 open-file limit (unpack keeps a constant number open)."""
    import torch
    import torch.fx as fx

    import reproarchive

    g = fx.Graph()
    xs = [g.placeholder(f"x{i}") for i in range(1100)]
    g.output(tuple(xs[:1]))
    path = reproarchive.pack(fx.GraphModule(torch.nn.Module(), g),
                             [torch.full((4,), float(i + 1)) for i in range(1100)],
                             tmp_path / "many.tar.zst")
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256)); "
            "from reproarchive.cli import main; sys.argv[0] = 'reproarchive'; main()")
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft >= 256
    proc = subprocess.run([sys.executable, "-c", code, "unpack", "-q", str(path), "-C", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(hc.ROOT)))
    assert proc.returncode == 0, proc.stderr[-800:]
    assert len(list((tmp_path / "out" / "blobs").rglob("*"))) >= 1100


def test_graph_node_cap_is_one_line_before_decoding(tmp_path):
    """More graph nodes than the reader's cap: one line, exit 2, for every reader."""
    from reproarchive.format.layout import Limits

    parsed = ca.valid_parsed(tmp_path)

    def edit(index):
        nodes = index["graph"]["nodes"]
        body = [{"op": "call_function", "name": f"n{i}", "target": "torch.ops.aten.relu.default",
                 "args": [{"k": "node", "v": "x" if i == 0 else f"n{i - 1}"}], "kwargs": {}} for i in range(400)]
        index["graph"]["nodes"] = nodes[:-1] + body + nodes[-1:]

    path = ca.edited(tmp_path / "many.tar.zst", parsed, edit)
    import reproarchive

    assert reproarchive.inspect(path, limits=Limits(max_nodes=100_000)).graph.nodes > 400  # under the cap
    res = hc.run_library_op("inspect", path, tmp_path, limits={"max_nodes": 300})
    assert res["outcome"] == "archive_error" and res["type"] == "LimitExceededError", res
    assert "nodes, more than the limit 300" in res["message"]



# the current version's: the cases below re-assemble it, and the assembler writes this version
_TRITON_VECTOR = Path(__file__).resolve().parents[2] / "spec" / "vectors" / f"triton-{FORMAT_VERSION}.tar.zst"


def _triton_variant(path: Path, edit) -> Path:
    from support.hostile_corpus import parse, rebuild

    path.write_bytes(rebuild(parse(_TRITON_VECTOR.read_bytes()), edit))
    return path


def _launches(index):
    return [n for n in index["graph"]["nodes"] if "triton_kernel_wrapper" in n["target"]]


@pytest.mark.parametrize("attack,code,says", [
    ("source", 2, "sha256 of the kernel's source"),            # claims a digest its source does not have
    ("index", 2, "does not record"),                           # a launch reaching this process's side table
    ("functional", 125, "functional form"),                    # no stand-in: only the kernel itself could run it
], ids=["forged-source", "unrecorded-index", "functional-launch"])
def test_a_triton_launch_the_archive_cannot_vouch_for_is_refused_by_every_replay(importable, attack, code, says,
                                                                                 tmp_path):
    """(1.4) A launch runs the user's kernel (matched by the digest R8-7 recomputes) or a table of
    recorded tensors, never anything else: each of these is refused by run, export and minify in
    one line, importing and writing nothing."""
    work, marker = importable

    def edit(index):
        kernel = index["triton_kernels"][0]
        if attack == "source":
            kernel["source"] = kernel["source"].replace("* s", f"* s  # {ca.EVIL_MODULE}")
        for node in _launches(index):
            if attack == "index":
                node["kwargs"]["kernel_idx"] = kernel["index"] + 1
            if attack == "functional":
                node["target"] = "torch.ops.higher_order.triton_kernel_wrapper_functional"
    archive = _triton_variant(tmp_path / f"{attack}.tar.zst", edit)
    # export refuses any archive of launches before building anything (exit 2, E_EXPORT) once it reads
    refusal = (2, "launches user Triton kernels") if attack == "functional" else None
    _refused_by_every_replay(archive, work, marker, code, says, export=refusal)


def test_a_triton_kernel_naming_a_module_never_imports_it(importable, tmp_path):
    """(1.4) A kernel record's ``module`` is informative: run replays on the stand-in, export
    refuses in one line, minify works on the stand-in (the vector's recorded failure does not
    reproduce: exit 3); none imports the module it names."""
    work, marker = importable

    def edit(index):
        index["triton_kernels"][0]["module"] = ca.EVIL_MODULE
    archive = _triton_variant(tmp_path / "module.tar.zst", edit)
    before = _tree(work)
    ran = _in_process(["run", "--no-isolate", "--json", str(archive)], work)
    assert json.loads(ran.stdout)["stand_ins"] == ["triton:scale_kernel"], ran.stdout[-500:]
    _one_line_refusal(_in_process(["export", str(archive), "-o", "out"], work), "export")
    minified = _in_process(["run", "--minify", str(archive), "-o", str(tmp_path / "min.tar.zst")], work)
    assert minified.returncode in (0, 3) and "Traceback" not in minified.stderr, minified.stderr[-500:]
    _in_process(["doctor", str(archive)], work)
    assert not marker.exists() and ca.EVIL_MODULE not in sys.modules
    assert _tree(work) == before


def test_triage_shows_hostile_record_strings_neutralised(tmp_path):
    """A fleet of archives whose failure records carry every hostile text: ``triage``'s table
    (signatures, merged signatures, culprits) holds no raw control character, and its page
    carries them as inert data."""
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    for i, text in enumerate(ca.HOSTILE_TEXT):
        ca.text_archive(fleet / f"t{i}.tar.zst", tmp_path / "MARKER", text)
    shown = _in_process(["triage", str(fleet), "--group-only", "--html", str(tmp_path / "page.html")], tmp_path)
    assert shown.returncode == 0, shown.stderr[-800:]
    assert not [hex(ord(c)) for c in shown.stdout if (ord(c) < 32 and c != "\n") or 0x7f <= ord(c) < 0xa0
                or c in "\u202e\u202c\u2028"]
    page = (tmp_path / "page.html").read_text()
    assert "<script" in page and page.count("</script>") == page.count("<script")
    assert not (tmp_path / "MARKER").exists()
