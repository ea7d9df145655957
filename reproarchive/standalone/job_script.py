"""Exporting a multi-rank job archive: a folder whose ``repro.py`` launches its ranks itself
(``python repro.py``) or runs under ``torchrun --nproc-per-node N repro.py``.

The same rules as the one-process export (``script``): the script needs only PyTorch, never
imports reproarchive or a module the archive names, reads raw bytes by relative path, and
rebuilds each recorded graph node for node, every target written as the qualified name the
allowlist accepted. What a job adds is data: the recorded process-group table (names and
members, as literals), which every rank recreates in recorded order and registers under the
recorded names before running; each rank's graph (identical graphs written once) and its
inputs (identical storages written once, by content). Every rank compiles its graph with the
recorded backend and runs it; the rank that failed in the recording raises its error, and
torchrun reports which rank failed.
"""

from __future__ import annotations

import hashlib
import os
from importlib.resources import files
from pathlib import Path
from typing import Any, Mapping

import torch

from reproarchive.archive.job_archive import JobRepro, load_job
from reproarchive.codec.custom_ops import LiveCustomOp
from reproarchive.codec.rng import random_ops
from reproarchive.codec.tensors import storage_view
from reproarchive.context.environment import plan
from reproarchive.context.failure import PEER_GONE_WORDS
from reproarchive.errors import ExportError
from reproarchive.format.atomic import atomic_dir
from reproarchive.replay.accuracy import DEFAULT_TOLERANCE
from reproarchive.replay.backends import is_custom
from reproarchive.replay.faithfulness import before_replay
from reproarchive.replay.settings import ReplaySettings
from reproarchive.standalone.script import ExportReport, _DataWriter, _Script
from reproarchive.standalone.script_literals import _doc_text, _execution_literal, _shape_literals, admitted_settings
from reproarchive.standalone.shared_blocks import failure_literal, loading_block, state_block


class _ContentDataWriter(_DataWriter):
    """Each distinct storage once, by content: ranks loaded apart hold equal bytes in separate
    storages, and the archive stored them once."""

    def __init__(self, root: Path):
        super().__init__(root)
        self.by_digest: dict[str, tuple[str, int]] = {}

    def storage(self, t: Any) -> tuple[str, int]:
        storage = t.untyped_storage()
        key = storage._cdata
        if key not in self.names:
            data = storage_view(storage.cpu() if storage.device.type != "cpu" else storage)
            digest = hashlib.sha256(data).hexdigest()
            if digest not in self.by_digest:
                name = f"data/storage_{len(self.by_digest)}.bin"
                (self.root / "data").mkdir(exist_ok=True)
                (self.root / name).write_bytes(data)
                self.by_digest[digest] = (name, len(data))
            self.names[key] = self.by_digest[digest]
        return self.names[key]


def export_job(path: str | os.PathLike, out_dir: str | os.PathLike, settings: ReplaySettings) -> ExportReport:
    """Write ``out_dir`` with the job's ``repro.py`` and data (``export`` of a job archive)."""

    job = load_job(path, device="cpu", max_memory=settings.max_memory)
    if job.on_fake_group and len(job.ranks) < job.world_size:  # the others never ran
        raise ExportError(f"{path} records rank {', '.join(str(r.rank) for r in job.ranks)} alone on PyTorch's fake "
                          f"process group: a script for torchrun needs all {job.world_size} ranks' graphs",
                          "replay it with `reproarchive run`, which replays that rank against the fake group")
    return write_job_export(job, out_dir, backend=settings.backend or job.records.backend,
                            archive_name=Path(path).name, brought=(settings.imports, settings.libraries))


def _device_of(index: Any, value: Any) -> str | None:
    storage = getattr(value, "storage", None)
    return index.storages[storage].device if isinstance(storage, int) else None


