"""The floor: a trivial starlette JSON echo endpoint under uvicorn, configured like the runtime.

``python benchmarks/_floor_server.py PORT`` serves ``POST /echo`` on 127.0.0.1:PORT with
httptools + uvloop, access log off, no date/server headers (the runtime's settings).
"""

from __future__ import annotations

import sys

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


async def echo(request: Request) -> Response:
    payload = orjson.loads(await request.body())
    return Response(orjson.dumps(payload), media_type="application/json")


async def health(request: Request) -> Response:
    return Response(b'{"status":"healthy"}', media_type="application/json")


app = Starlette(routes=[Route("/echo", echo, methods=["POST"]), Route("/health", health)])


if __name__ == "__main__":
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=int(sys.argv[1]),
        http="httptools",
        loop="uvloop",
        access_log=False,
        log_level="warning",
        timeout_keep_alive=3600,
        date_header=False,
        server_header=False,
        lifespan="off",
    )
