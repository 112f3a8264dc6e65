"""Evaluated episodes as MLflow traces: what the agent said and called, browsable in MLflow's trace viewer.

One trace per episode (`build_episode_trace`, pure): the root span (type AGENT) is the episode — inputs the
customer's opening line, outputs the termination and the grade, attributes task id, trial, seed, subset,
checkpoint step, outcome, process score, termination; under it, in transcript order, one span per assistant
turn (LLM: the text, completion tokens, finish reason, the PRM-Lite rules that fired on the turn's calls) with
one TOOL span per call (arguments, result, error flag), and one span per user-simulator reply. All samples of a
task share an MLflow session (`mlflow.trace.session` = `<run>/step_<N>/task_<id>`), so they sit together; the
trace is linked to a run (`mlflow.sourceRun`: the checkpoint's eval run, or the training run when the eval run is
created later by the tracking relay) and tagged with the task, step and kind (`eval`). A sample of the training
episodes (`tracking.training_traces_per_step`, read back from the rollout traces when the grpo stage ends:
`read_training_steps`) is traced the same way, kind `train`, with the reward it trained with, linked to the
training run.

Timestamps. A trajectory keeps no per-turn clock, so spans get consecutive synthetic microseconds ending at the
time the trace is logged: the order is the transcript's, durations mean nothing.

Logging (`TraceLogger`) is asynchronous and bounded: episodes are handed to a queue of `capacity` traces and
written by one background thread; a full queue or a failing tracking server drops the trace (counted, never
raised), so evaluation never waits on MLflow. `close(timeout_s)` waits that long at most for what is queued and
counts the rest as dropped.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longhaul import bounded
from longhaul.layout import ROLLOUT_STEP_PREFIX, rollout_step_name, rollout_step_of
from longhaul.rewards.prm_lite import build_rule_params, score_trajectory

#: MLflow's trace metadata keys (`mlflow.tracing.constant.TraceMetadataKey`).
SOURCE_RUN = "mlflow.sourceRun"
SESSION = "mlflow.trace.session"
#: Trace tags longhaul sets (searchable in the UI: `tags.longhaul.task_id = '5'`).
TAG_TASK = "longhaul.task_id"
TAG_STEP = "longhaul.checkpoint_step"
TAG_OUTCOME = "longhaul.outcome"
TAG_KIND = "longhaul.trace_kind"
KIND_EVAL, KIND_TRAIN = "eval", "train"
#: How long a tool result or message may be inside a span (the full transcript stays in the results artefacts).
MAX_TEXT = 4000


def _clip(text: Any) -> Any:
    if isinstance(text, str) and len(text) > MAX_TEXT:
        return text[:MAX_TEXT] + f"… [{len(text) - MAX_TEXT} more characters]"
    return text


@dataclass(frozen=True)
class SpanSpec:
    """One span to write: MLflow span type, inputs, outputs, attributes and children (in order)."""

    name: str
    span_type: str
    inputs: Any = None
    outputs: Any = None
    attributes: Mapping[str, Any] = field(default_factory=dict)
    children: tuple[SpanSpec, ...] = ()

    def count(self) -> int:
        """Spans in this subtree."""
        return 1 + sum(c.count() for c in self.children)


@dataclass(frozen=True)
class EpisodeTrace:
    """A whole trace: its root span, trace tags and trace metadata (session, source run)."""

    root: SpanSpec
    tags: Mapping[str, str]
    metadata: Mapping[str, str]


def session_id(run_name: str, kind: str, step: int, task_id: str) -> str:
    """The MLflow session of every sample of one task at one step (`kind`: `eval` or `train`)."""
    return f"{run_name}/{kind}_step_{step}/task_{task_id}"


def build_episode_trace(
    traj: Mapping[str, Any],
    *,
    run_name: str,
    step: int,
    run_id: str,
    subset: str | None = None,
    rule_hits: Mapping[int, list[str]] | None = None,
    process: float | None = None,
    kind: str = KIND_EVAL,
    reward: float | None = None,
) -> EpisodeTrace:
    """The trace of one episode (module docstring) from its trajectory record (`Trajectory.to_dict()`).

    `rule_hits` maps a turn index to the PRM-Lite rules that fired on it; `process` is the episode's process
    score. Both are optional (an evaluation scores outcomes; the rules are what training would have added).
    `kind` says whether the episode was evaluated or trained on (a training episode also carries the `reward` it
    trained with)."""
    turns = list(traj.get("turns") or [])
    grade = traj.get("grade") or {}
    meta = traj.get("metadata") or {}
    task_id = str(traj["task_id"])
    scored = traj.get("termination") != "endpoint_error"
    outcome = (1.0 if grade.get("success") else 0.0) if scored else None
    first_user, children = _conversation_spans(traj, turns, rule_hits)
    attributes: dict[str, Any] = {
        "task_id": task_id,
        "trial": traj.get("trial"),
        "seed": traj.get("seed"),
        "subset": subset or "",
        "checkpoint_step": step,
        "termination": traj.get("termination"),
        "scored": scored,
        "outcome": outcome,
        "db_match": grade.get("db_match"),
        "communicated": grade.get("communicated"),
        "num_turns": len(turns),
        "num_tool_calls": traj.get("num_tool_calls", 0),
        "num_tool_errors": traj.get("num_tool_errors", 0),
    }
    if process is not None:
        attributes["process_score"] = process
    if reward is not None:
        attributes["reward"] = reward
    if not scored:
        attributes["endpoint_error"] = meta.get("endpoint_error") or ""
    root = SpanSpec(
        f"task {task_id} · trial {traj.get('trial')}",
        "AGENT",
        inputs={"task_id": task_id, "first_user_message": _clip(first_user)},
        outputs={
            "termination": traj.get("termination"),
            "outcome": outcome,
            **({"process_score": process} if process is not None else {}),
            **({"reward": reward} if reward is not None else {}),
        },
        attributes=attributes,
        children=tuple(children),
    )
    tags = {
        TAG_TASK: task_id,
        TAG_STEP: str(step),
        TAG_KIND: kind,
        TAG_OUTCOME: "unscored" if outcome is None else str(int(outcome)),
    }
    return EpisodeTrace(root, tags, {SESSION: session_id(run_name, kind, step, task_id), SOURCE_RUN: run_id})


def _turn_span(t: Mapping[str, Any], turn_index: int, rule_hits: Mapping[int, list[str]] | None) -> SpanSpec:
    """The span of one assistant turn, with a child span per tool call and the PRM-Lite rules that fired on it."""
    calls = tuple(
        SpanSpec(
            str(c.get("name")),
            "TOOL",
            inputs=c.get("arguments") if c.get("arguments") is not None else _clip(c.get("raw_arguments")),
            outputs=_clip(c.get("result")),
            attributes={
                "is_error": bool(c.get("is_error")),
                "known_tool": bool(c.get("known_tool", True)),
                "parse_error": c.get("parse_error") or "",
            },
        )
        for c in t.get("tool_calls") or []
    )
    attrs: dict[str, Any] = {
        "turn": turn_index,
        "completion_tokens": int(t.get("completion_tokens") or 0),
        "finish_reason": t.get("finish_reason") or "",
        "to_user": bool(t.get("to_user")),
    }
    if rule_hits is not None:
        attrs["prm_lite_rules"] = list(rule_hits.get(turn_index, []))
    return SpanSpec(
        f"assistant turn {turn_index}", "LLM", outputs=_clip(t.get("content")), attributes=attrs, children=calls
    )


def _conversation_spans(
    traj: Mapping[str, Any], turns: list[Any], rule_hits: Mapping[int, list[str]] | None
) -> tuple[str | None, list[SpanSpec]]:
    """(the user's first message, the spans of the conversation after it): the simulator's replies and the
    assistant's turns in order."""
    children: list[SpanSpec] = []
    turn_index = 0
    first_user: str | None = None
    for m in traj.get("messages") or []:
        role = m.get("role")
        if role == "user":
            if first_user is None:
                first_user = m.get("content")
                continue
            children.append(SpanSpec("user simulator", "CHAIN", outputs=_clip(m.get("content"))))
        elif role == "assistant" and turn_index < len(turns):
            children.append(_turn_span(turns[turn_index], turn_index, rule_hits))
            turn_index += 1
    return first_user, children


def read_training_steps(rollouts_dir: str | Path) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """(step, trace lines) of the trained episodes of every step under a run's rollout traces, step by step
    (`longhaul.agentloop.traces`: `step_<N>/<pid>.jsonl`; validation and failed trajectories are not read), each
    step's lines in (group uid, sample) order so nothing depends on which worker wrote first. One step is in memory
    at a time; files are read with the bounds of `longhaul.bounded.TRAJECTORIES`."""
    root = Path(rollouts_dir)
    if not root.is_dir():
        return
    steps = sorted(s for d in root.glob(f"{ROLLOUT_STEP_PREFIX}*") if (s := rollout_step_of(d.name)) is not None)
    for step in steps:
        lines = [
            rec
            for f in sorted((root / rollout_step_name(step)).glob("*.jsonl"))
            for _, rec in bounded.read_jsonl(f, bounded.TRAJECTORIES, expected="one rollout trace per line")
            if isinstance(rec, dict) and rec.get("trajectory")
        ]
        lines.sort(key=lambda r: (str(r.get("uid")), int(r.get("session") or 0)))
        yield step, lines


def prm_rule_hits(
    traj: Mapping[str, Any], rules: Any = None, seed_compat: bool = False
) -> tuple[dict[int, list[str]], float]:
    """PRM-Lite's rule hits per turn and the process score of a trajectory record (`longhaul.rewards.prm_lite`)."""
    result = score_trajectory(traj, build_rule_params(rules), seed_compat=seed_compat)
    hits: dict[int, list[str]] = {}
    for s in result.steps:
        hits.setdefault(s.turn, []).extend(h.rule for h in s.hits)
    if result.trajectory_hits and traj.get("turns"):
        hits.setdefault(len(traj["turns"]) - 1, []).extend(h.rule for h in result.trajectory_hits)
    return hits, result.process


# ---------------------------------------------------------------------------------------------------------
# Writing (I/O)


@dataclass
class TraceCounts:
    """What a `TraceLogger` did: traces written, and dropped (queue full, server error, not flushed in time)."""

    logged: int = 0
    dropped: int = 0
    errors: list[str] = field(default_factory=list)


class TraceLogger:
    """Writes `EpisodeTrace`s to an MLflow experiment from one background thread (module docstring)."""

    def __init__(self, tracking_uri: str, experiment_id: str, run_id: str, capacity: int = 1024) -> None:
        self.tracking_uri, self.experiment_id, self.run_id = tracking_uri, experiment_id, run_id
        self.counts = TraceCounts()
        self._written: list[str] = []
        self._closed = threading.Event()  # past close()'s deadline the writer stops: the rest is dropped
        self._queue: queue.Queue[EpisodeTrace | None] = queue.Queue(maxsize=capacity)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="longhaul-traces", daemon=True)
        self._thread.start()

    def submit(self, trace: EpisodeTrace) -> bool:
        """Queue a trace without waiting; False (and counted as dropped) when the queue is full."""
        try:
            self._queue.put_nowait(trace)
            return True
        except queue.Full:
            with self._lock:
                self.counts.dropped += 1
            return False

    def close(self, timeout_s: float = 60.0) -> TraceCounts:
        """Wait up to `timeout_s` for the queued traces; what is still queued then is counted as dropped."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._queue.put(None, timeout=max(0.0, deadline - time.monotonic()))
                break
            except queue.Full:
                break
        self._thread.join(max(0.0, deadline - time.monotonic()))
        self._closed.set()
        self._verify()
        with self._lock:
            while True:  # not written in time
                try:
                    if self._queue.get_nowait() is not None:
                        self.counts.dropped += 1
                except queue.Empty:
                    break
            return TraceCounts(self.counts.logged, self.counts.dropped, list(self.counts.errors))

    def _run(self) -> None:
        # deferred: mlflow (~1 s)
        import mlflow

        mlflow.set_tracking_uri(self.tracking_uri)  # the tracer exports to the process's tracking URI
        while (trace := self._queue.get()) is not None:
            if self._closed.is_set():
                with self._lock:
                    self.counts.dropped += 1
                continue
            try:
                trace_id = self._write(mlflow, trace)
                ok, err = True, None
            except Exception as exc:  # noqa: BLE001 - a tracking failure drops the trace, never the evaluation
                ok, err = False, f"{type(exc).__name__}: {exc}"
            with self._lock:
                if ok:
                    self._written.append(trace_id)
                else:
                    self.counts.dropped += 1
                    if len(self.counts.errors) < 5:
                        self.counts.errors.append(str(err)[:300])
        flush = getattr(mlflow, "flush_trace_async_logging", None)
        if flush is not None:
            flush()

    def _verify(self) -> None:
        """Count as logged only the written traces the store returns (MLflow's exporter reports its own failures
        in its log, not to the caller)."""
        with self._lock:
            written, self._written = self._written, []
        if not written:
            return
        try:
            # deferred: mlflow (~1 s)
            import mlflow

            found = {
                t.info.trace_id
                for t in mlflow.search_traces(locations=[self.experiment_id], run_id=self.run_id, return_type="list")
            }
        except Exception as exc:  # noqa: BLE001 - an unreachable store: nothing is known to be there
            found = set()
            self.counts.errors.append(f"verifying traces: {type(exc).__name__}: {str(exc)[:200]}")
        with self._lock:
            there = sum(1 for t in written if t in found)
            self.counts.logged += there
            self.counts.dropped += len(written) - there

    def _write(self, mlflow: Any, trace: EpisodeTrace) -> str:
        total = trace.root.count()
        clock = [time.time_ns() - total * 2000]

        def tick() -> int:
            clock[0] += 1000
            return clock[0]

        def write(spec: SpanSpec, parent: Any) -> str:
            kwargs: dict[str, Any] = {}
            if parent is None:  # trace-level settings go on the root span only
                kwargs.update(experiment_id=self.experiment_id, tags=dict(trace.tags), metadata=dict(trace.metadata))
            span = mlflow.start_span_no_context(
                spec.name,
                span_type=spec.span_type,
                parent_span=parent,
                inputs=spec.inputs,
                attributes=dict(spec.attributes),
                start_time_ns=tick(),
                **kwargs,
            )
            for child in spec.children:
                write(child, span)
            span.end(outputs=spec.outputs, end_time_ns=tick())
            return span.trace_id

        return write(trace.root, None)
