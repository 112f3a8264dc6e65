"""Qwen3 thinking modes (`spec.policy.thinking`) on a tiny Qwen3-architecture model, from training to evaluation
to SFT (issue 18, item 3).

One scripted episode (τ² airline task 11: a read, a question to the user, the user's "yes", a write with text
before the call, a closing message) is played three times per mode, each time through the production code:

* training: longhaul's agent loop inside veRL 0.9.1 (veRL's Hydra config composed from the rendered overrides,
  veRL's instantiation of the rendered agent-loop entry, veRL's continuous-token builder for the model's
  `qwen3` family); only the LLM server is scripted — it returns the episode's completions as token ids;
* evaluation: the shared episode runner with longhaul's OpenAI client against a loopback server whose answers
  come from vLLM's own chat front end (`support.vllm_frontend`: vLLM's CLI parser fed the policy-server argv
  longhaul renders, vLLM's `OnlineRenderer` for the prompt and `OnlineDerenderer` + hermes parser for the
  answer), generating exactly the tokens the policy generated in training;
* SFT: Render-Twice-Diff (`longhaul.sft.masking`) over the evaluation transcript, as the SFT stage renders it.

Properties, for `disabled` and `keep`: (a) the training sequence is the prompt plus, turn by turn, exactly the
generated tokens (mask 1) and the context fed back (mask 0); (b) evaluation renders, at every turn, the very
tokens the policy was prompted with in training; (c) SFT labels are exactly the generated tokens of every turn
(think blocks included for keep; the empty think block of disabled is prompt, as in training) plus the newline
the template closes a turn with. The naive policy — Qwen3's own rendering, which strips earlier think blocks,
while training keeps them (`strip`) — fails: its re-rendered contexts do not extend what was generated and fed
back, evaluation sees other prompts than training, and SFT drops the conversation as a prefix mismatch.
Tool calls: vLLM's hermes parser (the one vLLM uses for Qwen3) and longhaul's training and evaluation parsers
read the same calls from completions with think blocks.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.verl

ROOT = Path(__file__).resolve().parents[3]
TASK = "11"
OPENING = "Hi, I need to change the flights of my reservation GV1N64."
REPLIES = ("Yes, please go ahead.", "Thanks, that is all. ###STOP###")


# ---------------------------------------------------------------------------------------------------------
# The scripted episode


def _call(name: str, args: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def completions(thinking: bool) -> list[str]:
    """The policy's four turns, as generated text (Qwen3's canonical layout), each ending with <|im_end|>."""
    from longhaul.envs.airline.tasks import get_task

    def think(text: str) -> str:
        return f"<think>\n{text}\n</think>\n\n" if thinking else ""

    write = get_task(TASK).actions[0]
    turns = [
        think("The user wants new flights. First I read the reservation.")
        + _call("get_reservation_details", {"reservation_id": "GV1N64"}),
        think("Basic economy; the policy wants an explicit confirmation before a write.")
        + "Your reservation GV1N64 can move to HAT003 and HAT290. Shall I proceed?",
        think("Confirmed. The write, with the arguments from the observation.")
        + "Changing it now.\n"
        + _call(write.name, dict(write.arguments)),
        think("Done. Tell the user.") + "All done, your confirmation is 5244.",
    ]
    return [t + "<|im_end|>" for t in turns]


class ScriptedUser:
    def __init__(self) -> None:
        self.calls = 0

    async def reply(self, task: Any, conversation: list[dict[str, str]]) -> str:
        self.calls += 1
        assert "<think>" not in json.dumps(conversation), "the user simulator saw the policy's think block"
        return OPENING if not conversation else REPLIES[min(self.calls - 2, len(REPLIES) - 1)]

    def with_seed(self, seed: int | None) -> ScriptedUser:
        return self


# ---------------------------------------------------------------------------------------------------------
# Fixtures: the tiny model, the specs, vLLM's front end


@pytest.fixture(scope="module")
def qwen3_dir() -> Path:
    from longhaul.tiny.build import DEFAULT_OUT_DIR
    from longhaul.tiny.qwen3 import ensure_tiny_qwen3

    return ensure_tiny_qwen3(ROOT / DEFAULT_OUT_DIR)


@pytest.fixture(scope="module")
def tok(qwen3_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen3_dir)


def tiny_spec(mode: str, qwen3_dir: Path) -> Any:
    """specs/smoke.yaml (CPU sizes) with the tiny Qwen3 policy; `strip` can only evaluate."""
    from longhaul.tiny.qwen3 import MODEL_NAME
    from support.specs import spec_variant

    changes: dict[str, Any] = {"policy__model": {"name": MODEL_NAME, "path": str(qwen3_dir)}, "policy__thinking": mode}
    if mode == "strip":
        changes["stages"] = ["eval"]
    return spec_variant("smoke", **changes)


@pytest.fixture(scope="module")
def frontend(qwen3_dir: Path):
    """vLLM's chat front end, one configuration per mode, from the policy-server argv longhaul renders."""
    from longhaul.render.plan import render_policy_server
    from support.vllm_frontend import VllmFrontends, vllm_python

    py = vllm_python()
    if py is None:
        pytest.skip("vLLM's interpreter not found; CI runs this test")
    fe = VllmFrontends(py)
    try:
        for mode in ("disabled", "keep", "strip"):
            argv = render_policy_server(tiny_spec(mode, qwen3_dir), model_dir=str(qwen3_dir)).argv
            assert argv[1:3] == ("-m", "vllm.entrypoints.openai.api_server")
            fe.add(mode, list(argv[3:]))
        yield fe
    finally:
        fe.close()


