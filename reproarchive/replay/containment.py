"""What a replay may change in this process, and how it is put back (spec §9).

The allowlist (spec §7.3) admits a few targets whose effect is on thread state rather than on
tensors, because real graphs need them: ``torch._C._set_grad_enabled`` (every ``no_grad``
region), autocast enter/exit, functorch transform levels (``vmap``), and random operators that
advance the generator (dropout). Compilers also write files when asked to (debug traces, logs)
into the working folder or torch's debug folder. ``contained`` bounds both: the replay runs in
a private working folder with torch's debug folder pointed into it, and afterwards the folder
is emptied and grad mode, autocast, forward-AD, functorch levels and every RNG are restored,
so nothing a graph did outlives the replay.

The working folder is one per process, emptied after each replay and removed when the process
exits, not one per replay: a compiler starts helper processes in it that outlive the replay
(inductor's compile-worker pool, started by the first compile that needs it and kept for the
process's life), and a helper whose working folder was removed fails at its next start-up step
that reads it (torch 2.15's pool died so, and every later compile in the process failed with
"Attempting to use a closed pool": a minifier's candidates all became different failures).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from reproarchive.child import temp_folder
from reproarchive.codec.device_runtime import devices_here, forked_rng
from reproarchive.compat import thread_state
from reproarchive.compat.dynamo import patched_config

_AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "hpu", "mps", "xla", "ipu", "mtia", "maia")


_working: dict[tuple[int, str | None], Path] = {}
_depth = 0


def _working_folder() -> Path:
    """This process's replay working folder, made at the first replay and removed at exit; a
    forked process, or a child with a request folder of its own, makes its own."""

    # in a child, inside its request's folder: a replay that crashes it leaves nothing behind
    key = (os.getpid(), temp_folder())
    folder = _working.get(key)
    if folder is None or not folder.is_dir():
        folder = Path(tempfile.mkdtemp(prefix="reproarchive-replay-", dir=key[1]))
        _working[key] = folder
        atexit.register(_remove, folder, key[0])
    return folder


def _remove(folder: Path, pid: int) -> None:
    if os.getpid() == pid:  # not in a forked child that exits through the interpreter
        shutil.rmtree(folder, ignore_errors=True)


def _empty(folder: Path) -> None:
    for entry in list(folder.iterdir()) if folder.is_dir() else []:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


@contextlib.contextmanager
def private_outputs() -> Iterator[Path]:
    """The process's working folder for the ``with`` body, torch's debug folder inside it;
    emptied afterwards (when the outermost replay ends). Paths the caller needs must be absolute
    before entering."""
    global _depth

    folder = _working_folder()
    old_cwd = os.getcwd()
    old_env = os.environ.get("TORCH_COMPILE_DEBUG_DIR")
    os.environ["TORCH_COMPILE_DEBUG_DIR"] = str(folder)
    _depth += 1
    try:
        with patched_config({"debug_dir_root": str(folder / "torch_compile_debug")}):
            os.chdir(folder)
            try:
                yield folder
            finally:
                os.chdir(old_cwd)
    finally:
        _depth -= 1
        if old_env is None:
            os.environ.pop("TORCH_COMPILE_DEBUG_DIR", None)
        else:
            os.environ["TORCH_COMPILE_DEBUG_DIR"] = old_env
        if _depth == 0:
            _empty(folder)


@contextlib.contextmanager
def restored_thread_state() -> Iterator[None]:
    """Grad mode, forward-AD, autocast (per device type, dtype, cache, nesting) and functorch
    levels as they were before the body, whatever the body's graph toggled."""
    import torch

    grad = torch.is_grad_enabled()
    fwd = thread_state.is_fwd_grad_enabled()
    autocast = {}
    for dev in _AUTOCAST_DEVICES:
        try:
            autocast[dev] = (torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev))
        except (RuntimeError, ValueError, TypeError):
            continue
    cache = torch.is_autocast_cache_enabled()
    nesting = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    depth = thread_state.functorch_depth()
    try:
        yield
    finally:
        if thread_state.functorch_depth() > depth:
            thread_state.leave_functorch_levels(depth)
        now = torch.autocast_increment_nesting() - 1
        torch.autocast_decrement_nesting()
        for _ in range(max(now - nesting, 0)):
            torch.autocast_decrement_nesting()
        for dev, (enabled, dtype) in autocast.items():
            torch.set_autocast_enabled(dev, enabled)
            torch.set_autocast_dtype(dev, dtype)
        torch.set_autocast_cache_enabled(cache)
        thread_state.set_fwd_grad_enabled(fwd)
        torch.set_grad_enabled(grad)


@contextlib.contextmanager
def contained(*, outputs: bool = True) -> Iterator[Path | None]:
    """Thread state restored and every random generator forked (the replay draws from the same
    seeds; the caller's generators are untouched afterwards), and with ``outputs`` a private
    working folder."""

    with contextlib.ExitStack() as stack:
        folder = stack.enter_context(private_outputs()) if outputs else None
        stack.enter_context(restored_thread_state())
        stack.enter_context(forked_rng(devices_here()))
        yield folder
