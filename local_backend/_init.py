"""The instance's pid 1: ``init.c``, compiled once per machine and cached by its source's hash.

Without a C compiler (or when ``AENV_LOCAL_INIT=python``) the template forks itself as the
instance's pid 1 instead: the same behaviour, a few milliseconds more per instance.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["SOURCE", "init_binary"]

log = logging.getLogger("local_backend")

SOURCE = Path(__file__).with_name("init.c")


def _cache_dir() -> Path:
    import platformdirs

    return platformdirs.user_cache_path("aenv")


def init_binary() -> tuple[Path | None, str]:
    """``(path, "")`` of the compiled init, or ``(None, why not)``."""
    if os.environ.get("AENV_LOCAL_INIT", "").lower() == "python":
        return None, "AENV_LOCAL_INIT=python"
    source = SOURCE.read_bytes()
    target = _cache_dir() / f"aenv-init-{hashlib.sha256(source).hexdigest()[:16]}"
    try:
        if target.is_file() and os.access(target, os.X_OK):
            return target, ""
        compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
        if compiler is None:
            return None, "no C compiler (cc) to build the instances' init"
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        # a user without a home of their own: nobody's is /nonexistent, and without $HOME the
        # zygote (root of its user namespace) would look in root's
        return None, f"cannot cache the instances' init in {target.parent}: {exc.strerror}"
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / "aenv-init"
        result = subprocess.run(
            [compiler, "-O2", "-o", str(built), str(SOURCE)],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            return None, f"building {SOURCE.name} failed: {result.stderr.strip()[-300:]}"
        os.chmod(built, 0o755)
        os.replace(built, target)  # atomic: concurrent builders agree on the result
    log.info("built the instances' init", extra={"path": str(target)})
    return target, ""
