"""What the hub's stores keep: :data:`Document`, a JSON object (its own module so that the
store contract, :mod:`envhub.store`, can open the stores that implement it without an import
loop).

May import: the standard library.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Document"]

Document = dict[str, Any]
"""A JSON object (what ``json.dumps`` accepts: str keys; str, int, float, bool, None, lists and
dicts as values)."""
