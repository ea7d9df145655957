"""``bisect torch --torch SPEC``: environments built from torch specs with pip, cached and reused.

The good/bad pair is real torch: this machine's torch wheel as pip finds it (``pip download``,
which takes it from the local wheel folder pip is configured with), and a copy of that wheel
whose ``torch/_inductor/compile_fx.py`` carries the planted silu bug, as a patched local build
would. Both environments are made by ``bisect torch`` itself."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from reproarchive.bisect.torch_builds import build_environment, pinned_packages, torch_requirement
from reproarchive.format.reader import ContainerReader
from support.captures import capture_failure
from support.cli import invoke
from support.torch_envs import SILU_BUG, planted_silu

VERSION = torch.__version__.split("+")[0]
COMPILE_FX = "torch/_inductor/compile_fx.py"


def silu_graph(x):
    return torch.nn.functional.silu(x) * 2


def _this_wheel(folder: Path) -> Path:
    """This torch's wheel, where pip finds it (a configured local folder, its cache or the index)."""
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--disable-pip-version-check",
            "-d", str(folder), f"torch=={torch.__version__}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    wheels = sorted(folder.glob("torch-*.whl"))
    if done.returncode != 0 or not wheels:
        pytest.skip(f"pip cannot get this torch's wheel here: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return wheels[0]


def _patched(wheel: Path, out: Path) -> Path:
    """A copy of ``wheel`` whose compile_fx.py plants the silu bug (RECORD updated), rewritten
    in place by ``zip`` (the other members are copied, not recompressed)."""
    if shutil.which("zip") is None:
        pytest.skip("zip is not installed")
    out.mkdir()
    copy = out / wheel.name
    shutil.copyfile(wheel, copy)
    stage = out / "stage"
    with zipfile.ZipFile(wheel) as z:
        record = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        # the same patch as the sitecustomize's, applied to the module it patches, from inside it
        planted = SILU_BUG.replace("import torch._inductor.compile_fx as _compile_fx",
                                   "import sys as _sys\n_compile_fx = _sys.modules[__name__]")
        source = z.read(COMPILE_FX).decode() + "\n\n# planted by the test\n" + planted
        lines = z.read(record).decode().splitlines()
    digest = base64.urlsafe_b64encode(hashlib.sha256(source.encode()).digest()).rstrip(b"=").decode()
    lines = [f"{COMPILE_FX},sha256={digest},{len(source.encode())}" if ln.startswith(COMPILE_FX + ",") else ln
             for ln in lines]
    for name, text in ((COMPILE_FX, source), (record, "\n".join(lines) + "\n")):
        (stage / name).parent.mkdir(parents=True, exist_ok=True)
        (stage / name).write_text(text)
    subprocess.run(["zip", "-q", str(copy), COMPILE_FX, record], cwd=stage, check=True, timeout=300)
    return copy


@pytest.mark.slow
def test_environments_built_from_torch_specs_name_the_patched_torch_and_are_reused(tmp_path, fresh_dynamo):
    with planted_silu():
        archive = capture_failure(tmp_path / "silu.tar.zst", silu_graph, [torch.randn(16)],
                                  "aot_eager_decomp_partition", accuracy=True)
    patched = _patched(_this_wheel(tmp_path / "wheels"), tmp_path / "patched")
    cache = tmp_path / "envs"
    # one replay each: the default would measure the failure's flakiness (test_bisect_repeat.py)
    args = ("bisect", "torch", archive, "--torch", VERSION, "--torch", patched, "--env-cache", cache, "--repeat", "1",
            "--max-time", "900")
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    good, bad = document["verdicts"]
    assert (good["verdict"], bad["verdict"]) == ("good", "bad"), document
    assert good["built_from"] == VERSION and bad["built_from"] == str(patched)
    assert good["torch"] == bad["torch"] == torch.__version__
    # each replayed with its own torch, in a venv under the cache, with a copy of this reproarchive
    for v in (good, bad):
        assert Path(v["python"]).is_relative_to(cache) and v["reader"].startswith("bundled"), v
    assert document["first_bad"] == bad["python"] and document["last_good"] == good["python"]
    assert document["summary"] == (f"the first bad environment is torch {patched} ({bad['python']}) "
                                   f"(the last good one before it: torch {VERSION} ({good['python']}))")
    ready = sorted(cache.glob("*/reproarchive-environment.json"))
    assert len(ready) == 2 and not list(cache.glob(".*building*"))
    # a second bisection builds nothing: the environments are found by what went into them
    with ContainerReader(archive) as reader:
        pins = pinned_packages(dict(reader.index.records.system.packages))
    for spec, verdict in ((VERSION, good), (str(patched), bad)):
        built = build_environment(spec, cache=cache, pins=pins, on_build=lambda *a: pytest.fail(f"rebuilt {a}"))
        assert built.reused and str(built.python) == verdict["python"]
    assert sorted(cache.glob("*/reproarchive-environment.json")) == ready


def test_an_environment_that_cannot_be_built_is_skipped_not_bad(tmp_path):
    """pip refuses the wheel: the environment is skipped with pip's reason, nothing is left in
    the cache, and with no other environment nothing was compared."""
    archive = tmp_path / "a.tar.zst"
    archive.write_bytes(b"not an archive")
    broken = tmp_path / "torch-9.9.9-py3-none-any.whl"
    broken.write_bytes(b"not a zip file")
    cache = tmp_path / "envs"
    result = invoke("bisect", "torch", archive, "--torch", broken, "--env-cache", cache, "--json")
    document = json.loads(result.stdout)
    (verdict,) = document["verdicts"]
    assert verdict["verdict"] == "skipped" and verdict["reason"].startswith("the environment could not be built: "
                                                                            "pip install failed"), verdict
    assert result.exit_code == 3 and document["status"] == "no bad environment" and document["first_bad"] is None
    assert list(cache.iterdir()) == []


def test_a_spec_that_names_no_torch_is_refused_before_anything_is_built(tmp_path):
    archive = tmp_path / "a.tar.zst"
    archive.write_bytes(b"x")
    for spec, words in (("numpy==1.0", "names no torch"), (str(tmp_path / "gone.whl"), "no such wheel file")):
        result = invoke("bisect", "torch", archive, "--torch", spec, "--env-cache", tmp_path / "envs", "--json")
        assert result.exit_code == 2 and words in json.loads(result.stdout)["error"]["message"], result.output
    both = invoke("bisect", "torch", archive, "--torch", "2.13.0", "--env", sys.executable, "--json")
    assert both.exit_code == 2 and "one way" in json.loads(both.stdout)["error"]["message"]
    assert not (tmp_path / "envs").exists()


def test_specs_and_pins():
    assert torch_requirement("2.13.0") == "torch==2.13.0"
    assert torch_requirement("2.13.0+cpu") == "torch==2.13.0+cpu"
    assert torch_requirement("torch>=2.12,<2.13") == "torch>=2.12,<2.13"
    pins = pinned_packages({"numpy": "1.26.4", "sympy": "1.13.1", "transformers": None, "torch": "2.13.0"})
    # the recorded numpy is pinned; sympy is torch's own to choose; the reader's needs at our versions
    assert "numpy==1.26.4" in pins and not any(p.startswith(("sympy", "torch", "transformers")) for p in pins)
    # an archive's recorded text reaches pip only as a plain version number
    hostile = pinned_packages({"numpy": "1.0 ; python_version>'0' --index-url http://x", "accelerate": "0.30.1"})
    assert "accelerate==0.30.1" in hostile and not any(p.startswith("numpy") for p in hostile)
    import zstandard

    assert f"zstandard=={zstandard.__version__}" in pins and any(p.startswith("msgpack==") for p in pins)


# -- nightly date ranges --------------------------------------------------------------------------

@pytest.fixture
def nightly_index(tmp_path):
    """A package index on 127.0.0.1 serving five torch "nightlies" (files pip can list, not
    install) and a release: PEP 503's simple layout, as download.pytorch.org's nightly index."""
    import functools
    import http.server
    import threading

    root = tmp_path / "index"
    (root / "simple" / "torch").mkdir(parents=True)
    names = [f"torch-2.16.0.dev202611{day:02d}-py3-none-any.whl" for day in (1, 2, 3, 5, 9)]
    names.append("torch-2.15.0-py3-none-any.whl")
    for name in names:
        (root / "simple" / "torch" / name).write_bytes(b"not a wheel")
    links = "".join(f'<a href="{n}">{n}</a>\n' for n in names)
    (root / "simple" / "torch" / "index.html").write_text(f"<html><body>{links}</body></html>")
    (root / "simple" / "index.html").write_text('<html><body><a href="torch/">torch</a></body></html>')
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()


def test_a_nightly_range_is_the_nightlies_dated_within_it_oldest_first(tmp_path, nightly_index):
    from reproarchive.bisect.nightlies import nightly_specs

    assert nightly_specs("2026-11-02..2026-11-05", nightly_index) == (
        "torch==2.16.0.dev20261102", "torch==2.16.0.dev20261103", "torch==2.16.0.dev20261105")
    archive = tmp_path / "a.tar.zst"
    archive.write_bytes(b"not an archive")
    cache = tmp_path / "envs"
    result = invoke("bisect", "torch", archive, "--torch-nightly", "2026-11-04..2026-11-09", "--index-url",
                    nightly_index, "--env-cache", cache, "--json")
    document = json.loads(result.stdout)
    # each nightly built with pip from that index (--pre): here pip cannot install the files, so
    # each is skipped with pip's reason, in date order, and nothing was compared
    assert [v["built_from"] for v in document["verdicts"]] == ["torch==2.16.0.dev20261105",
                                                                "torch==2.16.0.dev20261109"]
    assert all(v["verdict"] == "skipped" and "pip install failed" in v["reason"] for v in document["verdicts"])
    assert result.exit_code == 3 and document["first_bad"] is None
    assert list(cache.iterdir()) == []


def test_a_nightly_range_that_is_wrong_or_empty_is_one_line(tmp_path, nightly_index):
    archive = tmp_path / "a.tar.zst"
    archive.write_bytes(b"x")
    for text, words in (("2026-11-09..2026-11-01", "ends before it starts"), ("last week", "not a date range"),
                        ("2026-10-01..2026-10-31", "no torch nightly dated 2026-10-01..2026-10-31")):
        result = invoke("bisect", "torch", archive, "--torch-nightly", text, "--index-url", nightly_index,
                        "--env-cache", tmp_path / "envs", "--json")
        assert result.exit_code == 2 and words in json.loads(result.stdout)["error"]["message"], result.output
    alone = invoke("bisect", "torch", archive, "--torch", "2.13.0", "--index-url", nightly_index, "--json")
    assert alone.exit_code == 2 and "--index-url only applies" in json.loads(alone.stdout)["error"]["message"]
    assert not (tmp_path / "envs").exists()
