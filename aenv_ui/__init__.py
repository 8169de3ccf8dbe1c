"""aenv_ui: the Environment Center, a web UI over rollout runs and a hub (``aenv ui``, ``/ui/``).

Owns the index of a run directory (:mod:`aenv_ui.index`: one SQLite file per run, built
incrementally from ``trajectories.jsonl`` while the run is live, so a page of a run of 100,000
episodes is one indexed query), the UI's server over run directories (:mod:`aenv_ui.server`:
loopback, a token in the printed URL, server-side paging and filters), the page the hub serves
at ``/ui/`` (:mod:`aenv_ui.hub`: the same front-end, talking to the hub's own API with the
visitor's key, so its keys and tenants apply) and the front-end itself (``aenv_ui/static``:
plain HTML, CSS and JavaScript, no build step). Charts are drawn by plotly.js, read at run
time from the installed ``plotly`` package (the ``ui`` extra): nothing is fetched from a CDN.

Reading a run needs neither Ray nor the ``rollout`` package: the record's fields are read as
docs/rollout.md#the-record-format gives them.

May import: the standard library, ``aenv_ray``, aiohttp; lazily, inside functions: starlette
(the hub's page, mounted by ``aenv serve``), platformdirs (the index's default place).
Must not import: ray, kubernetes, ``rollout``, ``envhub``.
"""

from __future__ import annotations

__all__: list[str] = []
