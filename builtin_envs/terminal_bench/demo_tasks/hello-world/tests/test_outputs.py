from pathlib import Path


def test_hello_file_exists():
    assert Path("/app/hello.txt").is_file(), "/app/hello.txt does not exist"


def test_hello_file_content():
    assert Path("/app/hello.txt").read_text().strip() == "Hello, world!"
