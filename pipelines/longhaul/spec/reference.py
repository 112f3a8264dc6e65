"""Markdown field reference generated from the Experiment models (pure); the README embeds it."""

from __future__ import annotations

import json
import types
import typing
from enum import Enum
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from longhaul.spec.models import Experiment


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not type(None)]
        return " \\| ".join(names) + (" \\| null" if type(None) in args else "")
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin is list:
        return f"list[{_type_name(args[0])}]" if args else "list"
    if origin is dict:
        return f"map[{_type_name(args[0])}, {_type_name(args[1])}]" if args else "map"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " \\| ".join(f"`{m.value}`" for m in annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "object"
    return getattr(annotation, "__name__", str(annotation))


def _default(info: Any) -> str:
    if info.default is not PydanticUndefined:
        value = info.default
    elif info.default_factory is not None:
        value = info.default_factory()
    else:
        return "required"
    if isinstance(value, BaseModel):
        return "see below"
    if isinstance(value, Enum):
        value = value.value
    return "`" + json.dumps(value, default=str) + "`"


def _submodel(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _submodel(arg)
        if found is not None:
            return found
    return None


def build_field_reference() -> str:
    """One table row per field of `spec`, depth-first, with type, default and description."""
    rows = ["| field | type | default | description |", "|---|---|---|---|"]

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, info in model.model_fields.items():
            path = f"{prefix}.{name}"
            desc = (info.description or "").replace("|", "\\|").replace("\n", " ")
            rows.append(f"| `{path}` | {_type_name(info.annotation)} | {_default(info)} | {desc} |")
            sub = _submodel(info.annotation)
            if sub is not None:
                walk(sub, path + ("[]" if typing.get_origin(info.annotation) is list else ""))

    walk(Experiment.model_fields["spec"].annotation, "spec")
    return "\n".join(rows) + "\n"
