"""One rank of a replayed job: the program torch.distributed's launcher starts on every rank.

``python -m reproarchive.replay.rank_worker FOLDER`` (the launcher sets ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE`` and the rendezvous variables) joins the job with the backend for
its device (gloo on the CPU, NCCL on CUDA) and the recorded job's collective timeout, recreates
every recorded process group under its recorded name (``ranks.recreate_groups``), loads its own
rank's graph and real inputs, and judges its replay with the one judge every replay uses
(``runner.replayed``, ``run``'s own). FOLDER holds the parent's request and receives, per rank r:

* ``started-r.json``: the pid and what is about to run, before anything can crash or hang;
* ``rank-r.json``: the rank's Outcome and its collective schedule;
* ``rank-r.log``: everything the rank printed (faulthandler's report of a crash included).

How a rank ends is the recorded job's rule, not ours: a rank whose replay failed exits non-zero
at once, as the original process did, and the launcher stops the others (a peer blocked in a
collective with it would otherwise wait for the whole timeout); a rank that passed waits, on the
rendezvous store (never a collective, which could pair with a peer's pending one), until every
rank is done or the timeout ends, so that a peer stuck in a collective it skipped sees a live
partner time out, as in the recorded job, and not a closed connection.
"""

from __future__ import annotations

import dataclasses
import datetime
import faulthandler
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from reproarchive.codec.device_runtime import devices_of
from reproarchive.codec.devices import DevicePlan
from reproarchive.compat.distributed import default_store
from reproarchive.replay import ranks as _ranks
from reproarchive.replay.launch import STARTUP_ALLOWANCE_S
from reproarchive.replay.outcome import unless_faithful
from reproarchive.replay.prepared import prepared
from reproarchive.replay.runner import replayed
from reproarchive.replay.settings import ReplaySettings

#: How a rank whose replay observed a failure exits (after writing its outcome).
EXIT_FAILED = 3


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, path)


def redirect_output(folder: Path, rank: int) -> None:
    """Send this rank's stdout and stderr (faulthandler's crash report too) to ``rank-r.log``."""

    log = open(folder / f"rank-{rank}.log", "ab", buffering=0)  # noqa: SIM115 - lives as long as the process
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    faulthandler.enable(file=sys.stderr, all_threads=True)


def join(args: list, groups: list[_ranks.GroupSpec], *, timeout_s: float, rank: int, world_size: int,
         fake: bool = False) -> dict[str, Any]:
    """Join the launched job (or, ``fake``, a fake process group of ``world_size`` as ``rank``)
    on the device ``args`` live on, and recreate the recorded groups (name -> this rank's group)."""

    device_type = next(iter(sorted({d.type for d in devices_of(args)} - {"cpu"})), "cpu")
    if device_type != "cpu":
        torch.get_device_module(device_type).set_device(next(d for d in devices_of(args) if d.type == device_type))
    if fake:
        _ranks.init_fake(rank, world_size)
    else:
        _ranks.init_launched(device_type, timeout_s)
    return _ranks.recreate_groups(groups, timeout_s=timeout_s)


def loaded(path: str, settings: ReplaySettings, rank: int, *, plan: DevicePlan | None = None) -> tuple[Any, Any]:
    """This rank of the job at ``path`` prepared and loaded as ``run`` prepares and loads one
    graph (``replay.prepared``, under the rank's own records, the user's ``--import`` and
    ``--load-library`` brought here): the ``Prepared`` and the rank's ``RankRepro``.
    ``plan``: a compile-only replay's (an absent device's storages on ``meta``)."""
    ready = prepared(path, settings, rank=rank, plan=plan)
    return ready, ready.load()