def write_job_export(job: JobRepro, out_dir: str | os.PathLike, *, backend: str | None,
                     archive_name: str = "", brought: tuple = ((), ())) -> ExportReport:
    """Write ``out_dir`` with ``job``'s script (loaded on the CPU), for ``backend``. Every rank
    keeps its own inputs with their recorded devices, its recorded failure, config, execution
    state and generator states; the process groups are recreated in creation order; the custom
    ops' recorded calls (every rank's) give the stand-ins the script registers where an op is
    missing, as the single-graph script does; ``brought``: the user's (``--import`` modules,
    ``--load-library`` paths) the script brings first, as ``export`` did."""
    state = {r.rank: (r.records.execution, r.rng_states if r.records.rng is not None else {}) for r in job.ranks}
    ordered = sorted(job.groups, key=lambda g: g.index if g.index is not None else 0)  # as created
    groups = [(g.name, tuple(g.ranks)) for g in ordered]
    custom_ops = [op for op in job.ranks[0].custom_ops if isinstance(op, LiveCustomOp)] if job.ranks else []
    config = {r.rank: r.records.config for r in job.ranks}
    world_size, source_kind, digest = job.world_size, job.records.graph_kind, job.digest
    out = Path(out_dir)
    with atomic_dir(out) as tmp:
        script = _Script(_ContentDataWriter(tmp))
        graph_of, input_blocks, failures = _rank_parts(script, job)
        recorded = backend or "inductor"
        custom = is_custom(recorded)
        env_to_set, _ = plan(job.records.environment, config_applied=False)
        per_rank = {rank: admitted_settings(c) for rank, c in config.items()}
        script.imports.update(module for settings in per_rank.values() for module, _, _ in settings)
        text = _job_template().format(
            header=_header(world_size, archive_name, digest, recorded, source_kind, failures),
            env="".join(f"os.environ[{k!r}] = {v!r}\n" for k, v in env_to_set.items())
            or "# (no recorded environment variables to set)\n",
            imports="\n".join(f"import {m}" for m in sorted(script.imports - {"torch", "torch.distributed"})),
            backend=repr(None if custom else recorded), custom=repr(recorded if custom else None),
            source_kind=repr(source_kind), world_size=int(world_size),
            groups="\n".join(f"    ({name!r}, {tuple(int(r) for r in members)!r})," for name, members in groups),
            config=_config_block(per_rank),
            graphs="\n\n\n".join(script.graph_defs),
            inputs="\n".join(input_blocks),
            rank_graphs=", ".join(f"{rank}: {fn}" for rank, fn in sorted(graph_of.items())),
            custom_ops=script.custom_ops_block(list(custom_ops), imports=brought[0], libraries=brought[1]),
            rank_execution=repr({rank: _execution_literal(e) for rank, (e, _) in sorted(state.items())}),
            rank_rng_states=repr({rank: {name: script.writer.storage(t)[0] for name, t in rng.items()}
                                  for rank, (_, rng) in sorted(state.items())}),
            rank_shapes=_rank_shapes(job),
            peer_gone=repr(PEER_GONE_WORDS),
            **_rank_judging(job),
            state_block=state_block(),
            loading_block=loading_block(),
        ).lstrip()
        (tmp / "repro.py").write_text(text, encoding="utf-8")
        files = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
        size = sum((tmp / f).stat().st_size for f in files)
    return ExportReport(folder=str(out), script=str(out / "repro.py"), files=tuple(files), bytes=size)


def _rank_judging(job: JobRepro) -> dict[str, str]:
    """Each rank's facts its script judges a replay by, as ``run`` judges the rank's: its recorded
    failure (stage, exception type, signature), what its replay cannot honour
    (``faithfulness.before_replay``, on the rank's own records and inputs), whether it
    compares with eager (its recorded accuracy mode) and the random ops that comparison must be
    fair to."""
    failures = {r.rank: failure_literal(r.outcome.failure) for r in job.ranks
                if r.outcome is not None and r.outcome.failure}
    unsure = {}
    for r in job.ranks:
        if said := before_replay(r.gm, list(r.args), list(r.fidelity), r.records, r.rng_states):
            unsure[r.rank] = said
    return dict(rank_failures=repr(failures), rank_not_as_recorded=repr(unsure), recorded_rank=repr(job.failing_rank),
                rank_accuracy=repr({r.rank: bool(r.records.accuracy) for r in job.ranks}),
                rank_random_ops=repr({r.rank: list(ops) for r in job.ranks if (ops := random_ops(r.gm))}),
                tolerance=repr(DEFAULT_TOLERANCE))


def _rank_shapes(job: JobRepro) -> str:
    """``RANK_SHAPES``: each rank's recorded policy as the single-graph script writes its own
    (``_shape_literals``), so every rank compiles on its recorded symbols, or static in a
    ShapeEnv made with its recorded settings."""
    parts = []
    for r in job.ranks:
        lit = _shape_literals(r.records.shapes, r.records.parent is not None)
        if lit["shapes"] != "{}" or lit["shape_settings"] != "{}":
            parts.append(f"{r.rank}: ({lit['shapes']}, {lit['sources']}, {lit['shape_settings']}, {lit['guards']})")
    return "{" + ", ".join(parts) + "}"