# ---------------------------------------------------------------------------------------------------------
# Training: the agent loop in veRL


@dataclass
class Generation:
    prompt_ids: list[int]
    token_ids: list[int]


@dataclass
class TrainingRun:
    generations: list[Generation]
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    outcome: float

    @property
    def sequence(self) -> list[int]:
        return self.prompt_ids + self.response_ids


class ScriptedServer:
    """veRL's LLM server manager, scripted: answers each generation with the next completion's token ids."""

    def __init__(self, tokenizer: Any, texts: list[str]) -> None:
        self.tokenizer, self.texts, self.generations = tokenizer, list(texts), []

    async def generate(self, *, request_id, prompt_ids, sampling_params, **_):
        from verl.workers.rollout.replica import TokenOutput

        ids = self.tokenizer.encode(self.texts.pop(0), add_special_tokens=False)
        self.generations.append(Generation(list(prompt_ids), ids))
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed", extra_fields={})


def train(overrides: list[str], exp: Any, qwen3_dir: Path, tmp: Path, texts: list[str]) -> TrainingRun:
    """One trajectory through the agent loop as veRL builds and runs it, for the composed `overrides`."""
    import hydra
    from omegaconf import OmegaConf
    from transformers import AutoConfig, AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap

    from longhaul.agentloop.config import render_agent_loop_yaml
    from longhaul.agentloop.loop import LonghaulAirlineAgentLoop
    from longhaul.layout import AGENT_LOOP_FILE
    from support.verl_config import compose_verl

    loop_file = tmp / "config" / AGENT_LOOP_FILE  # where the rendered overrides point (Paths.under(tmp))
    loop_file.parent.mkdir(parents=True, exist_ok=True)
    loop_file.write_text(render_agent_loop_yaml(exp))
    cfg = compose_verl(overrides)
    entry = next(
        e for e in OmegaConf.load(loop_file) if e.name == cfg.actor_rollout_ref.rollout.agent.default_agent_loop
    )
    tokenizer = AutoTokenizer.from_pretrained(qwen3_dir)
    if cfg.actor_rollout_ref.model.get("custom_chat_template") is not None:
        # what veRL's AgentLoopWorker does with model.custom_chat_template before it builds any agent loop
        tokenizer.chat_template = cfg.actor_rollout_ref.model.custom_chat_template
    server, user = ScriptedServer(tokenizer, texts), ScriptedUser()

    async def run() -> Any:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(LonghaulAirlineAgentLoop, "make_user_simulator", lambda self, row, seed=None: user)
            loop = hydra.utils.instantiate(
                config=entry,
                trainer_config=DictConfigWrap(config=cfg),
                server_manager=server,
                tokenizer=tokenizer,
                processor=None,
                hf_model_type=AutoConfig.from_pretrained(qwen3_dir).model_type,
                dataset_cls=None,
                data_config=DictConfigWrap(cfg.data),
                tools=ToolListWrap([]),
            )
            row = {"raw_prompt": [{"role": "user", "content": "unused"}], "extra_info": {"task_id": TASK}, "uid": "u0"}
            return await loop.run({"temperature": 1.0, "top_p": 1.0}, **row)

    out = asyncio.run(run())
    assert not server.texts, "the episode ended before every scripted turn was generated"
    return TrainingRun(
        server.generations,
        list(out.prompt_ids),
        list(out.response_ids),
        list(out.response_mask),
        out.extra_fields["reward_extra_info"]["outcome"],
    )


