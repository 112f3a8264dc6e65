"""Parse Experiment YAML safely and report every problem at once, with file, line, field path and a hint.

`build_experiment` / `parse_spec_text` are pure (text in, model or `SpecError` out); `load_spec` adds the
file read. Input is bounded (`longhaul.bounded.SPEC`: file size, nodes, nesting; anchors and aliases refused)
and checked while the YAML is composed, before any Python object is built; YAML is composed with the safe
loader (no arbitrary tags); duplicate keys are errors.
"""

from __future__ import annotations

import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from longhaul import bounded
from longhaul.bounded import InputError, dotted_path
from longhaul.constants import ANNOTATION_SEED_GROUP
from longhaul.redact import redact_value
from longhaul.spec.base import FieldError
from longhaul.spec.hints import number_problem, strip_union_tags
from longhaul.spec.models import Experiment
from longhaul.spec.naming import seed_group_problem


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec."""

    file: str
    line: int | None
    path: str
    message: str
    value: Any = None
    hint: str | None = None

    def render(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        field_ = f" {self.path}" if self.path else ""
        text = f"{where}{field_}: {self.message}"
        if self.value is not None and not isinstance(self.value, dict | list):
            text += f" (got {redact_value(self.value)!r})"  # a refused URL may hold the credential it is refused for
        if self.hint:
            text += f"; {self.hint}"
        return text


@dataclass
class SpecError(Exception):
    """All problems found in one or more spec files."""

    problems: list[Problem] = field(default_factory=list)

    def __str__(self) -> str:
        return "\n".join(p.render() for p in self.problems)


# ---------------------------------------------------------------------------------------------------------
# YAML with positions


class _Located:
    """Maps dotted paths of a YAML document to line numbers (1-based)."""

    def __init__(self) -> None:
        self.lines: dict[tuple[Any, ...], int] = {}
        self.duplicates: list[tuple[tuple[Any, ...], int]] = []

    def line_for(self, loc: tuple[Any, ...]) -> int | None:
        loc = tuple(loc)
        while loc:
            if loc in self.lines:
                return self.lines[loc]
            loc = loc[:-1]
        return self.lines.get((), None)


_COLLECTION_TAGS = {"tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"}


def _walk(node: yaml.Node, loc: tuple[Any, ...], located: _Located) -> Any:
    located.lines.setdefault(loc, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode | yaml.SequenceNode) and node.tag not in _COLLECTION_TAGS:
        raise yaml.constructor.ConstructorError(None, None, f"tag {node.tag!r} is not allowed", node.start_mark)
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = yaml.SafeLoader.construct_scalar(_LOADER, key_node) if isinstance(key_node, yaml.ScalarNode) else None
            if key is None or isinstance(key_node, yaml.MappingNode | yaml.SequenceNode):
                raise yaml.YAMLError(f"line {key_node.start_mark.line + 1}: mapping keys must be plain strings")
            if key in out:
                located.duplicates.append((loc + (key,), key_node.start_mark.line + 1))
            located.lines[loc + (key,)] = key_node.start_mark.line + 1
            out[key] = _walk(value_node, loc + (key,), located)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_walk(item, loc + (i,), located) for i, item in enumerate(node.value)]
    try:
        return _LOADER.construct_object(node, deep=True)
    except ValueError as exc:  # e.g. an integer past Python's 4,300-digit conversion limit
        raise _BadScalar(loc, node.start_mark.line + 1, node.tag.rsplit(":", 1)[-1], str(exc).split(":")[0]) from None


class _BadScalar(Exception):
    def __init__(self, loc: tuple[Any, ...], line: int, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.loc, self.line, self.kind, self.reason = loc, line, kind, reason


_LOADER = yaml.SafeLoader("")


def _problem(exc: InputError) -> Problem:
    return Problem(exc.file, exc.line, exc.path, exc.message, exc.value, exc.hint)


def _compose(text: str, file: str) -> tuple[Any, _Located]:
    located = _Located()
    try:
        node = bounded.compose_yaml(text, file, bounded.SPEC)
    except InputError as exc:
        raise SpecError([_problem(exc)]) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = mark.line + 1 if mark else None
        raise SpecError(
            [Problem(file, line, "", f"invalid YAML: {exc.problem}", hint="check indentation and quoting")]
        ) from None
    except yaml.YAMLError as exc:
        raise SpecError([Problem(file, None, "", f"invalid YAML: {exc}")]) from None
    if node is None:
        raise SpecError([Problem(file, 1, "", "empty document", hint="start from one of the files in specs/")])
    try:
        data = _walk(node, (), located)
    except yaml.constructor.ConstructorError as exc:
        mark = exc.problem_mark
        raise SpecError(
            [
                Problem(
                    file,
                    mark.line + 1 if mark else None,
                    "",
                    f"unsupported YAML: {exc.problem}",
                    hint="tags such as !!python/... are not allowed",
                )
            ]
        ) from None
    except _BadScalar as exc:
        raise SpecError(
            [
                Problem(
                    file,
                    exc.line,
                    _dotted(exc.loc),
                    f"value cannot be read as {exc.kind} ({exc.reason})",
                    hint="quote it to make it a string, or shorten it",
                )
            ]
        ) from None
    except yaml.YAMLError as exc:
        raise SpecError([Problem(file, None, "", f"invalid YAML: {exc}")]) from None
    return data, located


# ---------------------------------------------------------------------------------------------------------
# Pydantic errors -> problems


_dotted = dotted_path


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model class that owns the mapping at `loc` (for did-you-mean on unknown keys)."""
    model: Any = Experiment
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        info = model.model_fields.get(part)
        if info is None:
            return None
        model = _unwrap_model(info.annotation)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unwrap_model(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, list):
        for arg in typing.get_args(annotation):
            found = _unwrap_model(arg)
            if isinstance(found, type) and issubclass(found, BaseModel):
                return found
        return None
    if origin is typing.Annotated:
        return _unwrap_model(typing.get_args(annotation)[0])
    return annotation


