"""``run --minify``: shrink an archived failure into a new, smaller archive.

This joins three pieces that know nothing of each other: the archive (load / pack), replay
(which decides "reproduced" by the strict signature recorded at capture time) and the graph
minifier (which only asks a yes/no predicate). The predicate is "replay says *reproduced*",
never "it raised something", so the search cannot drift to a different, smaller failure.

Every accepted step is written to the output archive (atomically), so a crash or Ctrl-C loses
nothing; the final write adds the statistics. With ``isolate`` every candidate is replayed in a
child process, so a compiler that segfaults on some candidate cannot take the minifier down.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

from reproarchive.archive.loading import Repro, load
from reproarchive.archive.packing import pack
from reproarchive.errors import NotReproducedError, ReproArchiveError


@dataclasses.dataclass
class MinifyReport:
    """What ``minify_archive`` did; ``to_dict()`` is what ``run --minify --json`` prints."""

    archive: str
    output: str
    parent: str
    status: str  # "minified" | "not failing" | "unchanged"
    stats: dict[str, Any]
    code: str
    input_origins: list[str]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _replay_predicate(repro: Repro, *, backend: str, accuracy: bool, only_fwd: bool, device, current_config: bool, tol):
    from reproarchive.replay.outcome import REPRODUCED
    from reproarchive.replay.runner import replay_graph

    def fails(gm, inputs) -> bool:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outcome = replay_graph(
                gm, list(inputs), backend=backend, recorded_failure=repro.failure, accuracy=accuracy,
                only_fwd=only_fwd, config=repro.config, environment=repro.environment, system=None,
                current_config=current_config, source_kind=repro.graph_kind, tol=tol,
                report_differences=False,
            )
        return outcome.status == REPRODUCED

    return fails


def _isolated_predicate(repro: Repro, *, backend: str, accuracy: bool, only_fwd: bool, device, current_config: bool, tol, workdir: Path):
    from reproarchive.replay.isolation import run_in_child
    from reproarchive.replay.outcome import REPRODUCED

    counter = [0]

    def fails(gm, inputs) -> bool:
        counter[0] += 1
        candidate = workdir / f"candidate-{counter[0]}.tar.zst"
        _write(candidate, repro, gm, inputs, stats=None)
        try:
            # the candidate holds already-mapped inputs and graph: map nothing again
            outcome = run_in_child(candidate, environment=repro.environment, device=None, backend=backend,
                                   accuracy=accuracy, only_fwd=only_fwd, current_config=current_config, tol=tol)
        finally:
            candidate.unlink(missing_ok=True)
        return outcome.status == REPRODUCED

    return fails


def _write(path: Path, repro: Repro, gm, inputs, *, stats: dict | None) -> None:
    pack(
        gm, inputs, path,
        config=repro.config, environment=repro.environment, system=repro.system, failure=repro.failure,
        source=repro.source, backend=repro.backend, accuracy=repro.accuracy, parent=repro.digest,
        minify=stats,
    )


def minify_archive(
    path: str | os.PathLike,
    output: str | os.PathLike,
    *,
    max_time: float | None = None,
    isolate: bool = False,
    device=None,
    backend: str | None = None,
    accuracy: bool | None = None,
    only_fwd: bool = False,
    current_config: bool = False,
    tol: float | None = None,
    progress: Callable[[Any], None] | None = None,
) -> MinifyReport:
    """Shrink the archive at ``path`` while its recorded failure keeps reproducing; write ``output``."""
    from reproarchive.codec.graphs import readable_code
    from reproarchive.minifier import EagerRunError, NotFailingError, minify_with_stats

    output = Path(output)
    if Path(path).resolve() == output.resolve():
        raise ReproArchiveError("the output archive must differ from the input", "pass another -o path")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        repro = load(path, device=device)
    if repro.failure is None or repro.failure.stage == "unknown":
        raise ReproArchiveError(
            "the archive records no failure signature to minify against",
            "replay it first (`reproarchive pack` without --no-replay records one)",
        )
    from reproarchive.replay.backends import choose_backend

    chosen = choose_backend(backend, repro.backend)
    options = dict(backend=chosen, accuracy=bool(repro.accuracy) if accuracy is None else accuracy,
                   only_fwd=only_fwd, device=device, current_config=current_config, tol=tol)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="reproarchive-minify-") as tmp:
        fails = _isolated_predicate(repro, workdir=Path(tmp), **options) if isolate else _replay_predicate(repro, **options)

        def checkpoint(gm, inputs, stats) -> None:
            _write(output, repro, gm, inputs, stats={**stats.as_dict(), "stop_reason": "checkpoint"})

        try:
            result = minify_with_stats(repro.gm, repro.args, fails, max_time=max_time, progress=progress, on_accept=checkpoint)
        except NotFailingError:
            raise NotReproducedError(
                f"{path} does not reproduce its recorded failure here, so it cannot be minified",
                "run `reproarchive run` on it to see what happens instead",
            ) from None
        except EagerRunError as exc:
            raise NotReproducedError(
                f"the archived graph does not run in eager mode on its inputs ({str(exc)[:160]})",
                "the failure is not the compiler's; `reproarchive run --backend eager` shows it",
            ) from None
    stats = result.stats.as_dict()
    stats["wall_s"] = round(time.monotonic() - started, 3)
    stats["isolate"] = isolate
    stats["input_origins"] = result.input_origins
    _write(output, repro, result.gm, result.inputs, stats=stats)
    changed = result.stats.accepted > 0
    return MinifyReport(
        archive=str(path), output=str(output), parent=repro.digest,
        status="minified" if changed else "unchanged", stats=stats,
        code=readable_code(result.gm), input_origins=result.input_origins,
    )
