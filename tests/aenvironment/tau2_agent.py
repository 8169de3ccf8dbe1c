"""AEnvironment's tau2 RL entry point (its docs/examples/tau2_rl.md and aenv/examples/tau2_rl),
written from them: `run_agent_return_reward({"domain", "task_id"})` plays one tau2 episode in
`tau2-env@1.0.0` with an OpenAI Agents SDK agent turn by turn (tools called through the
environment), sends each answer to the user through `tau2_send_message`, and returns
`call_reward({})["total_reward"]`. The model is the Agents SDK's default, reached through
OPENAI_BASE_URL / OPENAI_API_KEY; the user simulator is TAU2_USER_LLM when that is set."""

import os
from typing import Any, Dict

from agents import Agent as OpenAIAgent
from agents import ModelSettings, RunConfig, Runner, set_default_openai_api

from aenv.core.environment import Environment

set_default_openai_api("chat_completions")


async def run_agent_return_reward(data: Dict[str, Any]) -> float:
    env = None
    try:
        env = Environment(
            env_name="tau2-env@1.0.0",
            environment_variables=dict(
                TAU2_DOMAIN=data.get("domain", "telecom"),
                TAU2_TASK_ID=data.get("task_id", ""),
                TAU2_SOLO_MODE="true" if os.getenv("TAU2_USER_LLM") is None else "false",
                TAU2_USER_LLM_API_BASE=os.getenv("TAU2_USER_LLM_API_BASE", ""),
                TAU2_USER_LLM_API_KEY=os.getenv("TAU2_USER_LLM_API_KEY", ""),
                TAU2_USER_LLM=os.getenv("TAU2_USER_LLM"),
            ),
        )
        await env.initialize()

        system_prompt = await env.call_function("tau2_get_system_prompt", {})
        agent = OpenAIAgent(
            name="Tau2 Agent",
            instructions=system_prompt if isinstance(system_prompt, str) else str(system_prompt),
            tools=await env.list_openai_tools(),
        )

        status = await env.call_function("tau2_get_status", {})
        max_steps = status.get("max_steps", 50)
        step = 0
        while step < max_steps:
            step += 1
            status = await env.call_function("tau2_get_status", {})
            if status.get("done", False):
                break
            observation = status.get("last_observation", "")
            turn_input = observation if observation else "Please start working on the task."
            try:
                result = await Runner.run(
                    agent,
                    input=turn_input,
                    run_config=RunConfig(
                        tracing_disabled=True,
                        model_settings=ModelSettings(
                            temperature=1.0,
                            top_p=1.0,
                            extra_args={"max_completion_tokens": 8192},
                        ),
                    ),
                    max_turns=10,
                )
                status = await env.call_function(
                    "tau2_send_message", {"message": result.final_output}
                )
                if status.get("done", False):
                    break
            except Exception as exc:
                print(f"Agent turn error: {exc}")
                continue

        reward = await env.call_reward({})
        return float(reward.get("total_reward", 0.0))

    except Exception as exc:
        print(f"Error running agent: {exc}")
        return 0.0


if __name__ == "__main__":
    import argparse
    import asyncio

    parser = argparse.ArgumentParser()
    parser.add_argument("--domain", type=str, default="telecom")
    parser.add_argument("--task_id", type=str, default="")
    args = parser.parse_args()
    reward = asyncio.run(run_agent_return_reward({"domain": args.domain, "task_id": args.task_id}))
    print(f"reward: {reward}")
