import subprocess
import time
import urllib.request
from collections.abc import Iterator

import pytest


@pytest.fixture
def server() -> Iterator[None]:
    """/app/serve.sh, started here (the judge ended every process the agent left running)."""
    process = subprocess.Popen(
        ["bash", "/app/serve.sh"], cwd="/app", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen("http://127.0.0.1:8765/", timeout=1).close()
                break
            except OSError:
                if process.poll() is not None:
                    break
                time.sleep(0.1)
        yield
    finally:
        process.kill()
        process.wait()


def test_server_answers(server: None) -> None:
    with urllib.request.urlopen("http://127.0.0.1:8765/", timeout=10) as response:
        assert response.status == 200
        assert response.read().decode().strip() == "aenv-ray demo"
