"""The fork server gives each request a fresh process, as ``run_child`` does, minus the imports."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from reproarchive.child import ForkServer, run_child


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
