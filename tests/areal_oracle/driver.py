"""AEnvWorkflow under AReaL 1.0.4's own code (run with the AReaL venv's interpreter).

``python driver.py MODE`` (``inline`` or ``subproc``): serves AReaL's OpenAI proxy
(``proxy_rollout_server.app``) on loopback with :class:`engine.DeterministicEngine` made by
the proxy's ``/create_engine`` and a byte-level tokenizer built here (no hub), wraps
``rollout.areal.AEnvWorkflow`` in AReaL's ``OpenAIProxyWorkflow`` and runs a group of
episodes through ``arun_episode`` concurrently. Prints one JSON line: per episode the rewards
AReaL recorded, the environment's reward, and whether the recorded tokens and logprobs are
the engine's.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import
sys.path.insert(0, str(Path(__file__).parent))

import httpx
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


async def main(mode: str) -> dict[str, Any]:
    import engine
    from areal.experimental.openai import OpenAIProxyWorkflow
    from areal.experimental.openai.proxy import proxy_rollout_server
    from areal.infra import workflow_context
    from areal.infra.rpc.serialization import serialize_value

    from rollout.areal import AEnvWorkflow

    server = uvicorn.Server(
        uvicorn.Config(proxy_rollout_server.app, host="127.0.0.1", port=0, log_level="warning")
    )
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:  # noqa: ASYNC110 (uvicorn sets a flag, no event)
        await asyncio.sleep(0.02)
    address = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    async with httpx.AsyncClient() as client:
        kwargs = {"tokenizer_path": tokenizer_dir(), "admin_api_key": ADMIN}
        made = await client.post(
            f"{address}/create_engine",
            json={"engine": "engine.DeterministicEngine", "init_kwargs": serialize_value(kwargs)},
        )
        made.raise_for_status()
        ready = await client.post(f"{address}/call", json={"method": "initialize"})
        ready.raise_for_status()

    agent = AEnvWorkflow("mini-terminal@1.0.0", max_turns=4, temperature=1.0)
    workflow = OpenAIProxyWorkflow(mode=mode, agent=agent, proxy_addr=address, admin_api_key=ADMIN)
    group = {"prompt": "write 42", "reward_arguments": {"path": "answer.txt", "expected": "42"}}
    tasks = [  # a group of two of one task, a row of chat messages, a task the env scores 0.0
        group,
        group,
        {
            "messages": [{"role": "user", "content": "write 7"}],
            "reward_arguments": {"path": "answer.txt", "expected": "7"},
        },
        {"prompt": "write 5", "reward_arguments": {"path": "answer.txt", "expected": "6"}},
    ]

    async def episode(task_id: int, data: dict[str, Any]) -> dict[str, Any]:
        workflow_context.set(workflow_context.WorkflowContext(task_id=task_id))
        return await workflow.arun_episode(None, data)

    played = await asyncio.gather(*(episode(i, t) for i, t in enumerate(tasks)))
    episodes = []
    for interactions in played:
        turns = []
        for interaction in interactions.values():
            tensors = interaction.to_tensor_dict()
            ids = tensors["input_ids"][0].tolist()
            mask = tensors["loss_mask"][0].tolist()
            logprobs = tensors["logprobs"][0].tolist()
            produced = [p for p in engine.PRODUCED if ids[: len(p["input"])] == p["input"]]
            output = [t for t, m in zip(ids, mask, strict=True) if m]
            recorded = [lp for lp, m in zip(logprobs, mask, strict=True) if m]
            turns.append(
                {
                    "reward": interaction.reward,
                    "tokens_match": any(
                        p["input"] + p["output"] == ids and p["output"] == output for p in produced
                    ),
                    "logprobs_match": any(
                        all(abs(a - b) < 1e-6 for a, b in zip(p["logprobs"], recorded, strict=True))
                        for p in produced
                        if len(p["logprobs"]) == len(recorded)
                    ),
                }
            )
        episodes.append(turns)
    from areal.experimental.openai.proxy import workflow as proxy_workflow

    if proxy_workflow._executor is not None:  # subproc mode's pool: its processes hold stdout
        proxy_workflow._executor.shutdown(wait=True)
    return {"episodes": episodes, "generated": len(engine.PRODUCED)}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1]))), flush=True)
    os._exit(0)  # the proxy's server thread and AReaL's process pool end with the process
