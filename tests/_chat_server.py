"""A deterministic OpenAI-compatible chat-completions server on loopback, in a thread, for tests
that run ``aenv rollout --base-url`` as a subprocess (the async ``chat_endpoint`` fixture cannot
answer while a test blocks on one).

Every conversation goes the same way: the first reply asks for two tool calls (``call-a``: the
mini-terminal's command under its OpenAI name, writing the task's ``expected`` into
``answer.txt``; ``call-b``: ``cat answer.txt`` under the plain name), the second answers
``done``. The server tokenises as a byte-level model would (:func:`tokens`: one token per byte
of UTF-8, its id the byte's value): the prompt is the request's messages and tools in a small
chat template (:func:`render_prompt`), the completion the reply's text with each tool call
written ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (:func:`render_reply`, as
Hermes-style models write them). Each reply carries ``usage`` (the two token counts); asked
with ``logprobs`` (``top_logprobs: N``), OpenAI's ``logprobs.content`` of each token (``N``
alternatives); asked with ``return_token_ids``, the ids as vLLM returns them
(``prompt_token_ids`` on the reply, ``token_ids`` on the choice), or as SGLang does (both on the
choice) with ``ChatServer(sglang_reply)``.
``requests`` keeps every request body, ``headers`` their headers. ``ChatServer(responder)``
answers with ``responder(body)`` instead: a reply body, or ``(status, body)``, where a body of
bytes is sent as it is (a malformed answer). :data:`REFUSALS` are the error answers real
endpoints give (OpenAI's and vLLM's bodies, as they send them), and :func:`refusing` a responder
that answers the conversation's first turn and then one of them (or every turn, ``after=0``).

:class:`AgentModel` is the stand-in model of the agent-as-environment tests
(``builtin_envs/agent``): it answers by the conversation's last messages, whatever the level of
agent asks (see its docstring).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

OPENAI_NAME = "mini-terminal_1_0_0__execute_command"


def tokens(text: str) -> list[int]:
    """The token ids of ``text``: its UTF-8 bytes (a byte-level vocabulary of 256)."""
    return list(text.encode())


def render_reply(message: dict[str, Any]) -> str:
    """What the model wrote for the assistant ``message``: its text, then each tool call."""
    parts = [str(message.get("content") or "")]
    for call in message.get("tool_calls") or []:
        function = call["function"]
        said = {"name": function["name"], "arguments": json.loads(function["arguments"])}
        parts.append(f"<tool_call>{json.dumps(said)}</tool_call>")
    return "".join(parts)


def render_prompt(body: dict[str, Any]) -> str:
    """The prompt the model reads: the tools offered, each message, the assistant's turn."""
    tools = [t["function"]["name"] for t in body.get("tools") or []]
    text = f"<|tools|>{json.dumps(tools)}\n"
    for message in body["messages"]:
        said = (
            render_reply(message)
            if message["role"] == "assistant"
            else _text(message.get("content"))
        )
        text += f"<|{message['role']}|>{said}\n"
    return text + "<|assistant|>"


def _logprobs(completion: str, top: int) -> dict[str, Any]:
    """OpenAI's ``logprobs`` of each byte-token of ``completion``, ``top`` alternatives each."""
    content = []
    for i, byte in enumerate(completion.encode()):
        token = bytes([byte]).decode("utf-8", "replace")
        logprob = -0.125 * (i % 4 + 1)
        alternatives = [
            {"token": token, "logprob": logprob, "bytes": [byte]},
            *(
                {"token": chr(65 + k), "logprob": logprob - k - 1, "bytes": [65 + k]}
                for k in range(top - 1)
            ),
        ][:top]
        content.append(
            {"token": token, "logprob": logprob, "bytes": [byte], "top_logprobs": alternatives}
        )
    return {"content": content}


def reply(body: dict[str, Any], *, sglang: bool = False) -> dict[str, Any]:
    """The server's answer to the request ``body`` (token ids where SGLang puts them with
    ``sglang``, else where vLLM does)."""
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
        finish = "tool_calls"
    else:
        message = {"role": "assistant", "content": "done"}
        finish = "stop"
    completion = render_reply(message)
    prompt_ids, completion_ids = tokens(render_prompt(body)), tokens(completion)
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
    if body.get("logprobs"):
        choice["logprobs"] = _logprobs(completion, int(body.get("top_logprobs") or 0))
    answer: dict[str, Any] = {
        "id": f"chatcmpl-{len(messages)}",
        "object": "chat.completion",
        "model": body["model"],
        "choices": [choice],
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(completion_ids),
            "total_tokens": len(prompt_ids) + len(completion_ids),
        },
    }
    if body.get("return_token_ids"):
        choice["token_ids"] = completion_ids
        (choice if sglang else answer)["prompt_token_ids"] = prompt_ids
    return answer


def sglang_reply(body: dict[str, Any]) -> dict[str, Any]:
    """:func:`reply`, with the token ids where SGLang puts them (both on the choice)."""
    return reply(body, sglang=True)