def _problems_from_validation(
    exc: ValidationError, file: str, located: _Located, data_for_values: Any = None
) -> list[Problem]:
    problems: list[Problem] = []
    for err in exc.errors(include_url=False):
        loc = strip_union_tags(tuple(err["loc"]), data_for_values)
        kind = err["type"]
        msg = err["msg"]
        hint = None
        value = err.get("input")
        if kind == "extra_forbidden":
            key = loc[-1]
            owner = _model_at(loc[:-1])
            valid = list(owner.model_fields) if owner else []
            close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.6)
            msg = f"unknown field '{key}'"
            hint = (f"did you mean '{close[0]}'? " if close else "") + (f"valid: {', '.join(valid)}" if valid else "")
            value = None
        elif kind in ("enum", "literal_error"):
            expected = err.get("ctx", {}).get("expected", "")
            choices = [c.strip().strip("'\"") for c in expected.replace(" or ", ",").split(",") if c.strip()]
            close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.5)
            msg = f"invalid value; valid: {', '.join(choices)}"
            hint = f"did you mean '{close[0]}'?" if close else None
        elif kind == "missing":
            msg = "required field is missing"
            value = None
        elif (number := number_problem(kind, loc)) is not None:
            msg, hint = number
        elif kind == "string_pattern_mismatch":
            msg = "contains characters or a form that is not allowed"
            hint = f"must match {err.get('ctx', {}).get('pattern')}"
        elif kind == "value_error":
            msg = msg.removeprefix("Value error, ")
            cause = err.get("ctx", {}).get("error")
            if isinstance(cause, FieldError):
                loc = loc + tuple(int(x) if x.isdigit() else x for x in cause.field.split("."))
                value = _lookup(data_for_values, loc)
            if isinstance(value, dict | list):
                value = None
        problems.append(Problem(file, located.line_for(loc), _dotted(loc), msg, value, hint))
    return problems


def _lookup(data: Any, loc: tuple[Any, ...]) -> Any:
    for part in loc:
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            return None
    return data


def build_experiment(data: Any, file: str = "<spec>", located: _Located | None = None) -> Experiment:
    """Validate a parsed document; raise `SpecError` with every problem found."""
    located = located or _Located()
    try:
        bounded.check_data(data, file, bounded.SPEC)
    except InputError as exc:
        raise SpecError([_problem(exc)]) from None
    problems = [
        Problem(file, line, _dotted(loc), "duplicate key", hint="each key may appear once")
        for loc, line in located.duplicates
    ]
    if not isinstance(data, dict):
        raise SpecError([*problems, Problem(file, 1, "", "the document must be a mapping (an Experiment resource)")])
    try:
        exp = Experiment.model_validate(data)
    except ValidationError as exc:
        problems.extend(_problems_from_validation(exc, file, located, data))
        raise SpecError(_dedupe(problems)) from None
    group_problem = seed_group_problem(exp)
    if group_problem:
        loc = ("metadata", "annotations", ANNOTATION_SEED_GROUP)
        problems.append(Problem(file, located.line_for(loc), _dotted(loc), group_problem))
    if problems:
        raise SpecError(problems)
    return exp


def _dedupe(problems: list[Problem]) -> list[Problem]:
    seen: set[tuple[str, str]] = set()
    out = []
    for p in problems:
        key = (p.path, p.message)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def parse_spec_text(text: str, file: str = "<spec>") -> Experiment:
    """Parse one YAML document into an `Experiment` (pure); the input is bounded by `longhaul.bounded.SPEC`."""
    data, located = _compose(text, file)
    return build_experiment(data, file, located)


def load_spec(path: str | Path) -> Experiment:
    """Read and validate a spec file; raises `SpecError` naming the file. Reads at most `bounded.SPEC.max_bytes`."""
    try:
        text = bounded.read_text(path, bounded.SPEC)
    except InputError as exc:
        raise SpecError([_problem(exc)]) from None
    except FileNotFoundError:
        raise SpecError([Problem(str(path), None, "", "file not found")]) from None
    except OSError as exc:
        raise SpecError([Problem(str(path), None, "", f"cannot read: {exc}")]) from None
    return parse_spec_text(text, str(path))


def load_specs(paths: list[str | Path]) -> list[Experiment]:
    """Validate several files; raise one `SpecError` with the problems of all of them."""
    problems: list[Problem] = []
    out: list[Experiment] = []
    for path in paths:
        try:
            out.append(load_spec(path))
        except SpecError as exc:
            problems.extend(exc.problems)
    if problems:
        raise SpecError(problems)
    return out
