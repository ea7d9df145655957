"""The fork server gives each request a fresh process, as ``run_child`` does, minus the imports;
inside ``warm_children`` it is what ``run_child`` uses."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reproarchive import child
from reproarchive.child import ForkServer, run_child, warm_children


@pytest.fixture(autouse=True)
def no_warm_children(monkeypatch):
    """These tests choose how each child starts: the suite's own warm servers stay out."""
    monkeypatch.setattr(child, "_warm", None)


def test_each_request_gets_a_fresh_child_with_its_environment_and_a_crash_is_a_death():
    with ForkServer("support.fork_child", env=dict(os.environ, FORK_TEST_VALUE="server")) as server:
        first, died = server.run({"what": "a"}, env={"FORK_TEST_VALUE": "first"})
        assert died is None
        assert first["seen"] == ["a"] and first["env"] == "first" and first["sum"] == 3.0
        assert os.path.basename(first["cwd"]) == "cwd"  # its own working folder, as run_child's
        second, died = server.run({"what": "b"})
        assert died is None
        # nothing the first request did or set is seen by the second: another process, from the
        # server's state (which never ran a request)
        assert second["seen"] == ["b"] and second["env"] == "server" and second["pid"] != first["pid"]

        result, died = server.run({"what": "crash"})
        assert result is None and died.signal_name == "SIGSEGV" and died.started == {"asked": "crash"}
        assert "Fatal Python error" in died.log_tail  # faulthandler's report, from the child's log
        after, died = server.run({"what": "c"})
        assert died is None and after["seen"] == ["c"]  # a crashed child does not end the server


def test_a_server_that_is_gone_is_reported_as_a_death_and_close_ends_its_group():
    server = ForkServer("support.fork_child", env=dict(os.environ))
    try:
        server.run({"what": "a"})
        os.kill(server.proc.pid, signal.SIGKILL)
        result, died = server.run({"what": "b"})
        assert result is None and died.returncode == -signal.SIGKILL
    finally:
        server.close()
    with pytest.raises(ProcessLookupError):
        os.killpg(server.proc.pid, 0)


@pytest.mark.parametrize("how", ["run_child", "fork server"])
def test_a_child_that_crashes_in_a_replay_leaves_no_temporary_folder(how):
    """A replay's private working folder is made inside the child's own folder, which the parent
    removes: a crash in the replay (its ``finally`` never runs) leaves nothing in the system's."""
    if how == "run_child":
        _, died = run_child("support.fork_child", {"what": "replay-crash"}, env=dict(os.environ))
    else:
        with ForkServer("support.fork_child", env=dict(os.environ)) as server:
            _, died = server.run({"what": "replay-crash"})
    assert died.signal_name == "SIGSEGV"
    folder = Path(died.started["folder"])
    assert folder.name.startswith("reproarchive-replay-") and folder.parent.name == "tmp"
    assert not folder.parent.parent.exists()  # the child's folder, removed with what was left in it


@pytest.fixture(params=["started", "forked"])
def children(request):
    """``run_child`` as a caller sees it: a started process, or one forked inside
    ``warm_children``; every answer must be the same."""
    if request.param == "started":
        yield request.param
    else:
        with warm_children():
            yield request.param


def test_events_time_limits_and_imports_are_the_same_for_started_and_forked_children(children, tmp_path,
                                                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "support").mkdir()  # the caller's folder must not shadow what the child imports
    events = []
    result, died = run_child("support.fork_child", {"what": "events"}, env=dict(os.environ), on_event=events.append)
    assert died is None and events == ["one", "two", "three"]
    assert result["path0"] != str(tmp_path) and os.path.basename(result["cwd"]) == "cwd"

    _, died = run_child("support.fork_child", {"what": "hang"}, env=dict(os.environ), timeout=12)
    assert died.timed_out == 12 and died.started["asked"] == "hang"  # a started child imports first
    assert _ended(died.started["grandchild"])  # the limit ends what the child started too


