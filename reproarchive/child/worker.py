"""Warm workers: the child protocol with one child serving many requests. A fresh child pays
the torch import and a compiler's first-use setup on every request; a caller that sends many
of one kind (the minifier replaying candidates) keeps one alive instead. The process start and
the clean-up both kinds of serving child share (``fork_server`` too) are here.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from reproarchive.child.protocol import (
    TEMP_ENV,
    Died,
    _died,
    _error_reply,
    error_from,
    python_path,
    temp_for_children,
)


class Worker:
    """A child that stays alive between requests (``python -m module --serve``), for callers
    that send many requests of one kind, such as the minifier replaying candidates: the torch
    import and a compiler's first-use setup are paid once instead of per request.

    Requests go down one pipe as JSON lines and replies come up another, as ``{"started"}``,
    ``{"result"}`` or ``{"error"}`` lines with the meaning they have in ``run_child``; stdout and
    stderr go to a log whose tail is what a ``Died`` reports. ``request`` is not thread-safe:
    one request at a time per worker.
    """

    def __init__(self, module: str, *, env: dict[str, str]):
        self.proc, self._log, self._requests, self._replies, self._temp = _serving(module, "--serve", env)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, request: Any) -> None:
        """A request whose reply nobody waits for (a warm-up)."""
        self._requests.write(json.dumps({"request": request, "reply": False}, default=str) + "\n")
        self._requests.flush()

    def request(self, request: Any) -> tuple[Any, Died | None]:
        """(the handler's result, None) or (None, how the worker died); errors re-raised."""
        start = os.fstat(self._log.fileno()).st_size
        started = None
        try:
            self._requests.write(json.dumps({"request": request, "reply": True}, default=str) + "\n")
            self._requests.flush()
            for line in self._replies:
                reply = json.loads(line)
                if "started" in reply:
                    started = reply["started"]
                elif "error" in reply:
                    raise error_from(reply["error"])
                elif "result" in reply:
                    return reply["result"], None
        except (BrokenPipeError, ValueError):
            pass
        code = self.proc.wait()
        self._log.seek(start)
        return None, _died(code, self._log.read().decode("utf-8", "replace"), started)

    def close(self) -> None:
        _close_quietly(self._requests, self._replies)
        if self.alive:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        shutil.rmtree(self._temp, ignore_errors=True)


def _close_quietly(*streams: Any) -> None:
    for stream in streams:
        try:
            stream.close()
        except OSError:  # the other end is gone already
            pass


def _serving(module: str, mode: str, env: dict[str, str]):
    """``python -m module MODE REQUESTS REPLIES`` in a session of its own (Ctrl-C reaches the
    caller only, which ends it): the process, its log, the two ends of its pipes, and its
    temporary folder (``TEMP_ENV``), for the caller to remove once the process is gone (the
    process removes it itself when its caller dies first: ``_remove_own_folder``): a
    request that kills the process (a crashing candidate) leaves its replay's folder there,
    not in the system's. It works in an empty folder inside that one: ``-m`` puts the working
    folder first on ``sys.path``, and nothing in the caller's must be importable there."""
    temp = tempfile.mkdtemp(prefix="reproarchive-worker-")
    env = dict(env, PYTHONPATH=python_path(), **temp_for_children(Path(temp)))
    (Path(temp) / "cwd").mkdir()
    env.setdefault("PYTHONFAULTHANDLER", "1")
    req_r, req_w = os.pipe()
    res_r, res_w = os.pipe()
    log = tempfile.TemporaryFile(prefix="reproarchive-worker-")
    try:
        proc = subprocess.Popen(
            [sys.executable, "-X", "faulthandler", "-m", module, mode, str(req_r), str(res_w)],
            cwd=Path(temp) / "cwd", env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(req_r, res_w),
            start_new_session=True,
        )
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    finally:
        os.close(req_r)
        os.close(res_w)
    return proc, log, os.fdopen(req_w, "w", encoding="utf-8"), os.fdopen(res_r, "r", encoding="utf-8"), temp


def _serve(handler: Callable[..., Any], request_fd: str, reply_fd: str, unexpected: type, unexpected_what: str) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    requests = os.fdopen(int(request_fd), "r", encoding="utf-8")
    replies = os.fdopen(int(reply_fd), "w", encoding="utf-8")

    def send(message: dict[str, Any]) -> None:
        replies.write(json.dumps(message, default=str) + "\n")
        replies.flush()

    for line in requests:
        message = json.loads(line)
        try:
            reply: dict[str, Any] = {"result": handler(message["request"],
                                                       started=lambda facts: send({"started": facts}),
                                                       event=lambda text: None)}
        except BaseException as err:
            reply = _error_reply(err, unexpected, unexpected_what)
        if message.get("reply", True):
            send(reply)
    _remove_own_folder()
    return 0


def _remove_own_folder() -> None:
    """A server whose caller closed the pipe without ending it (a caller killed outright: a Ray
    worker at ``ray.shutdown()``) removes the temporary folder ``_serving`` made for it, as the
    caller's ``close`` would have; only that folder: the parent of its working folder."""
    own = os.environ.get(TEMP_ENV)
    if own and Path(os.getcwd()) == Path(own) / "cwd":
        shutil.rmtree(own, ignore_errors=True)
