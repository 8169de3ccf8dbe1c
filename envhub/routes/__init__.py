"""The hub's HTTP routes, one :class:`fastapi.APIRouter` per concern, assembled by
:func:`envhub.app.create_app` (which also owns the error envelope, the middleware and the
lifespan).

==========================  ======================================================================
:mod:`.context`             what every router shares: :class:`~.context.Hub` (the store, the
                            registry, the control plane, the proxy's client, the options) and the
                            caller (``Who``, the auth dependency)
:mod:`.models`              request and response bodies (the OpenAPI document's schemas)
:mod:`.meta`                ``/v1/health`` (no auth) and ``/v1/whoami``
:mod:`.registry`            ``/v1/envs`` and ``/v1/tags``: publish, search, versions, bundles
:mod:`.instances`           ``/v1/instances``: create, list, get, delete, renew, fork
:mod:`.services`            ``/v1/services``: create, list, get, update, delete
:mod:`.runs`                ``/v1/runs``: rollout runs drivers push (register, records, end, list)
:mod:`.proxy`               ``.../proxy/{path}``: an instance's or a service's runtime, through the
                            hub
:mod:`.metrics`             ``/metrics``: Prometheus' scrape (:mod:`envhub.metrics`), behind a
                            scrape token or any API key
==========================  ======================================================================

A router's handlers take the hub as a dependency (``hub: HubDep``, the :class:`~.context.Hub`
that :func:`envhub.app.create_app` puts in ``app.state.hub``; the proxy's handlers, on the path of
every tool call sent through the hub, look it up without one), so each handler is a plain
module-level function and the routers hold no state of their own.

May import: the standard library, ``aenv_ray``, ``envhub``, fastapi/starlette, pydantic, aiohttp
(the proxy's client).
"""

__all__: list[str] = []
