"""Warm ranks: a replayed job's rank workers forked from one process that imported them once.

A rank worker started fresh pays torch, Dynamo and Inductor's imports (5.5 s of CPU here)
before it replays anything, and a job on one machine pays them once per rank, at the same time,
on the same cores. The launcher process imports the rank worker once, then forks this server
before it starts any thread (torch.distributed's agent starts several). torch.distributed's
launcher then starts ``rank_client`` on each rank, and the server forks the rank from its warm
imports. It is what Python's ``multiprocessing`` forkserver does, except that torchrun still
owns the processes: it starts, watches and stops the clients, which stand for the ranks.

Only for ranks on the CPU: a process that has looked at a GPU cannot give its forks a working
one, and importing Inductor may look. A launch whose ranks use a GPU starts them fresh, as before.

The server imports but never computes, and it is single-threaded: a fork inherits no thread
pool and no lock held mid-use. Each rank gets the client's environment, working folder and
standard streams, and runs as the fresh process would have. The server reaps it and tells its
client how it ended. A client that goes away takes its rank with it (SIGKILL), and the
launcher's end takes every rank (the pipe from the launcher closes).
"""

from __future__ import annotations

import json
import os
import secrets
import select
import signal
import socket
import sys
import time
import traceback
from typing import Callable

from reproarchive.replay.rank_client import SERVER_ENV

_MAX_REQUEST = 1 << 20  # the client's environment, as JSON


def start(entry: Callable[[list[str]], int]) -> int | None:
    """Fork the server and name it in ``$REPROARCHIVE_RANK_SERVER`` for the clients. Returns
    the write end of a pipe that must stay open while the job runs (the server ends when it
    closes), or None, and no server, where forking is not safe: this process already runs a
    second thread (its imports started one), or this is not Linux (abstract socket names)."""
    if not sys.platform.startswith("linux") or len(os.listdir("/proc/self/task")) > 1:
        return None
    name = f"reproarchive-ranks-{os.getpid()}-{secrets.token_hex(6)}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind("\0" + name)
    listener.listen(256)
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(write_end)
        code = 0
        try:
            _serve(listener, read_end, entry)
        except BaseException:  # noqa: BLE001 - the clients see the server gone and end with 1
            traceback.print_exc()
            code = 1
        os._exit(code)
    os.close(read_end)
    listener.close()
    os.environ[SERVER_ENV] = name
    return write_end


def _serve(listener: socket.socket, launcher: int, entry: Callable[[list[str]], int]) -> None:
    running: dict[int, socket.socket] = {}  # rank pid -> its client
    while True:
        ready, _, _ = select.select([listener, launcher, *running.values()], [], [], 0.05)
        _reap(running)
        for source in ready:
            if source is launcher:  # the launcher has ended: so does its job, and each client says how
                for pid in running:
                    _kill(pid)
                while running:
                    _reap(running)
                    time.sleep(0.01)
                return
            if source is listener:
                client, _ = listener.accept()
                pid = _fork_rank(client, listener, launcher, running, entry)
                if pid is not None:
                    running[pid] = client
            elif source in running.values() and _gone(source):
                pid = next(p for p, c in running.items() if c is source)
                _kill(pid)  # its client is gone (SIGKILLed by the launcher): the rank goes too


def _fork_rank(client: socket.socket, listener: socket.socket, launcher: int, running: dict,
               entry: Callable[[list[str]], int]) -> int | None:
    data, fds, _, _ = socket.recv_fds(client, _MAX_REQUEST, 3)
    if not data or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        client.close()
        return None
    request = json.loads(data)
    pid = os.fork()
    if pid == 0:  # the rank
        code = 1
        try:
            listener.close()
            os.close(launcher)
            for other in running.values():
                other.close()
            client.close()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)
            os.environ.clear()
            os.environ.update(request["env"])
            os.chdir(request["cwd"])
            sys.argv = [sys.argv[0], *request["argv"]]
            code = entry(list(request["argv"]))
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else 1
        except BaseException:  # noqa: BLE001 - told as a fresh rank would: a traceback, exit 1
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    for fd in fds:
        os.close(fd)
    try:
        client.send(json.dumps({"pid": pid}).encode())
    except OSError:  # the client is gone already: the serve loop finds it so and ends the rank
        pass
    return pid


def _reap(running: dict[int, socket.socket]) -> None:
    """Tell each client whose rank has ended how it ended."""
    for pid in list(running):
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = pid, 1 << 8
        if done == 0:
            continue
        client = running.pop(pid)
        ended = ({"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status)
                 else {"exit": os.waitstatus_to_exitcode(status)})
        try:
            client.send(json.dumps(ended).encode())
        except OSError:
            pass
        client.close()


def _gone(client: socket.socket) -> bool:
    """Whether a rank's client has closed its end: an empty read, or a reset, which is what a
    client killed before it read the server's reply leaves (a reset killed the server, and the
    rank lived on)."""
    try:
        return not client.recv(1, socket.MSG_PEEK)
    except OSError:
        return True


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
