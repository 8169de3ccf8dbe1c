import urllib.request


def test_server_answers():
    with urllib.request.urlopen("http://127.0.0.1:8765/", timeout=10) as response:
        assert response.status == 200
        assert response.read().decode().strip() == "aenv-ray demo"
