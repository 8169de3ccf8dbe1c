"""AEnvWorkflow through AReaL 1.0.4's own rollout path (run with the AReaL venv's interpreter).

``python driver.py MODE...`` (``subproc``, ``inline``: AReaL's ``agent.mode``; subproc first:
AReaL forks its pool's processes at the first subproc episode, and forked after inline episodes
had run in this process they hung here) wires what AReaL's
``RolloutController`` wires for an agent workflow, with AReaL's own classes; only the inference
server is a stand-in (:class:`sglang_server.SGLangServer`, SGLang's ``/generate`` protocol, a
byte-level tokenizer built here: no hub):

- the proxy worker (``start_proxy``): AReaL's ``proxy_rollout_server`` on loopback, whose engine
  is made by ``/create_engine`` as ``RemoteSGLangEngine(config)`` and initialized by ``/call``
  with the server's address;
- the rollout worker's ``RemoteSGLangEngine(config)``, initialized with the server's address
  (which starts its ``WorkflowExecutor``), to which ``rollout.areal.AEnvWorkflow`` is submitted
  (``submit(data, workflow=agent, group_size=, proxy_addr=)``: AReaL wraps it in its
  ``OpenAIProxyWorkflow`` and, for a group, its ``GroupedRolloutWorkflow``), and ``wait``.

Prints one JSON line: per mode, per trajectory ``wait`` returned, per row (one model call) what the
prompt asked, the number the reply wrote, the reward AReaL put on the row, and whether the row's
tokens and logprobs are a reply of the server; and how many replies the server gave.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import
sys.path.insert(0, str(Path(__file__).parent))

import requests
import uvicorn
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

TEMPLATE = (
    "{% if tools %}<|im_start|>system\n<tools>{{ tools | tojson }}</tools><|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}<tool_call>\n{{ c.function | tojson }}\n</tool_call>"
    "{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
ADMIN = "aenv-admin-key"
GROUP = {"prompt": "write 42", "reward_arguments": {"path": "answer.txt", "expected": "42"}}
ROW = {  # a dataset row of chat messages instead of a prompt
    "messages": [{"role": "user", "content": "write 7"}],
    "reward_arguments": {"path": "answer.txt", "expected": "7"},
}


def tokenizer_dir() -> str:
    """A byte-level tokenizer (256 byte tokens, no merges) with a chat template, saved."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    fast.chat_template = TEMPLATE
    directory = tempfile.mkdtemp()
    fast.save_pretrained(directory)
    return directory


def start_proxy(config: Any, server: str) -> str:
    """AReaL's proxy worker as ``RolloutController._async_start_proxy`` sets it up: its server,
    an engine of the rollout's class made from the rollout's config, initialized with the
    inference server's address. Returns the proxy's address."""
    from areal.experimental.openai.proxy import proxy_rollout_server
    from areal.infra.rpc.serialization import serialize_value

    proxy = uvicorn.Server(
        uvicorn.Config(proxy_rollout_server.app, host="127.0.0.1", port=0, log_level="warning")
    )
    threading.Thread(target=proxy.run, daemon=True).start()
    while not proxy.started:  # uvicorn sets a flag, no event
        time.sleep(0.02)
    address = f"http://127.0.0.1:{proxy.servers[0].sockets[0].getsockname()[1]}"
    made = requests.post(
        f"{address}/create_engine",
        json={
            "engine": "areal.engine.sglang_remote.RemoteSGLangEngine",
            "init_kwargs": serialize_value({"config": config}),
        },
        timeout=60,
    )
    made.raise_for_status()
    ready = requests.post(
        f"{address}/call",
        json={"method": "initialize", "kwargs": serialize_value({"addr": server})},
        timeout=120,
    )
    ready.raise_for_status()
    return address


def rows(trajectory: dict[str, Any], tokenizer: Any, produced: list[dict[str, Any]]) -> list:
    """One record per row of a trajectory (a padded tensor dict): one model call each."""
    out = []
    for i in range(trajectory["input_ids"].shape[0]):
        keep = trajectory["attention_mask"][i].bool()
        ids = trajectory["input_ids"][i][keep].tolist()
        mask = trajectory["loss_mask"][i][keep].tolist()
        logprobs = trajectory["logprobs"][i][keep].tolist()
        output = [t for t, m in zip(ids, mask, strict=True) if m]
        recorded = [lp for lp, m in zip(logprobs, mask, strict=True) if m]
        replies = [p for p in produced if p["input"] + p["output"] == ids]
        text = tokenizer.decode(ids)
        written = re.search(r"echo (\d+) > answer\.txt", text)
        out.append(
            {
                "prompt": re.search(r"user\n(write \d+)", text).group(1),  # type: ignore[union-attr]
                "number": int(written.group(1)) if written else None,
                "reward": float(trajectory["rewards"][i]),
                "tokens_match": any(p["output"] == output for p in replies),
                "logprobs_match": any(
                    len(p["logprobs"]) == len(recorded)
                    and all(abs(a - b) < 1e-6 for a, b in zip(p["logprobs"], recorded, strict=True))
                    for p in replies
                ),
            }
        )
    return out


def main(modes: list[str]) -> dict[str, Any]:
    from areal.api.cli_args import AgentConfig, InferenceEngineConfig
    from areal.engine.sglang_remote import RemoteSGLangEngine
    from areal.experimental.openai.proxy import workflow as proxy_workflow
    from sglang_server import SGLangServer

    from rollout.areal import AEnvWorkflow

    def config(mode: str) -> InferenceEngineConfig:
        return InferenceEngineConfig(
            experiment_name="aenv-ray",
            trial_name="oracle",
            backend="sglang:d1",
            tokenizer_path=tokenizer,
            max_concurrent_rollouts=4,
            consumer_batch_size=4,
            request_retries=1,
            setup_timeout=60.0,
            agent=AgentConfig(
                agent_cls_path="rollout.areal.AEnvWorkflow",
                mode=mode,
                tool_call_parser="qwen25",
                reasoning_parser="qwen3",
                admin_api_key=ADMIN,
            ),
        )

    tokenizer = tokenizer_dir()
    results: dict[str, Any] = {}
    engines = []  # destroyed at the end: AReaL keeps an HTTP session per thread id, which the
    # runner thread of a new engine would inherit from a destroyed one's (its loop closed)
    with SGLangServer(tokenizer, together={GROUP["prompt"]: 2}) as server:
        proxy = start_proxy(config(modes[0]), server.address)  # the mode is the rollout's
        for mode in modes:
            server.forget()
            engine = RemoteSGLangEngine(config(mode))
            engines.append(engine)
            engine.initialize(addr=server.address)
            agent = AEnvWorkflow("mini-terminal@1.0.0", max_turns=4, temperature=1.0)
            engine.submit(GROUP, workflow=agent, group_size=2, proxy_addr=proxy)
            engine.submit(ROW, workflow=agent, proxy_addr=proxy)
            trajectories = engine.wait(count=2, timeout=180)
            results[mode] = {
                "trajectories": [
                    None if t is None else rows(t, server.tokenizer, server.produced)
                    for t in trajectories
                ],
                "generated": len(server.produced),
            }
        for engine in engines:
            engine.destroy()
    if proxy_workflow._executor is not None:  # subproc mode's pool: its processes hold stdout
        proxy_workflow._executor.shutdown(wait=True)
    return results


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])), flush=True)
    os._exit(0)  # the proxy's server thread and engine's threads end with the process
