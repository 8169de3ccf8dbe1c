"""A deterministic OpenAI-compatible chat-completions server on loopback, in a thread, for tests
that run ``aenv rollout --base-url`` as a subprocess (the async ``chat_endpoint`` fixture cannot
answer while a test blocks on one).

Every conversation goes the same way: the first reply asks for two tool calls (``call-a``: the
mini-terminal's command under its OpenAI name, writing the task's ``expected`` into
``answer.txt``; ``call-b``: ``cat answer.txt`` under the plain name), the second answers
``done``. Each reply carries ``usage`` (prompt tokens = the request's messages, completion
tokens = 7 and 3) and, when the request asks for them, ``logprobs`` of its made-up tokens.
``requests`` keeps every request body, ``headers`` their headers. ``ChatServer(responder)``
answers with ``responder(body)`` instead: a reply body, or ``(status, body)``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

OPENAI_NAME = "mini-terminal_1_0_0__execute_command"


def _logprobs(tokens: list[str]) -> dict[str, Any]:
    return {
        "content": [
            {
                "token": token,
                "logprob": -0.25 * (i + 1),
                "bytes": list(token.encode()),
                "top_logprobs": [],
            }
            for i, token in enumerate(tokens)
        ]
    }


def reply(body: dict[str, Any]) -> dict[str, Any]:
    """The server's answer to the request ``body``."""
    messages = body["messages"]
    prompt = next(m["content"] for m in messages if m["role"] == "user")
    expected = prompt.rsplit(" ", 1)[-1]
    if messages[-1]["role"] == "user":
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call-a",
                    "type": "function",
                    "function": {
                        "name": OPENAI_NAME,
                        "arguments": json.dumps({"command": f"echo {expected} > answer.txt"}),
                    },
                },
                {
                    "id": "call-b",
                    "type": "function",
                    "function": {
                        "name": "execute_command",
                        "arguments": json.dumps({"command": "cat answer.txt"}),
                    },
                },
            ],
        }
        tokens, finish = ["<tool>", "echo", "cat"] + ["x"] * 4, "tool_calls"
    else:
        message = {"role": "assistant", "content": "done"}
        tokens, finish = ["do", "ne", "."], "stop"
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
    if body.get("logprobs"):
        choice["logprobs"] = _logprobs(tokens)
    prompt_tokens = 10 * len(messages)
    return {
        "id": f"chatcmpl-{len(messages)}",
        "object": "chat.completion",
        "model": body["model"],
        "choices": [choice],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(tokens),
            "total_tokens": prompt_tokens + len(tokens),
        },
    }


class ChatServer:
    """``with ChatServer() as server:`` ``server.url`` is ``http://127.0.0.1:PORT/v1``."""

    def __init__(self, responder: Callable[[dict[str, Any]], Any] | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        owner = self
        answer = responder or reply

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                owner.requests.append(body)
                owner.headers.append(dict(self.headers))
                answered = answer(body)
                status, payload = answered if isinstance(answered, tuple) else (200, answered)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ChatServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)