def _rank_parts(script: _Script, job: JobRepro) -> tuple[dict[int, str], list[str], list[str]]:
    """(rank -> its graph function, the inputs' ``if rank == R`` blocks, the failures' lines):
    ranks whose graphs have the same code share one function."""
    graph_of: dict[int, str] = {}
    by_code: dict[str, str] = {}
    input_blocks = []
    failures = []
    for r in job.ranks:
        rank, gm, args = r.rank, r.gm, list(r.args)
        devices = [_device_of(job.index, v) for v in r.record.inputs or job.index.inputs]
        failure = r.outcome.failure if r.outcome is not None else None
        if dict(gm.named_parameters()) or dict(gm.named_buffers()):
            raise ExportError(f"rank {rank}'s graph holds module state, which a job script does not write",
                              "replay the job with `reproarchive run` instead")
        code = "\n".join(f"{name}:\n{m.code}" for name, m in gm.named_modules() if isinstance(m, torch.fx.GraphModule))
        if code not in by_code:
            by_code[code] = _module_function(script, gm, rank)
        graph_of[rank] = by_code[code]
        values = [f"            {script.value_literal(v, devices[i] if i < len(devices) else None)},"
                  for i, v in enumerate(args)]
        input_blocks.append(f"    if rank == {rank}:\n        return [\n" + "\n".join(values) + "\n        ]")
        if failure is not None:
            first = (failure.message.strip().splitlines() or [""])[0][:200]
            failures.append(f"  rank {rank}: {_doc_text(failure.stage)}: {_doc_text(failure.exception_type)}"
                            + (f": {_doc_text(first)}" if first else ""))
    return graph_of, input_blocks, failures


def _module_function(script: _Script, gm: Any, rank: int) -> str:
    """``def _module_N()``, rank ``rank``'s module: its subgraphs (a ``cond``'s branches, a
    ``while_loop``'s body ...) installed innermost first, as the single-graph script's ``build``
    installs them, then its graph."""
    first = len(script.installs)
    graph = script.graph_function(gm, "", label=f"rank {rank}'s graph")
    name = f"_module_{len(script.graph_defs)}"
    installs = "".join(f"    _install(root, {path!r}, {fn})\n" for path, fn in script.installs[first:])
    script.graph_defs.append(f"def {name}():\n    root = torch.nn.Module()\n{installs}"
                             f"    return torch.fx.GraphModule(root, {graph}(), class_name=\"Repro\")")
    return name


def _header(world_size: int, archive_name: str, digest: str | None, recorded: str, source_kind: str | None,
            failures: list[str]) -> str:
    """The script's docstring: how to start it, and what it should show when it does."""
    return "\n".join([
        f"Standalone reproduction of a {world_size}-rank job, exported by reproarchive from "
        f"{_doc_text(archive_name or 'an archive')} ({_doc_text(digest or 'unknown digest')}).",
        "Needs only PyTorch. Start it with python: it launches the ranks on this machine with torch's",
        "elastic launcher and exits once for the job, as `reproarchive run` does (0 no failure, 1 the",
        "recorded failure, 3 another failure, 125 a rank was not as recorded or the launcher started none):",
        "    python repro.py [--device DEV] [--backend NAME] [--timeout S] [--accuracy/--no-accuracy]",
        "(a rank whose collective failed only because another rank went away exits 75 and is not judged)",
        "or the way the job was started (torchrun's own exit is 1 for any rank's):",
        f"    torchrun --nproc-per-node {world_size} repro.py [--device DEV] [--backend NAME] [--timeout S]",
        "(over several machines: torchrun's --nnodes/--node-rank/--rdzv-endpoint as usual).",
        "Every rank recreates the recorded process groups under their recorded names, compiles its",
        "recorded graph and runs it on its recorded inputs (data/, read relative to this script);",
        "the failing rank raises the recorded error and torchrun names that rank.",
        f"Backend: {_doc_text(recorded)}   graph: {_doc_text(source_kind or 'after_dynamo')}",
        "Recorded failures:", *(failures or ["  none"]),
    ])


def _config_block(per_rank: Mapping[int, list]) -> str:
    """``apply_config``'s body: each rank's settings under ``if rank == R:``."""
    lines = []
    for rank, settings in sorted(per_rank.items()):
        if settings:
            lines.append(f"    if rank == {int(rank)}:\n"
                         + "".join(f"        _set_config({m}, {k!r}, {v!r})\n" for m, k, v in settings))
    return "".join(lines) or "    pass  # (no recorded config setting that differed from the defaults may be applied)\n"


def _job_template() -> str:
    return files("reproarchive.standalone").joinpath("repro_job.py.template").read_text(encoding="utf-8")
