"""A real S3 API on 127.0.0.1 for tests and benchmarks: moto's standalone server, as s3fs's own
test suite runs it (``moto.server.ThreadedMotoServer`` in a thread), or in a process of its
own (``moto_server``) where the client's GIL must not slow the server down."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Iterator

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(endpoint: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(endpoint + "/moto-api/", timeout=2).read()
            return
        except Exception as err:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the moto server at {endpoint} did not start") from err
            time.sleep(0.1)


@contextlib.contextmanager
def client_environment(endpoint: str) -> Iterator[None]:
    """Point every S3 client of this process (s3fs, boto) at ``endpoint`` with dummy keys."""
    saved = {k: os.environ.get(k) for k in (*CREDENTIALS, "AWS_ENDPOINT_URL", "AWS_PROFILE")}
    os.environ.update(CREDENTIALS)
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    os.environ.pop("AWS_PROFILE", None)
    _forget_s3_clients()  # one cached for an outer environment (a session's server) would call that one
    try:
        yield
    finally:
        # s3fs caches one client per set of constructor arguments, and the endpoint comes from
        # the environment: a client cached here would keep calling a server that has stopped
        _forget_s3_clients()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def threaded_server() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(endpoint)
        yield endpoint
    finally:
        server.stop()


@contextlib.contextmanager
def process_server() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(endpoint)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _forget_s3_clients() -> None:
    s3fs = sys.modules.get("s3fs")
    if s3fs is not None:
        s3fs.S3FileSystem.clear_instance_cache()


def make_bucket(name: str) -> None:
    import s3fs

    s3fs.S3FileSystem(skip_instance_cache=True).mkdir(name)
