"""Hermes-format tool calls in a policy's text: the one parser of training and evaluation.

Training parses the text the policy generated (`longhaul.agentloop.loop`); evaluation parses what vLLM's hermes
parser hands back (`longhaul.clients.policy`). vLLM returns well-formed calls as `tool_calls` and, when any block
fails to parse, the whole text as `content` with no calls. Parsing that content here gives the turn training
gives for the same text, so the same generation moves the environment the same way in both (a training-only
success would otherwise never show in evaluation):

* a closed `<tool_call>…</tool_call>` block is a call; if it is not `{"name": ..., "arguments": {...}}` it is a
  call with `parse_error` set (an error observation; PRM-Lite counts it), never silently dropped;
* a trailing block with no `</tool_call>` (the turn ran out of tokens, or the model ended it early) is a call
  only when it parses whole — as vLLM reads it; otherwise it stays text, a message to the user.
"""

from __future__ import annotations

import json
import re

from longhaul.envs.protocols import ParsedCall

_CLOSED = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_OPEN_TAIL = re.compile(r"<tool_call>(?!.*</tool_call>)(.*)\Z", re.DOTALL)
_NAME = re.compile(r'"name"\s*:\s*"([^"]+)"')
UNPARSED = "<unparsed>"


def _call(raw: str) -> ParsedCall:
    """One block's call: parsed, or with `parse_error` saying why not."""
    m = _NAME.search(raw)
    name = m.group(1) if m else UNPARSED
    try:
        obj = json.loads(raw)
        name = obj["name"] if isinstance(obj, dict) and isinstance(obj.get("name"), str) else UNPARSED
        args = obj["arguments"] if isinstance(obj, dict) and "arguments" in obj else {}
        if isinstance(args, str):
            args = json.loads(args)
        if name == UNPARSED or not isinstance(args, dict):
            raise ValueError('expected {"name": string, "arguments": object}')
        return ParsedCall(name, args, json.dumps(args, ensure_ascii=False))
    except (ValueError, TypeError) as e:
        return ParsedCall(name, None, raw, parse_error=f"{type(e).__name__}: {e}")


def parse_hermes(text: str) -> tuple[str, list[ParsedCall]]:
    """Split a Hermes-format completion into the text around its tool calls and the calls (module docstring)."""
    if "<tool_call>" not in text:
        # Unchanged: evaluation re-renders this text into the next prompt, which must be the prompt of training.
        return text, []
    calls = [_call(block.strip()) for block in _CLOSED.findall(text)]
    rest = _CLOSED.sub("", text)
    tail = _OPEN_TAIL.search(rest)
    if tail:
        last = _call(tail.group(1).strip())
        if last.parse_error is None:
            calls.append(last)
            rest = rest[: tail.start()]
    return rest.strip(), calls
