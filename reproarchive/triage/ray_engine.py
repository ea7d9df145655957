"""``--engine ray``: triage's tasks on a Ray cluster (``pip install 'reproarchive[ray]'``).

Each triage task is one Ray task running ``engine.run_task``, which starts the same fresh
process the local engine starts, on whichever node Ray placed it: a crash or a hang still costs
one task, and Ray's own worker survives it. ``max_retries=0``: a task that killed its process
is a verdict, not something to retry. As the local engine's, those processes are forked from a
warm server (``child.warm_children``) that a Ray worker keeps for as long as it lives: a worker
pays the torch import once, not once per task.

Where the cluster is: ``address`` (``ray://head:10001`` for Ray Client, ``auto`` inside a
cluster, or the ``RAY_ADDRESS`` variable); without one, ``ray.init()`` starts a local Ray on
this machine. Per-task resources: ``num_cpus``, ``num_gpus`` and custom ``resources``
(``{"H100": 1}``) as Ray schedules them. Workers must have reproarchive and the torch under
test installed, and reach the archives: give triage a store URL (``s3://...``), which workers
pull from, rather than a local folder. The environment verdicts are cached under is asked of
a worker (``environment``), not assumed from the driver.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import os
from typing import Any

from reproarchive.child import python_path, warm_children
from reproarchive.errors import ReproArchiveError
from reproarchive.format.plain import from_plain
from reproarchive.replay.settings import ReplaySettings
from reproarchive.triage.engine import Executor, Task, run_task, typed
from reproarchive.triage.verdicts import Environment, current_environment

_warm: contextlib.ExitStack | None = None


def _run_task_warm(task: dict[str, Any]) -> dict[str, Any]:
    """``run_task`` on a Ray worker, its fresh process forked from the worker's warm server
    (started by the worker's first task, ended when the worker exits: a worker killed outright
    closes the server's request pipe, which ends it too)."""
    global _warm
    if _warm is None:
        _warm = contextlib.ExitStack()
        _warm.enter_context(warm_children())
        atexit.register(_warm.close)
    return run_task(task)


def _environment_of(settings: dict[str, Any]) -> dict[str, Any]:
    return current_environment(ReplaySettings.from_plain(settings)).to_plain()


class RayExecutor(Executor):
    """Tasks as Ray tasks (module docstring); ``workers`` is the cluster's CPU count divided by
    ``num_cpus``, for reporting only (Ray schedules)."""

    name = "ray"

    def __init__(self, address: str | None = None, *, num_cpus: float = 1, num_gpus: float = 0,
                 resources: dict[str, float] | None = None, init_options: dict[str, Any] | None = None):
        try:
            import ray
        except ImportError:
            raise ReproArchiveError("--engine ray needs Ray, which is not installed",
                                    "pip install 'reproarchive[ray]'") from None
        self._ray = ray
        self._started = False
        if not ray.is_initialized():
            options = dict(init_options or {})
            if address is None and not os.environ.get("RAY_ADDRESS"):
                # a local Ray: its workers import this reproarchive (and the compilers on our path)

                env = dict(options.pop("runtime_env", None) or {})
                env.setdefault("env_vars", {}).setdefault("PYTHONPATH", python_path())
                options["runtime_env"] = env
                options.setdefault("include_dashboard", False)
            try:
                ray.init(address=address, log_to_driver=False, **options)
            except (ConnectionError, RuntimeError, ValueError) as err:
                raise ReproArchiveError(f"cannot start or reach Ray at {address or 'a local instance'}: "
                                        f"{str(err).splitlines()[0] if str(err) else type(err).__name__}",
                                        "check --address (ray://HEAD:10001, or auto inside the cluster)") from None
            self._started = True
        placement = {"num_cpus": num_cpus, "num_gpus": num_gpus, "resources": resources or {}, "max_retries": 0}
        self._run = ray.remote(_run_task_warm).options(**placement)
        self._probe = ray.remote(_environment_of).options(**placement)
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1) // max(num_cpus, 1e-9)))
        self._refs: list = []

    def submit(self, task: Task) -> concurrent.futures.Future:
        ref = self._run.remote(task.to_plain())
        self._refs.append(ref)
        return typed(ref.future())

    def environment(self, settings: Any) -> Environment:
        plain = self._ray.get(self._probe.remote(settings.to_plain()))
        plain.pop("digest", None)
        plain.pop("label", None)
        return from_plain(Environment, plain)

    def cancel_pending(self) -> None:
        for ref in self._refs:
            try:
                self._ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - finished or already gone: nothing to cancel
                pass

    def close(self) -> None:
        if self._started:
            self._ray.shutdown()
            self._started = False
