"""Warm ranks (``rank_server`` and ``rank_client``): a forked rank ends as a fresh one would, and
its client tells torchrun so: the exit status, the signal, a stop passed on, a lost client or
launcher taking the rank with it.

The server runs in a process of its own, as in the launcher (a pytest worker runs threads, and
the server refuses to fork from such a process). Its entry is a stand-in for the rank worker, so
each ending is made exactly and in milliseconds; the real rank worker forked warm is replayed by
the job tests (``test_job_run``), whose ranks are on the CPU.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from reproarchive.replay import rank_client

HOST = textwrap.dedent("""
    import os, sys, time
    from reproarchive.replay import rank_server

    def entry(argv):
        if argv[0] == "abort":
            os.abort()
        if argv[0] == "raise":
            raise RuntimeError("the rank's own error")
        print("rank", os.environ["RANK"], os.getcwd(), os.getpid(), flush=True)
        if argv[0] == "hang":
            time.sleep(600)
        return int(argv[1])

    if rank_server.start(entry) is None:
        sys.exit("no server")
    print(os.environ[rank_server.SERVER_ENV], flush=True)
    sys.stdin.read()  # the launcher lives until the test closes this
""")


@pytest.fixture
def server():
    host = subprocess.Popen([sys.executable, "-c", HOST], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    name = host.stdout.readline().strip()
    assert name.startswith("reproarchive-ranks-"), name
    yield host, name
    host.stdin.close()
    host.wait(timeout=30)


def _client(name: str, cwd, *argv: str, **options) -> subprocess.Popen:
    env = {**os.environ, rank_client.SERVER_ENV: name, "RANK": "1"}
    return subprocess.Popen([sys.executable, rank_client.__file__, *argv], env=env, cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **options)


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


def test_a_rank_gets_the_clients_environment_folder_and_streams_and_its_exit_status(server, tmp_path):
    _, name = server
    client = _client(name, tmp_path, "exit", "3")
    out, _ = client.communicate(timeout=30)
    assert client.returncode == 3
    said, rank, folder, pid = out.split()
    assert (said, rank, folder) == ("rank", "1", str(tmp_path)) and int(pid) != client.pid


def test_a_rank_killed_by_a_signal_ends_its_client_by_that_signal(server, tmp_path):
    _, name = server
    client = _client(name, tmp_path, "abort")
    client.communicate(timeout=30)
    assert client.returncode == -signal.SIGABRT
    raised = _client(name, tmp_path, "raise")
    _, err = raised.communicate(timeout=30)
    assert raised.returncode == 1 and "RuntimeError: the rank's own error" in err


def test_a_stop_sent_to_the_client_reaches_the_rank(server, tmp_path):
    _, name = server
    client = _client(name, tmp_path, "hang", "0")
    pid = int(client.stdout.readline().split()[3])
    client.send_signal(signal.SIGTERM)
    client.wait(timeout=30)
    assert client.returncode == -signal.SIGTERM and _gone(pid)


def test_a_killed_client_or_an_ended_launcher_takes_its_rank_with_it(server, tmp_path):
    host, name = server
    killed = _client(name, tmp_path, "hang", "0")
    pid = int(killed.stdout.readline().split()[3])
    killed.kill()
    killed.wait(timeout=30)
    assert _gone(pid)

    waiting = _client(name, tmp_path, "hang", "0")
    pid = int(waiting.stdout.readline().split()[3])
    host.stdin.close()  # the launcher ends
    host.wait(timeout=30)
    waiting.wait(timeout=30)
    assert _gone(pid) and waiting.returncode == -signal.SIGKILL


def test_a_client_gone_before_it_read_the_reply_takes_its_rank_with_it_and_the_server_lives(server, tmp_path):
    """A client killed before it read the server's reply leaves a reset, not an empty read: the
    server died of the ``ConnectionResetError`` and the rank lived on (seen once in CI, under load,
    as a rank not gone 10 s after its client was killed)."""
    import json
    import socket

    _, name = server
    read_end, write_end = os.pipe()
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    raw.connect("\0" + name)
    request = {"env": {**os.environ, "RANK": "1"}, "cwd": str(tmp_path), "argv": ["hang", "0"]}
    socket.send_fds(raw, [json.dumps(request).encode()], [0, write_end, 2])
    os.close(write_end)
    with os.fdopen(read_end) as rank_says:
        pid = int(rank_says.readline().split()[3])
        time.sleep(0.2)  # the server's reply waits, unread
        raw.close()
        assert _gone(pid)
    client = _client(name, tmp_path, "exit", "0")  # and the server serves the next client
    client.communicate(timeout=30)
    assert client.returncode == 0
