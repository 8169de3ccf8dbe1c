"""A deterministic inference server speaking SGLang's native HTTP API, as AReaL's remote engine
calls it (``areal/engine/sglang_remote.py``, ``SGLangBackend``): ``GET /health``, and
``POST /generate`` with ``input_ids``, ``sampling_params`` (``max_new_tokens``,
``stop_token_ids``, ...) and ``return_logprob``, answered with ``text``, ``output_ids`` and
``meta_info`` (``finish_reason: {"type": "stop"|"length"}``, ``prompt_tokens``,
``completion_tokens``, ``output_token_logprobs: [[logprob, token_id, None], ...]``).

It plays mini-terminal: to a user's ``write N`` it answers a tool call (Qwen's
``<tool_call>`` form, which AReaL's proxy parses with sglang's parser) that writes a number into
``answer.txt``, and after the tool's result it says ``done``. The k-th first turn of one prompt
writes ``N - k``, so the concurrent episodes of a group play differently (and score
differently), and each episode's reward says which tokens it got. ``together`` makes the first
turns of a prompt wait for each other (a barrier of that many requests): a group whose episodes
did not run concurrently gets an HTTP 503 instead of a reply. Every reply is kept in
:attr:`SGLangServer.produced`. Runs in the AReaL virtual environment (``transformers``).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from transformers import AutoTokenizer

TOOL = "mini-terminal_1_0_0__execute_command"  # the name aenv-ray offers the model
BARRIER_SECONDS = 60.0  # a guard against a group that never comes together, not a measurement


class SGLangServer:
    """``with SGLangServer(tokenizer_dir, together={"write 42": 2}) as server: server.address``"""

    def __init__(self, tokenizer_dir: str, together: dict[str, int] | None = None) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        self.produced: list[dict[str, Any]] = []
        self._first_turns: dict[str, int] = {}
        self._barriers = {
            prompt: threading.Barrier(n, timeout=BARRIER_SECONDS)
            for prompt, n in (together or {}).items()
        }
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/health":
                    self._reply(200, {"status": "ok"})
                else:
                    self._reply(404, {"error": f"no route {self.path}"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != "/generate":
                    self._reply(404, {"error": f"no route {self.path}"})
                    return
                try:
                    self._reply(200, server.generate(body))
                except threading.BrokenBarrierError:
                    self._reply(503, {"error": "the group's episodes did not run together"})

            def _reply(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self.address = f"127.0.0.1:{self._http.server_address[1]}"

    def __enter__(self) -> SGLangServer:
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()

    def forget(self) -> None:
        """Start afresh: no replies kept, no first turn counted."""
        with self._lock:
            self.produced.clear()
            self._first_turns.clear()

    def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        """SGLang's ``/generate`` for token ids in (``input_ids``), tokens and logprobs out."""
        input_ids: list[int] = body["input_ids"]
        params = body.get("sampling_params") or {}
        turns = self.tokenizer.decode(input_ids).split("<|im_start|>")
        user = [t for t in turns if t.startswith("user")][-1].strip().removesuffix("<|im_end|>")
        prompt = user.removeprefix("user").strip()
        if turns[-2].startswith("user"):  # the user spoke last: call the tool
            barrier = self._barriers.get(prompt)
            if barrier is not None:
                barrier.wait()
            with self._lock:
                k = self._first_turns[prompt] = self._first_turns.get(prompt, -1) + 1
            number = int(prompt.rsplit(" ", 1)[-1]) - k
            call = {"name": TOOL, "arguments": {"command": f"echo {number} > answer.txt"}}
            text = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        else:
            text = "done"
        ids = [*self.tokenizer.encode(text, add_special_tokens=False)]
        ids.append(self.tokenizer.eos_token_id)
        finish: dict[str, Any] = {"type": "stop", "matched": self.tokenizer.eos_token_id}
        limit = params.get("max_new_tokens")
        if limit is not None and len(ids) > limit:
            ids, finish = ids[:limit], {"type": "length", "length": limit}
        logprobs = [-((i * 7 + len(input_ids)) % 13) / 10.0 for i in range(len(ids))]
        with self._lock:
            self.produced.append({"input": list(input_ids), "output": ids, "logprobs": logprobs})
        return {
            "text": self.tokenizer.decode(ids, skip_special_tokens=True),
            "output_ids": ids,
            "meta_info": {
                "id": f"gen-{len(self.produced)}",
                "finish_reason": finish,
                "prompt_tokens": len(input_ids),
                "completion_tokens": len(ids),
                "cached_tokens": 0,
                "output_token_logprobs": [
                    [lp, t, None] for lp, t in zip(logprobs, ids, strict=True)
                ],
            },
        }
