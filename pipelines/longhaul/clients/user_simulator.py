"""The LLM user simulator over an OpenAI-compatible endpoint (τ² style: the scenario in the system prompt,
roles flipped so the simulator writes the `assistant` side, `###STOP###` when the task is done)."""

from __future__ import annotations

from typing import Any

from longhaul.clients.openai_compat import ChatClient
from longhaul.clients.policy import SamplingParams

#: The agent's opening line the simulator answers first (τ² starts every conversation with it).
AGENT_GREETING = "Hi! How can I help you today?"

USER_GUIDELINES = """You are playing a customer who contacts an airline customer service agent.
Follow the scenario below. Rules:
- Write only what the customer says, one message at a time, in a natural tone.
- Reveal information gradually, only when the agent needs it; never invent facts that are not in the scenario.
- Do not repeat the scenario word for word.
- When your goal is reached, or cannot be reached, end the conversation by writing ###STOP### on its own.
- If the agent transfers you to a human agent, write ###TRANSFER###.
- If the scenario does not cover what the agent asks, write ###OUT-OF-SCOPE###.

<scenario>
{scenario}
</scenario>"""


def build_user_messages(instructions: str, conversation: list[dict[str, str]]) -> list[dict[str, str]]:
    """The simulator's chat: its own lines are `assistant`, the agent's lines are `user`."""
    msgs = [
        {"role": "system", "content": USER_GUIDELINES.format(scenario=instructions.strip())},
        {"role": "user", "content": AGENT_GREETING},
    ]
    for m in conversation:
        msgs.append({"role": "assistant" if m["role"] == "user" else "user", "content": m["content"]})
    return msgs


class OpenAIUserSimulator:
    """`UserSimulator` over a chat endpoint."""

    def __init__(self, client: ChatClient, sampling: SamplingParams | None = None, *, seed: int | None = None) -> None:
        self.client = client
        self.sampling = sampling or SamplingParams(temperature=0.0, top_p=1.0, max_tokens=1024)
        self.seed = seed

    def with_seed(self, seed: int | None) -> OpenAIUserSimulator:
        return OpenAIUserSimulator(self.client, self.sampling, seed=seed)

    async def reply(self, task: Any, conversation: list[dict[str, str]]) -> str:
        """The customer's next message. An answer without text is an endpoint fault (retried, then
        `EndpointError`): an empty customer line would silently change the episode."""
        data = await self.client.chat(
            build_user_messages(task.user_instructions(), conversation),
            expect_text=True,
            max_tokens=self.sampling.max_tokens or 1024,
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            seed=self.seed,
        )
        return (data["choices"][0]["message"].get("content") or "").strip()