def serve(ready: Any, repro: Any, folder: Path, *, timeout_s: float, world_size: int, fake: bool = False,
          fake_when_recorded: bool = False) -> int:
    """Replay ``repro`` (this rank's ``RankRepro``, on its devices) as its rank of the launched
    job, judged by ``run``'s own judgement (``runner.replayed``); returns the exit status.
    ``fake``: this process is the only one, against PyTorch's fake process group (``run
    --rank``); ``fake_when_recorded``: and so was the recording's (its collectives' values were
    the fake group's too)."""
    rank, groups = repro.rank, _ranks.group_specs(ready.index.job)
    made = join(repro.args, groups, timeout_s=timeout_s, rank=rank, world_size=world_size, fake=fake)
    if repro.dtensors:
        repro = dataclasses.replace(repro, args=_ranks.as_dtensors(
            list(repro.args), repro.dtensors, ready.index.job.meshes, groups, made))
    schedule = [dataclasses.asdict(c) for c in _ranks.schedule_of(repro.gm)]
    write_json(folder / f"started-{rank}.json", {"pid": os.getpid(), "schedule": schedule,
                                                 "backend": ready.settings.backend})
    outcome = replayed(ready, repro, report_differences=rank == 0)
    if fake and schedule and not fake_when_recorded:
        outcome = _alone(outcome, rank)
    write_json(folder / f"rank-{rank}.json", {"outcome": outcome.to_dict(), "schedule": schedule})
    if outcome.observed is not None:
        return EXIT_FAILED
    if not fake:
        _wait_for_peers(rank, world_size, timeout_s)
    return 0


def _alone(outcome: Any, rank: int) -> Any:
    """The outcome of a rank that ran alone against the fake process group: its collectives gave
    made-up values, so a pass where the recording failed after compiling (forward, backward,
    accuracy, a crash) is no evidence (inconclusive); a compile reads no collective's value,
    so a pass of a recorded compile failure stays a pass."""

    recorded = outcome.recorded
    if recorded is None or recorded.stage == "compile":
        return outcome
    return unless_faithful(outcome, [*outcome.unfaithful, f"rank {rank} ran alone against a fake process group: "
                                     "its collectives returned made-up values, not the job's"])


def record_collectives(rank_repro: Any, groups: list[_ranks.GroupSpec], folder: Path, *, timeout_s: float,
                       rank: int, world_size: int, fake: bool = False) -> int:
    """Run this rank's graph eagerly with real collectives (``fake``: the fake process group's,
    as a recording made on it had) and keep what each collective gave this rank
    (``values-r.pt``, tensors only): the per-rank values a minified job's graphs read in place of
    their collectives."""

    join(rank_repro.args, groups, timeout_s=timeout_s, rank=rank, world_size=world_size, fake=fake)
    write_json(folder / f"started-{rank}.json", {"pid": os.getpid(), "schedule": []})
    values: dict[str, Any] = {}
    collective = {n.name for n in rank_repro.gm.graph.nodes if _ranks.is_collective(n)}

    class _Recorder(fx.Interpreter):
        def run_node(self, n):
            result = super().run_node(n)
            if n.name in collective and isinstance(result, torch.Tensor):
                values[n.name] = result.detach().cpu().clone()
            return result

    try:
        with torch.no_grad():
            _Recorder(rank_repro.gm).run(*rank_repro.args)
    except Exception as exc:  # noqa: BLE001 - reported to the parent as data
        write_json(folder / f"rank-{rank}.json", {"error": f"{type(exc).__name__}: {exc}"[:500]})
        return EXIT_FAILED
    torch.save(values, folder / f"values-{rank}.pt")
    write_json(folder / f"rank-{rank}.json", {"recorded": sorted(values)})
    if not fake:
        _wait_for_peers(rank, world_size, timeout_s)
    return 0


