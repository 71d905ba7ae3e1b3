"""`make lab` brings up JupyterLab on notebooks/: the server answers on its port."""

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_make_lab_serves_jupyterlab():
    port = _free_port()
    args = "--no-browser --ip=127.0.0.1 --ServerApp.token=test --ServerApp.open_browser=False"
    proc = subprocess.Popen(
        ["make", "lab", f"LAB_PORT={port}", f"LAB_ARGS={args}"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 120
        status = None
        while time.time() < deadline and status is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token=test", timeout=2) as r:
                    status = json.loads(r.read())
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode()
                time.sleep(1)
        assert status is not None, "JupyterLab did not answer within 120 s"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents?token=test", timeout=5) as r:
            listing = json.loads(r.read())
        assert listing["type"] == "directory"  # the server's root is notebooks/
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token=test", timeout=10) as r:
            assert r.status == 200 and b"JupyterLab" in r.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