def _overrides(exp: Any, tmp: Path) -> list[str]:
    from longhaul.layout import Paths
    from longhaul.render.verl import render_verl_overrides

    return render_verl_overrides(exp, Paths.under(str(tmp)))


@pytest.fixture(scope="module")
def trained(qwen3_dir: Path, tmp_path_factory) -> dict[str, TrainingRun]:
    """Training runs: `disabled` and `keep` from their rendered specs; `strip` = what training a Qwen3 model with
    its own template looks like (the keep spec without longhaul's template and `preserve_thinking`)."""
    runs = {}
    for mode in ("disabled", "keep"):
        exp = tiny_spec(mode, qwen3_dir)
        tmp = tmp_path_factory.mktemp(mode)
        runs[mode] = train(_overrides(exp, tmp), exp, qwen3_dir, tmp, completions(mode == "keep"))
    exp = tiny_spec("keep", qwen3_dir)
    tmp = tmp_path_factory.mktemp("strip")
    naive = [o for o in _overrides(exp, tmp) if "custom_chat_template" not in o and "preserve_thinking" not in o]
    runs["strip"] = train(naive, exp, qwen3_dir, tmp, completions(True))
    return runs


# ---------------------------------------------------------------------------------------------------------
# Evaluation: the episode runner against vLLM's front end