def serve_candidates(first: Any, groups: list[_ranks.GroupSpec], folder: Path, *, timeout_s: float,
                     rank: int, world_size: int, fake: bool = False) -> int:
    """Judge candidate job archives one after another in this launched process (the minifier's
    oracle): ``next-K.json`` names candidate K (or says stop); this rank writes its Outcome to
    ``rank-r-K.json``. Candidates hold no collectives (their values were recorded), so nothing
    one leaves behind in the process group can change the next one's verdict."""

    join(first.args, groups, timeout_s=timeout_s, rank=rank, world_size=world_size, fake=fake)
    write_json(folder / f"started-{rank}.json", {"pid": os.getpid(), "schedule": []})
    k = 1
    while True:
        ask = folder / f"next-{k}.json"
        if not ask.exists():
            time.sleep(0.02)
            continue
        request = json.loads(ask.read_text())
        if request.get("stop"):
            return 0
        ready, candidate = loaded(request["archive"], ReplaySettings.from_plain(request["settings"]), rank)
        outcome = replayed(ready, candidate, report_differences=False)
        write_json(folder / f"rank-{rank}-{k}.json", {"outcome": outcome.to_dict()})
        k += 1


def compile_alone(path: str, settings: ReplaySettings, plan: DevicePlan, folder: Path, *, rank: int,
                  world_size: int, timeout_s: float) -> int:
    """Compile this rank's graph only (``replay.compile_only``), under ``plan`` (an absent
    device's storages on ``meta``, compiled for its recorded description, the rank's own), its
    collectives' groups registered on a fake process group: a compile reads no collective's
    value, and a compile-stage failure needs no peer."""

    ready, repro = loaded(path, settings, rank, plan=plan)
    _ranks.init_fake(rank, world_size)
    _ranks.recreate_groups(_ranks.group_specs(ready.index.job), timeout_s=timeout_s)
    write_json(folder / f"started-{rank}.json", {"pid": os.getpid(), "schedule": [], "backend": ready.settings.backend})
    outcome = replayed(ready, repro, report_differences=False)
    write_json(folder / f"rank-{rank}.json", {"outcome": outcome.to_dict(), "schedule": []})
    return EXIT_FAILED if outcome.observed is not None else 0


def _wait_for_peers(rank: int, world_size: int, timeout_s: float) -> None:
    """Stay in the job until every rank is done, on the store. A peer still in a collective
    this rank skipped ends by its own timeout, which counts from when it got there (after its
    compile), and then exits failed, so the launcher ends this rank: the wait is bounded only
    by the launch's own bound."""

    store = default_store()
    store.set(f"reproarchive/done/{rank}", "1")
    bound = datetime.timedelta(seconds=timeout_s * 2 + STARTUP_ALLOWANCE_S)
    try:
        store.wait([f"reproarchive/done/{r}" for r in range(world_size)], bound)
    except Exception:  # noqa: BLE001 - a peer that never finishes is the launcher's to report
        pass


def main(argv: list[str]) -> int:
    """The launched program: read the request in FOLDER, load this rank's part of the job, and
    replay it (``mode`` ``replay``), record its collectives' values (``record``), judge the
    minifier's candidates (``candidates``) or compile it only (``compile``)."""
    folder = Path(argv[0])
    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    request = json.loads((folder / "request.json").read_text())
    fake = request.get("fake_rank") is not None
    if fake:
        rank, world_size = int(request["fake_rank"]), int(request["world_size"])
    redirect_output(folder, rank)

    settings = ReplaySettings.from_plain(request["settings"])
    timeout_s, mode = float(request["timeout_s"]), request.get("mode", "replay")
    if mode == "compile":
        code = compile_alone(request["archive"], settings, DevicePlan.from_plain(request["plan"]), folder, rank=rank,
                             world_size=world_size, timeout_s=timeout_s)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    ready, repro = loaded(request["archive"], settings, rank)
    groups = _ranks.group_specs(ready.index.job)
    if mode == "record":
        code = record_collectives(repro, groups, folder, timeout_s=timeout_s, rank=rank, world_size=world_size,
                                  fake=fake)
    elif mode == "candidates":
        code = serve_candidates(repro, groups, folder, timeout_s=timeout_s, rank=rank, world_size=world_size,
                                fake=fake)
    else:
        code = serve(ready, repro, folder, timeout_s=timeout_s, world_size=world_size, fake=fake,
                     fake_when_recorded=bool(request.get("fake_when_recorded")))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no teardown: a peer's pending collective must not hold this rank up


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
