"""What the launcher starts on each rank of a job whose ranks are forked warm (``rank_server``):
a few milliseconds of Python that ask the launcher's server for the rank and then stand for it.

torch.distributed's launcher watches the processes it starts: their exit status, the signal
that ended them, and the SIGTERM it sends to stop them. So the process it starts must end as
the rank ends. This one hands the server its argument list, environment (the launcher's
``RANK``, ``WORLD_SIZE``, rendezvous variables), working folder and standard streams, forwards
every stopping signal to the rank, and ends with the rank's exit status, or by the rank's signal.

Run as a script (``python .../rank_client.py FOLDER``), never imported by the rank: standard
library only, so it starts without torch. A lost server ends it with status 1.
"""

import json
import os
import signal
import socket
import sys

#: Set by ``launch`` for the launcher of a job whose ranks all run on the CPU: fork them warm.
WARM_ENV = "REPROARCHIVE_WARM_RANKS"
#: The server's socket (a Linux abstract name), for the launched ranks only.
SERVER_ENV = "REPROARCHIVE_RANK_SERVER"
#: The signals the launcher may stop a rank with; each is passed on to the rank.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_MAX_MESSAGE = 1 << 16


def main() -> int:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.connect("\0" + os.environ.pop(SERVER_ENV))
    request = {"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd()}
    socket.send_fds(server, [json.dumps(request).encode()], [0, 1, 2])
    started = server.recv(_MAX_MESSAGE)
    if not started:
        return 1
    pid = json.loads(started)["pid"]

    def forward(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    ended = server.recv(_MAX_MESSAGE)  # retried by Python when a forwarded signal interrupts it
    if not ended:
        return 1
    status = json.loads(ended)
    if status.get("signal"):
        if status["signal"] not in (signal.SIGKILL, signal.SIGSTOP):  # the two no handler can take
            signal.signal(status["signal"], signal.SIG_DFL)
        os.kill(os.getpid(), status["signal"])
    return int(status.get("exit", 1))


if __name__ == "__main__":
    sys.exit(main())