@dataclass
class EvalRun:
    prompts: list[list[int]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    outcome: float = 0.0
    response_tokens: int | None = None


def evaluate(mode: str, exp: Any, fe: Any, generations: list[Generation]) -> EvalRun:
    from longhaul.clients.openai_compat import ChatClient
    from longhaul.clients.policy import OpenAIPolicy
    from longhaul.envs.airline.env import AirlineEnv
    from longhaul.envs.airline.tasks import get_task
    from longhaul.envs.limits import EpisodeLimits
    from longhaul.envs.runner import run_episode
    from support.openai_stub import StubServer

    result = EvalRun()

    def policy_script(body: dict[str, Any]) -> dict[str, Any]:
        prompt = fe.render(mode, body)
        gen = generations[len(result.prompts)].token_ids
        result.prompts.append(prompt)
        # the engine's text leaves the stop token out; its token count includes it
        message = fe.derender(mode, body, gen[:-1], prompt)
        return {
            "choices": [
                {"index": 0, "message": message, "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}
            ],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(gen)},
        }

    async def run() -> Any:
        with StubServer() as srv:
            srv.set_script("policy", policy_script)
            client = ChatClient(srv.base_url, "policy")
            return await run_episode(
                AirlineEnv, get_task(TASK), OpenAIPolicy(client), ScriptedUser(), EpisodeLimits.from_spec(exp)
            )

    traj = asyncio.run(run())
    result.messages, result.outcome = traj.messages, traj.outcome
    result.response_tokens = traj.metadata.get("response_tokens")
    return result


@pytest.fixture(scope="module")
def evaluated(frontend, trained, qwen3_dir: Path) -> dict[str, EvalRun]:
    return {
        mode: evaluate(mode, tiny_spec(mode, qwen3_dir), frontend, trained[mode].generations)
        for mode in ("disabled", "keep", "strip")
    }


# ---------------------------------------------------------------------------------------------------------
# (a) training sequence = generated tokens + fed-back context, turn by turn


@pytest.mark.parametrize("mode", ["disabled", "keep", "strip"])
def test_a_training_sequence_is_the_generated_tokens_fed_back_turn_by_turn(trained, tok, mode: str) -> None:
    run = trained[mode]
    gens = run.generations
    assert len(gens) == 4 and gens[0].prompt_ids == run.prompt_ids
    expected_mask = [0] * len(run.response_ids)
    for k, g in enumerate(gens):
        # the prompt of turn k+1 starts with the prompt of turn k and the tokens generated at turn k, verbatim
        nxt = gens[k + 1].prompt_ids if k + 1 < len(gens) else run.sequence
        assert nxt[: len(g.prompt_ids) + len(g.token_ids)] == g.prompt_ids + g.token_ids, f"turn {k}"
        start = len(g.prompt_ids) - len(run.prompt_ids)
        expected_mask[start : start + len(g.token_ids)] = [1] * len(g.token_ids)
    assert run.sequence == gens[-1].prompt_ids + gens[-1].token_ids
    assert run.response_mask == expected_mask  # loss exactly on what the policy generated
    opener = tok.encode(
        "<|im_start|>assistant\n" + ("<think>\n\n</think>\n\n" if mode == "disabled" else ""), add_special_tokens=False
    )
    for g in gens:
        assert g.prompt_ids[-len(opener) :] == opener  # disabled: the empty think block is prompt (mask 0)
    assert run.outcome == 1.0


def test_a_training_tokens_do_not_depend_on_how_the_template_renders_history(trained) -> None:
    """Token-in/token-out: veRL renders only the appended messages (in synthetic contexts), never earlier turns,
    so Qwen3's own stripping template and longhaul's preserving one train on identical tokens."""
    keep, naive = trained["keep"], trained["strip"]
    assert naive.sequence == keep.sequence and naive.response_mask == keep.response_mask


# ---------------------------------------------------------------------------------------------------------
# (b) evaluation renders the context the policy saw in training


@pytest.mark.parametrize("mode", ["disabled", "keep"])
def test_b_evaluation_prompts_are_the_training_prompts(evaluated, trained, mode: str) -> None:
    ev, run = evaluated[mode], trained[mode]
    assert [p for p in ev.prompts] == [g.prompt_ids for g in run.generations]
    for k, g in enumerate(run.generations[:-1]):  # re-rendering extends what was generated and fed back
        assert ev.prompts[k + 1][: len(g.prompt_ids) + len(g.token_ids)] == g.prompt_ids + g.token_ids
    assert ev.outcome == run.outcome == 1.0
    assert ev.response_tokens == len(run.response_ids)  # the response budget is spent alike


def test_strip_fails_a_and_b(evaluated, trained, tok) -> None:
    """Qwen3's own rendering drops earlier think blocks once the user has spoken again: the context re-rendered
    for the turn after the user's "yes" is not the previous context plus the tokens generated and fed back, and
    it is not what training prompted the policy with — nor is any later one."""
    ev, run = evaluated["strip"], trained["strip"]
    # identical while the first user request lasts (a tool call, its result, the question)…
    assert ev.prompts[:2] == [g.prompt_ids for g in run.generations[:2]]
    g = run.generations[1]
    assert ev.prompts[2][: len(g.prompt_ids) + len(g.token_ids)] != g.prompt_ids + g.token_ids  # …then (a) breaks
    for k in (2, 3):
        assert ev.prompts[k] != run.generations[k].prompt_ids  # and (b)
        seen_in_eval = tok.decode(ev.prompts[k], skip_special_tokens=False)
        seen_in_training = tok.decode(run.generations[k].prompt_ids, skip_special_tokens=False)
        for gone in ("First I read the reservation.", "explicit confirmation before a write."):
            assert gone in seen_in_training and gone not in seen_in_eval


# ---------------------------------------------------------------------------------------------------------
# (c) SFT masks


def _sft(mode: str, qwen3_dir: Path, tok: Any, messages: list[dict[str, Any]]) -> Any:
    from longhaul.chat.thinking import chat_template_kwargs, chat_template_override
    from longhaul.envs.prompt import tool_schemas
    from longhaul.sft.masking import build_supervised_example

    pol = tiny_spec(mode, qwen3_dir).spec.policy
    return build_supervised_example(
        tok,
        messages,
        tool_schemas(),
        max_length=100_000,
        chat_template=chat_template_override(pol),
        template_kwargs=chat_template_kwargs(pol),
    )


@pytest.mark.parametrize("mode", ["disabled", "keep"])
def test_c_sft_labels_are_exactly_the_generated_tokens(evaluated, trained, tok, qwen3_dir: Path, mode: str) -> None:
    from longhaul.sft.masking import IGNORE_INDEX, SupervisedExample

    run = trained[mode]
    ex = _sft(mode, qwen3_dir, tok, evaluated[mode].messages)
    assert isinstance(ex, SupervisedExample), ex
    newline = tok.encode("\n", add_special_tokens=False)
    assert ex.input_ids[: len(run.sequence)] == run.sequence  # the SFT sample is the training sequence…
    assert len(ex.spans) == len(run.generations)
    for (a, b), g in zip(ex.spans, run.generations, strict=True):
        # …and each label span is one turn's generated tokens plus the newline that closes the turn
        assert a == len(g.prompt_ids) and ex.input_ids[a:b] == g.token_ids + newline
    labelled = {i for a, b in ex.spans for i in range(a, b)}
    assert [i for i, lab in enumerate(ex.labels) if lab != IGNORE_INDEX] == sorted(labelled)
    text = "".join(tok.decode(ex.input_ids[a:b], skip_special_tokens=False) for a, b in ex.spans)
    if mode == "keep":
        assert text.count("<think>") == 4 and "First I read the reservation." in text
    else:
        assert "<think>" not in text  # the empty think block opened the turn: prompt, as in training


def test_c_strip_breaks_sft_masks(evaluated, tok, qwen3_dir: Path) -> None:
    from longhaul.sft.masking import Dropped, DropReason

    res = _sft("strip", qwen3_dir, tok, evaluated["strip"].messages)
    assert isinstance(res, Dropped) and res.reason == DropReason.PREFIX_MISMATCH, res


# ---------------------------------------------------------------------------------------------------------
# Tool calls: vLLM's hermes parser and longhaul's parsers agree


def _tool_request() -> dict[str, Any]:
    """A chat request offering the airline tools, for vLLM's front end to parse generated text against."""
    from longhaul.envs.prompt import tool_schemas

    return {
        "model": "policy",
        "messages": [{"role": "system", "content": "POLICY"}, {"role": "user", "content": "hi"}],
        "tools": tool_schemas(),
        "tool_choice": "auto",
    }


def test_tool_calls_parse_alike_in_vllm_and_in_training_and_evaluation(frontend, tok) -> None:
    """The policy server's hermes parser (vLLM's, configured from the rendered argv) and longhaul's training
    (`parse_hermes`) and evaluation (`parse_chat_response`) parsers read the same calls: after a think block,
    after text, and — without a reasoning parser, as longhaul serves Qwen3 — also a call written inside the think
    block (training and evaluation execute it alike; the visible text is what follows `</think>`)."""
    from longhaul.clients.policy import parse_chat_response
    from longhaul.envs.hermes import parse_hermes

    a = {"reservation_id": "GV1N64"}
    b = {"user_id": "mia_li_3668"}
    cases = {
        "after think": ("<think>\nread first\n</think>\n\n" + _call("get_reservation_details", a), [a]),
        "after text": ("Let me look.\n" + _call("get_reservation_details", a), [a]),
        "inside think": (
            "<think>\nmaybe "
            + _call("get_user_details", b)
            + " no, the reservation\n</think>\n\n"
            + _call("get_reservation_details", a),
            [b, a],
        ),
        "two calls": (
            "<think>\nboth\n</think>\n\n" + _call("get_user_details", b) + "\n" + _call("get_reservation_details", a),
            [b, a],
        ),
        "message": ("<think>\nno call\n</think>\n\nHow can I help?", []),
    }
    body = _tool_request()
    prompt = frontend.render("keep", body)
    for name, (text, expected) in cases.items():
        message = frontend.derender("keep", body, tok.encode(text, add_special_tokens=False), prompt)
        vllm_args = [json.loads(c["function"]["arguments"]) for c in message.get("tool_calls") or []]
        _, training = parse_hermes(text)
        evaluation = parse_chat_response({"choices": [{"message": message}]})
        assert vllm_args == expected, name
        assert [c.arguments for c in training] == expected, name
        assert [c.arguments for c in evaluation.tool_calls] == expected, name
        assert all(c.parse_error is None for c in (*training, *evaluation.tool_calls)), name


def test_broken_tool_calls_turn_alike_in_training_and_evaluation(frontend, tok) -> None:
    """Text that is not a clean call — cut off by the token limit, closed but not a call, unclosed but whole —
    gives the same turn in training (`parse_hermes` on the generated text) and in evaluation (vLLM's hermes
    parser, then `parse_chat_response` on what it hands back): the same message to the user, the same calls,
    the same parse errors. Before one parser served both, a cut-off call was a message to the user in training
    and an error call in evaluation, so episodes the simulator ended after such a message succeeded only in
    training."""
    from longhaul.clients.policy import parse_chat_response
    from longhaul.envs.hermes import parse_hermes

    a = {"reservation_id": "GV1N64"}
    cut = '<tool_call>\n{"name": "get_reservation_details", "arguments": {"reservation_id": "GV1'
    cases = {
        # (text, expected (name, arguments, has parse error) per call, expected message text is non-empty)
        "cut off": ("Let me look.\n" + cut, [], True),
        "call, then cut off": (
            _call("get_reservation_details", a) + "\n" + cut,
            [("get_reservation_details", a, False)],
            True,
        ),
        "closed, not a call": (
            '<tool_call>\n{"name": "get_reservation_details", "arguments": [1]}\n</tool_call>',
            [("get_reservation_details", None, True)],
            False,
        ),
        "unclosed, whole": (
            _call("get_reservation_details", a).removesuffix("</tool_call>"),
            [("get_reservation_details", a, False)],
            False,
        ),
    }
    body = _tool_request()
    prompt = frontend.render("keep", body)

    def turn(content: str, calls: list) -> tuple:
        return content, [(c.name, c.arguments, c.parse_error is not None) for c in calls]

    for name, (text, expected_calls, says_something) in cases.items():
        message = frontend.derender("keep", body, tok.encode(text, add_special_tokens=False), prompt)
        evaluation = parse_chat_response({"choices": [{"message": message}]})
        training = turn(*parse_hermes(text))
        assert turn(evaluation.content, evaluation.tool_calls) == training, name
        assert training[1] == expected_calls, name
        assert bool(training[0]) == says_something, name
