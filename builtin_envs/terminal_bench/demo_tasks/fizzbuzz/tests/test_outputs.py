import subprocess
import sys
from pathlib import Path

import pytest


def expected(n):
    out = []
    for i in range(1, n + 1):
        word = ("Fizz" if i % 3 == 0 else "") + ("Buzz" if i % 5 == 0 else "")
        out.append(word or str(i))
    return out


def test_program_exists():
    assert Path("/app/fizzbuzz.py").is_file()


@pytest.mark.parametrize("n", [1, 15, 31])
def test_output(n):
    result = subprocess.run(
        [sys.executable, "/app/fizzbuzz.py", str(n)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == expected(n)
