"""A deterministic stand-in for AReaL's inference engine, as its proxy server creates one.

AReaL's proxy (``proxy_rollout_server``) makes its engine by import path (``/create_engine``)
and asks it ``agenerate(ModelRequest) -> ModelResponse``: the token ids of the prompt in, token
ids and their log-probabilities out. This one plays mini-terminal: to a user's ``write N`` it
answers with a tool call (Qwen's ``<tool_call>`` form, which AReaL parses with sglang's
parser) writing N into ``answer.txt``, and after the tool's result it says ``done``. Every reply
is kept in :data:`PRODUCED` (the proxy runs in the driver's process) for the test to compare
with what AReaL recorded. Runs in the AReaL virtual environment only.
"""

from __future__ import annotations

import json
from typing import Any

from areal.api.cli_args import AgentConfig, InferenceEngineConfig
from areal.api.io_struct import ModelRequest, ModelResponse
from transformers import AutoTokenizer

TOOL = "mini-terminal_1_0_0__execute_command"  # the name aenv-ray offers the model
PRODUCED: list[dict[str, Any]] = []


class DeterministicEngine:
    """AReaL's ``InferenceEngine`` as its proxy uses it: ``config``, ``initialize``,
    ``agenerate``, ``destroy``."""

    def __init__(self, tokenizer_path: str, admin_api_key: str) -> None:
        self.config = InferenceEngineConfig(
            experiment_name="aenv-ray",
            trial_name="oracle",
            tokenizer_path=tokenizer_path,
            agent=AgentConfig(
                agent_cls_path="rollout.areal.AEnvWorkflow",
                tool_call_parser="qwen25",
                reasoning_parser="qwen3",
                admin_api_key=admin_api_key,
            ),
        )
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)

    def initialize(self, *args: Any, **kwargs: Any) -> None:
        return None

    def destroy(self) -> None:
        return None

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        prompt = self.tokenizer.decode(req.input_ids)
        turns = prompt.split("<|im_start|>")
        users = [t for t in turns if t.startswith("user")]
        expected = users[-1].strip().removesuffix("<|im_end|>").rsplit(" ", 1)[-1]
        if turns[-2].startswith("user"):  # the user spoke last: call the tool
            call = {"name": TOOL, "arguments": {"command": f"echo {expected} > answer.txt"}}
            text = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        else:
            text = "done"
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        ids.append(self.tokenizer.eos_token_id)
        logprobs = [-((i * 7 + len(req.input_ids)) % 13) / 10.0 for i in range(len(ids))]
        PRODUCED.append({"input": list(req.input_ids), "output": ids, "logprobs": logprobs})
        return ModelResponse(
            input_tokens=list(req.input_ids),
            output_tokens=ids,
            output_logprobs=logprobs,
            output_versions=[0] * len(ids),
            stop_reason="stop",
            tokenizer=self.tokenizer,
            latency=0.0,
            ttft=0.0,
        )