# (status, body) of real endpoints' error answers, by what went wrong
REFUSALS: dict[str, tuple[int, dict[str, Any]]] = {
    # OpenAI: the conversation is over the model's context
    "openai-context": (
        400,
        {
            "error": {
                "message": "This model's maximum context length is 8192 tokens. However, your "
                "messages resulted in 8505 tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
    ),
    # vLLM's OpenAI server (its ErrorResponse): the same
    "vllm-context": (
        400,
        {
            "object": "error",
            "message": "This model's maximum context length is 4096 tokens. However, you "
            "requested 4597 tokens (4085 in the messages, 512 in the completion). Please reduce "
            "the length of the messages or completion.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
    ),
    # OpenAI: a wrong key
    "openai-401": (
        401,
        {
            "error": {
                "message": "Incorrect API key provided: sk-wrong. You can find your API key at "
                "https://platform.openai.com/account/api-keys.",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_api_key",
            }
        },
    ),
    # OpenAI: a tool schema it does not take (a bad request from our side)
    "openai-schema": (
        400,
        {
            "error": {
                "message": "Invalid schema for function 'execute_command': In context=(), "
                "'additionalProperties' is required to be supplied and to be false.",
                "type": "invalid_request_error",
                "param": "tools[0].function.parameters",
                "code": "invalid_function_parameters",
            }
        },
    ),
    # vLLM: a model it does not serve
    "vllm-404": (
        404,
        {
            "object": "error",
            "message": "The model `test-model` does not exist.",
            "type": "NotFoundError",
            "param": None,
            "code": 404,
        },
    ),
}


def refusing(kind: str, *, after: int = 1) -> Callable[[dict[str, Any]], Any]:
    """A responder answering as :func:`reply` for a conversation's first ``after`` turns, then
    with the refusal ``kind`` of :data:`REFUSALS`."""
    refusal = REFUSALS[kind]

    def respond(body: dict[str, Any]) -> Any:
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        return reply(body) if turn < after else refusal

    return respond


class ChatServer:
    """``with ChatServer() as server:`` ``server.url`` is ``http://127.0.0.1:PORT/v1``
    (``host``: another address of this machine to listen on, e.g. the one a cluster's pods
    reach it by)."""

    def __init__(
        self, responder: Callable[[dict[str, Any]], Any] | None = None, *, host: str = "127.0.0.1"
    ) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        owner = self
        answer = self.responder = responder or reply

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                owner.requests.append(body)
                owner.headers.append(dict(self.headers))
                if getattr(answer, "takes_headers", False):
                    answered = answer(body, dict(self.headers))
                else:
                    answered = answer(body)
                status, payload = answered if isinstance(answered, tuple) else (200, answered)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up first (its timeout)
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ChatServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        closed = getattr(self.responder, "closed", None)
        if isinstance(closed, threading.Event):
            closed.set()  # a responder holding a request back lets it go
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list (as some clients send it)."""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def _reply_with(body: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
    messages = body["messages"]
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    return {
        "id": f"chatcmpl-{len(messages)}",
        "object": "chat.completion",
        "created": 0,
        "model": body["model"],
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": 10 * len(messages),
            "completion_tokens": 5,
            "total_tokens": 10 * len(messages) + 5,
        },
    }


def _call(name: str, arguments: str, index: int) -> dict[str, Any]:
    return {
        "id": f"call-{index}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


class AgentModel:
    """A deterministic model for agents over environments, by the conversation's last message:

    - after a tool's result: the answer ``done: RESULT``;
    - a user message ``fail:http500`` / ``fail:401`` (its body quotes the Authorization header,
      as some providers quote a wrong key) / ``fail:json`` (not JSON) / ``fail:shape`` (JSON,
      no choices) / ``fail:slow`` (no answer until the server closes);
    - a user message ``loop: ...``: a call of the first tool offered after every result (never
      an answer), ``badargs: ...``: one call whose arguments are not JSON;
    - any other user message: with a tool named ``..._chat`` offered, a call of it with the same
      message (an agent asking the next agent); with ``..._execute_command``, a call of it with
      the command after ``run:``; with no tools, the answer ``echo: MESSAGE``.
    """

    takes_headers = True  # ChatServer passes each request's headers

    def __init__(self) -> None:
        self.closed = threading.Event()

    def __call__(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
        messages = body["messages"]
        last = messages[-1]
        user = next(m for m in reversed(messages) if m["role"] == "user")
        text = _text(user.get("content"))
        tools = [t["function"]["name"] for t in body.get("tools") or []]
        if text.startswith("loop:"):
            name = tools[0] if tools else "no_such_tool"
            message = {"role": "assistant", "content": None, "tool_calls": [_call(name, "{}", 0)]}
            return _reply_with(body, message)
        if last["role"] == "tool":
            done = f"done: {_text(last.get('content'))}"
            return _reply_with(body, {"role": "assistant", "content": done})
        if text.startswith("fail:"):
            return self._failure(text, headers or {})
        if text.startswith("badargs:") and tools:
            calls = [_call(tools[0], "{not json", 0)]
            return _reply_with(body, {"role": "assistant", "content": None, "tool_calls": calls})
        chat = next((t for t in tools if t.endswith("_chat")), None)
        terminal = next((t for t in tools if t.endswith("_execute_command")), None)
        if chat is not None:
            call = _call(chat, json.dumps({"message": text}), 0)
        elif terminal is not None:
            command = text.split("run:", 1)[1].strip() if "run:" in text else text
            call = _call(terminal, json.dumps({"command": command}), 0)
        else:
            return _reply_with(body, {"role": "assistant", "content": f"echo: {text}"})
        return _reply_with(body, {"role": "assistant", "content": None, "tool_calls": [call]})

    def _failure(self, text: str, headers: dict[str, str]) -> Any:
        kind = text.removeprefix("fail:").split()[0]
        if kind == "401":
            given = headers.get("Authorization", "").removeprefix("Bearer ")
            return 401, {"error": {"message": f"Incorrect API key provided: {given}"}}
        if kind == "http500":
            return 500, {"error": {"message": "the model crashed", "type": "server_error"}}
        if kind == "json":
            return 200, b"{this is not json"
        if kind == "shape":
            return 200, {"object": "chat.completion", "result": "no choices here"}
        if kind == "slow":
            self.closed.wait(120)
            return 503, {"error": "closed"}
        raise AssertionError(f"AgentModel: unknown failure {text!r}")
