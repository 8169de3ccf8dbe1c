"""``aenv build``: a project -> an immutable, content-addressed bundle and a Dockerfile."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add ``build`` to ``app`` (being written)."""
