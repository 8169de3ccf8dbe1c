"""A few steps of TRL's ``GRPOTrainer`` on mini-terminal, in TRL's own virtual environment.

Run by tests/test_trl_oracle.py with the interpreter of tests/_oracles.py's ``TRL`` venv (trl,
transformers, torch's CPU build, this checkout's aenv-ray); prints one JSON line (``RESULT``)
with what the trainer logged and what the environment saw. Nothing comes from a hub: the
tokenizer is built here (``tokenizers``: one token per byte, Qwen2.5's chat template as TRL ships
it, which TRL knows how to parse tool calls of) and so is the model (a tiny Qwen2, randomly
initialised).

A random model almost never writes a well-formed tool call, so the model is made to: its
attention and MLP outputs start at zero (the next token then depends on the last one only) and
its output head maps the few tokens of a tool call to their successors, with a choice at two
points: after the assistant's header, a tool call (about 3 in 4) or the end of the turn; inside
the call, ``echo 42 > out.txt`` (rewarded) or ``echo 7 > out.txt`` (not), one token each. The
rest of the weights stay random, and GRPO trains all of them.

    python tests/_trl_train.py OUTPUT_DIR
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import time
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch
from datasets import Dataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AddedToken, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from trl import GRPOConfig, GRPOTrainer
from trl.chat_template_utils import qwen2_5_chat_template

from aenv_ray.engine import InstanceState, named_engine
from rollout.trl import TRLEnvironments

IMPORTED = time.process_time()  # CPU seconds spent importing torch, transformers, trl, aenv-ray

ENV = "mini-terminal@1.0.0"
GOOD = '\n{"name": "execute_command", "arguments": {"command": "echo 42 > out.txt"}}\n'
BAD = '\n{"name": "execute_command", "arguments": {"command": "echo 7 > out.txt"}}\n'
TASKS = [
    {
        "id": f"task-{n}",
        "prompt": "Write the answer into out.txt",
        "reward_arguments": {"path": "out.txt", "expected": "42"},
        "solution": "echo 42 > out.txt",  # never shown to the model
    }
    for n in range(4)
]
STEPS = 3
GROUP = 4  # rollouts per prompt, and per step


def tokenizer() -> PreTrainedTokenizerFast:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    made = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    made.add_tokens([AddedToken(t, normalized=False) for t in ("<tool_call>", "</tool_call>")])
    made.add_tokens([AddedToken(t, normalized=False) for t in (GOOD, BAD)])
    made.chat_template = qwen2_5_chat_template
    made.padding_side = "left"
    return made


def model(tok: PreTrainedTokenizerFast) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    hidden = 64
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    made = Qwen2ForCausalLM(config)
    made.generation_config.eos_token_id = tok.eos_token_id
    made.generation_config.pad_token_id = tok.pad_token_id
    ids = tok.convert_tokens_to_ids
    newline = tok.encode("\n", add_special_tokens=False)[-1]
    call, end_call, end = ids("<tool_call>"), ids("</tool_call>"), tok.eos_token_id
    good, bad = ids(GOOD), ids(BAD)
    script = {  # a token -> the logits of its successors
        newline: {call: 16.0, end: 14.9},
        call: {good: 16.0, bad: 16.0},
        good: {end_call: 16.0},
        bad: {end_call: 16.0},
        end_call: {end: 16.0},
    }
    with torch.no_grad():
        for layer in made.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        for k, (token, successors) in enumerate(script.items()):
            made.model.embed_tokens.weight[token].zero_()
            made.model.embed_tokens.weight[token, k] = 1.0  # the final norm scales it to sqrt(h)
            for successor, logit in successors.items():
                made.lm_head.weight[successor, k] = logit / math.sqrt(hidden)
    return made


def main(output_dir: str) -> dict[str, Any]:
    torch.set_num_threads(1)  # a tiny model: more threads only spin on a shared machine
    tok = tokenizer()
    with TRLEnvironments(ENV) as environments:
        rows = environments.rows(TASKS)
        trainer = GRPOTrainer(
            model=model(tok),
            processing_class=tok,
            train_dataset=Dataset.from_list(rows),
            environment_factory=environments,
            args=GRPOConfig(
                output_dir=output_dir,
                max_steps=STEPS,
                per_device_train_batch_size=GROUP,
                num_generations=GROUP,
                max_completion_length=256,
                max_tool_calling_iterations=2,
                learning_rate=1e-4,
                beta=0.0,  # no reference model
                logging_steps=1,
                report_to="none",
                save_strategy="no",
                use_cpu=True,
                seed=0,
                disable_tqdm=True,
            ),
        )
        before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
        started = time.process_time()
        trainer.train()
        trained = time.process_time() - started
        changed = sum(
            not torch.equal(before[k], v.detach()) for k, v in trainer.model.named_parameters()
        )
        environments.wait_released()
        records = [
            {
                "instance_id": r.instance_id,
                "task_id": r.task_id,
                "calls": r.calls,
                "reward": r.reward,
                "failure": r.failure,
            }
            for r in environments.records
        ]
        counts = {"started": environments.started, "released": environments.released}
        reward_name = environments.reward_name
        tool_names = environments.tool_names
    left = asyncio.run(named_engine("local").list(env_ref=ENV))
    return {
        "global_step": trainer.state.global_step,
        "log": [entry for entry in trainer.state.log_history if "reward" in entry],
        "reward_name": reward_name,
        "tool_names": tool_names,
        "prompts": [row["prompt"] for row in rows],
        "records": records,
        "counts": counts,
        "live": environments.live,
        "instances_left": [
            f"{info.id} {info.state.value}"
            for info in left
            if info.state is not InstanceState.TERMINATED
        ],
        "parameters_changed": changed,
        "cpu_seconds": {"imports": round(IMPORTED, 1), "train": round(trained, 1)},
    }


if __name__ == "__main__":
    result = main(sys.argv[1])
    print("RESULT " + json.dumps(result, default=str), flush=True)
