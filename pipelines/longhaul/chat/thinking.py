"""`spec.policy.thinking` → what the three places that render the policy's chat are given (pure).

Training renders nothing twice: veRL's continuous-token builder keeps the tokens the policy generated and appends
only the new messages, each rendered in a small synthetic context (token-in/token-out). Evaluation sends messages
to vLLM, which renders the whole conversation again at every turn; SFT renders whole conversations
(Render-Twice-Diff). The three agree only when re-rendering a conversation reproduces, token for token, what the
policy generated and was fed back — for every earlier turn, not only the last one.

Qwen3's own template does not: it drops the think blocks of every assistant turn before the last real user
message, and renders the empty think block of `enable_thinking=false` only on the final turn. longhaul therefore
renders Qwen3 policies with its own Qwen3-style template (`qwen3.jinja`, identical to Qwen3's rendering except
under `preserve_thinking=true`) and hands the same template and the same keyword arguments to all three:

| mode     | enable_thinking | preserve_thinking | template                     |
|----------|-----------------|-------------------|------------------------------|
| disabled | false           | true              | longhaul's Qwen3 template    |
| keep     | true            | true              | longhaul's Qwen3 template    |
| strip    | true            | (unset)           | the model's own (eval only)  |

Models without a thinking mode (Qwen2.5) get neither a template nor keyword arguments: nothing changes for them.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from longhaul.spec.policy import ThinkingMode, model_thinks

QWEN3_TEMPLATE_FILE = "qwen3.jinja"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def load_qwen3_template() -> str:
    """longhaul's Qwen3-style chat template (hybrid thinking, Hermes tool calls, `preserve_thinking`)."""
    return resources.files("longhaul.chat").joinpath(QWEN3_TEMPLATE_FILE).read_text(encoding="utf-8")


def chat_template_kwargs(policy: Any) -> dict[str, bool]:
    """Keyword arguments of the chat template for `policy` (a `PolicySpec`): veRL's
    `data.apply_chat_template_kwargs`, vLLM's `--default-chat-template-kwargs`, and the SFT dataset builder's."""
    if not model_thinks(policy.model.name):
        return {}
    if policy.thinking == ThinkingMode.STRIP:
        return {"enable_thinking": True}
    return {"enable_thinking": policy.thinking == ThinkingMode.KEEP, "preserve_thinking": True}


def chat_template_override(policy: Any) -> str | None:
    """The chat template that replaces the model's own for `policy` (veRL's `model.custom_chat_template`, vLLM's
    `--chat-template`, the SFT tokenizer's), or None to keep the model's own."""
    if model_thinks(policy.model.name) and policy.thinking != ThinkingMode.STRIP:
        return load_qwen3_template()
    return None


def visible_text(text: str) -> str:
    """What an assistant turn says to the user: the text after its think block (as Qwen3's template reads a
    turn: everything after the last `</think>`). An unclosed think block says nothing; text without one is
    returned unchanged."""
    if THINK_CLOSE in text:
        return text.rsplit(THINK_CLOSE, 1)[1].lstrip("\n")
    if THINK_OPEN in text:
        return text.split(THINK_OPEN, 1)[0]
    return text