def _ended(pid: int) -> bool:
    """Gone, or killed and not yet reaped by whoever adopted it."""
    for _ in range(50):
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def test_warm_children_fork_each_child_from_one_server_per_environment_and_end_them_on_leaving():
    with warm_children():
        first, _ = run_child("support.fork_child", {"what": "a"}, env=dict(os.environ))
        second, _ = run_child("support.fork_child", {"what": "b"}, env=dict(os.environ))
        other, _ = run_child("support.fork_child", {"what": "c"}, env=dict(os.environ, FORK_TEST_VALUE="x"))
        assert first["server"] == second["server"] != os.getpid()
        assert second["seen"] == ["b"]  # a fresh process each time
        assert other["server"] != first["server"] and other["env"] == "x"  # what torch reads at import
        # a variable pytest changes for every test does not choose the server, and is current
        later, _ = run_child("support.fork_child", {"what": "d"}, env=dict(os.environ, PYTEST_CURRENT_TEST="t2"))
        assert later["server"] == first["server"] and later["current_test"] == "t2"
        folders = [Path(s._temp) for s in child._warm.servers.values()]
        assert len(folders) == 2 and all(f.is_dir() for f in folders)
    assert not any(f.exists() for f in folders)  # the servers' temporary folders went with them
    with pytest.raises(ProcessLookupError):
        os.kill(first["server"], 0)
    with pytest.raises(ProcessLookupError):
        os.kill(other["server"], 0)


def test_a_server_whose_caller_is_killed_ends_and_removes_its_temporary_folder(tmp_path):
    """A caller killed outright (a Ray worker at ``ray.shutdown()``) never closes its server: the
    server sees its request pipe end, stops, and removes the folder made for it."""
    caller = subprocess.Popen(
        [sys.executable, "-c", "import os, sys\n"
         "from reproarchive.child import ForkServer\n"
         "s = ForkServer('support.fork_child', env=dict(os.environ))\n"
         "s.run({'what': 'a'})\n"
         "print(s.proc.pid, s._temp, flush=True)\n"
         "sys.stdin.read()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        ready, _, _ = select.select([caller.stdout], [], [], 120)
        assert ready, "the caller did not start its server in 120 s"
        server_pid, folder = caller.stdout.readline().split()
        assert Path(folder).is_dir()
    finally:
        caller.kill()
        caller.wait()
    try:
        assert _ended(int(server_pid))
    finally:  # a server that did not end is not left running
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(server_pid), signal.SIGKILL)
    for _ in range(50):
        if not Path(folder).exists():
            break
        time.sleep(0.1)
    assert not Path(folder).exists()


def test_a_server_runs_children_at_once_for_callers_on_several_threads():
    with ForkServer("support.fork_child", env=dict(os.environ)) as server:
        server.run({"what": "a"})  # the server has imported
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            answers = [f.result()[0] for f in [pool.submit(server.run, {"what": "pause"}) for _ in range(2)]]
    first, second = sorted(answers, key=lambda a: a["begun"])
    assert second["begun"] < first["ended"]


def test_an_unexpected_error_in_a_child_carries_its_traceback_for_debug_and_triage(tmp_path):
    """One line for the parent, the child's own traceback behind --debug, and a triage verdict
    that says where it was raised (the hint to use --debug would not reach a task's child)."""
    from reproarchive.errors import ReproArchiveError
    from reproarchive.triage.engine import _raised_at

    with pytest.raises(ReproArchiveError) as caught:
        run_child("support.fork_child", {"what": "bug"}, env=dict(os.environ))
    err = caught.value
    assert "KeyError" in err.what and "--debug" in err.hint
    assert "_a_bug_of_ours" in err.child_traceback and "KeyError: 'not-there'" in err.child_traceback
    assert _raised_at(err.child_traceback).endswith("in _a_bug_of_ours")
    assert "fork_child.py:" in _raised_at(err.child_traceback)
