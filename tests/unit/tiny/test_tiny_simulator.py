"""The tiny user simulator's warm-start conversations are the served simulator's prompt (`build_user_messages`),
labelled on the simulator's lines only, built from training tasks only; after the build, the simulator opens
held-out tasks with a request and stops after the agent's closing message."""

from __future__ import annotations

import random

import pytest

from longhaul.clients.user_simulator import AGENT_GREETING, USER_GUIDELINES, build_user_messages
from longhaul.envs.airline.tasks import get_task
from longhaul.tiny.gold import closing_message, first_user_message
from longhaul.tiny.simulator import (
    NO_RESERVATION_ANSWER,
    TRANSFER_MESSAGE,
    USER_STOP,
    USER_TRANSFER,
    judge_simulator_replies,
    simulator_check_prompts,
    simulator_conversations,
    simulator_dialogues,
    user_facts,
)


def _held_out_ids() -> list[str]:
    from longhaul.envs.airline.splits import build_split

    return sorted(set(build_split("seed_40_10").test) | set(build_split("tau2_official").test), key=int)


def test_conversations_are_exactly_the_served_simulator_prompt():
    task = get_task("0")
    instr = task.user_instructions()
    convs = simulator_conversations(task.raw, instr, random.Random(3))
    dialogues = simulator_dialogues(task.raw, instr, random.Random(3))
    assert len(convs) == 3
    for conv, dialogue in zip(convs, dialogues, strict=True):
        assert conv == build_user_messages(instr, dialogue)
        assert conv[0] == {"role": "system", "content": USER_GUIDELINES.format(scenario=instr.strip())}
        assert conv[1] == {"role": "user", "content": AGENT_GREETING}
        # Roles flipped: the simulator writes the assistant side, turns alternate, and it speaks first and last.
        assert [m["role"] for m in conv[1:]] == ["user", "assistant"] * ((len(conv) - 1) // 2)
        assert conv[2]["content"] == first_user_message(task.raw)
    (stop, asked, transfer) = convs
    assert stop[-2:] == [
        {"role": "user", "content": closing_message(task.raw)},
        {"role": "assistant", "content": USER_STOP},
    ]
    assert asked[-1]["content"] == USER_STOP and "My user id is emma_kim_9957." in [m["content"] for m in asked]
    assert "The reservation id is EHGLP3." in [m["content"] for m in asked]
    assert transfer[-2:] == [
        {"role": "user", "content": TRANSFER_MESSAGE},
        {"role": "assistant", "content": USER_TRANSFER},
    ]


def test_end_markers_and_the_transfer_message_are_the_runners_and_the_policys():
    from longhaul.envs.airline.tasks import policy_text
    from longhaul.envs.prompt import STOP_MARKERS

    assert (USER_STOP, USER_TRANSFER) == ("###STOP###", "###TRANSFER###") and {USER_STOP, USER_TRANSFER} <= set(
        STOP_MARKERS
    )
    assert TRANSFER_MESSAGE in policy_text()


def test_facts_come_from_the_instructions_and_are_never_invented():
    assert user_facts(get_task("9").user_instructions()) == ("aarav_ahmed_6699", ["IFOYYZ", "NQNU5R", "M20IZO"])
    assert user_facts(get_task("5").user_instructions()) == ("mei_brown_7075", [])  # HAT045 is a flight number
    task = get_task("1")
    lines = [m["content"] for m in simulator_dialogues(task.raw, task.user_instructions(), random.Random(0))[1]]
    assert NO_RESERVATION_ANSWER in lines and "My user id is raj_sanchez_7340." in lines


def test_labels_cover_the_simulators_lines_only():
    from longhaul.sft.masking import IGNORE_INDEX, build_supervised_dataset
    from longhaul.tiny.tokenizer import IM_END, build_hf_tokenizer

    task = get_task("0")
    convs = simulator_conversations(task.raw, task.user_instructions(), random.Random(0))
    corpus = [m["content"] for c in convs for m in c] * 5
    tok = build_hf_tokenizer(corpus, vocab_size=800)
    examples, dropped, _ = build_supervised_dataset(tok, [(c, None) for c in convs], max_length=8192)
    assert not dropped and len(examples) == len(convs)
    for ex, conv in zip(examples, convs, strict=True):
        simulator_lines = [m["content"] for m in conv if m["role"] == "assistant"]
        assert [tok.decode(ex.input_ids[a:b]) for a, b in ex.spans] == [f"{s}{IM_END}\n" for s in simulator_lines]
        inside = {i for a, b in ex.spans for i in range(a, b)}
        assert all((lab == IGNORE_INDEX) == (i not in inside) for i, lab in enumerate(ex.labels))
        assert tok.decode(ex.input_ids[slice(*ex.spans[-1])]).startswith(("###STOP###", "###TRANSFER###"))


def test_check_prompts_and_judgement():
    task = get_task("3")
    instr = task.user_instructions()
    prompts = simulator_check_prompts(task.raw, instr)
    assert prompts["opening"] == build_user_messages(instr, [])
    assert prompts["after_closing"][-1] == {"role": "user", "content": closing_message(task.raw)}
    good = {"opening": "I want to book a flight.", "after_closing": USER_STOP, "after_transfer": USER_TRANSFER}
    verdict = judge_simulator_replies({**good, "user_id": "It is anya_garcia_5901."}, "anya_garcia_5901")
    assert all(verdict.values())
    bad = {"opening": "###STOP###", "after_closing": "thanks", "after_transfer": "ok", "user_id": "no idea"}
    assert not any(judge_simulator_replies(bad, "anya_garcia_5901").values())
    assert not judge_simulator_replies({**good, "opening": "  "}, None)["request_first"]


def test_the_simulator_learns_from_training_tasks_only():
    from longhaul.tiny.inputs import build_inputs, default_date_line

    inputs = build_inputs(default_date_line())
    held = _held_out_ids()
    scenarios = {c[0]["content"] for c in inputs["user_conversations"]}
    held_scenarios = {build_user_messages(get_task(t).user_instructions(), [])[0]["content"] for t in held}
    train_scenarios = {
        build_user_messages(get_task(t).user_instructions(), [])[0]["content"] for t in inputs["train_task_ids"]
    }
    assert scenarios == train_scenarios and not scenarios & held_scenarios
    assert [tid for tid, _, _ in inputs["user_checks"]] == held


@pytest.mark.slow
def test_built_simulator_requests_first_and_stops_after_the_closing_message():
    """The project's own build (the one every pipeline test serves: built once per machine, before the tests in
    CI); greedy replies from the saved simulator on every held-out task, prompted through `build_user_messages`
    itself — independent of the build's own criteria, which judge the same behaviour its own way."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from longhaul.tiny.build import TinyBuildConfig, ensure_tiny_models

    report = ensure_tiny_models(log=lambda _: None)
    # Its warm start stopped at its first check that met the criteria, at most at the configured steps.
    assert report.user_check["stop_rate"] >= 0.7 and report.user_warmstart["steps"] <= TinyBuildConfig().user_steps
    assert report.user_warmstart["checks"][-1]["steps"] == report.user_warmstart["steps"]

    tok = AutoTokenizer.from_pretrained(report.user_dir)
    model = AutoModelForCausalLM.from_pretrained(report.user_dir).eval()

    def reply(messages: list[dict[str, str]]) -> str:
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=tok.pad_token_id)
        return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)

    held = _held_out_ids()
    stops = requests = 0
    for tid in held:
        task = get_task(tid)
        instr = task.user_instructions()
        first = reply(build_user_messages(instr, []))
        requests += bool(first.strip()) and "###" not in first
        done = [
            {"role": "user", "content": first_user_message(task.raw)},
            {"role": "assistant", "content": closing_message(task.raw)},
        ]
        stops += USER_STOP in reply(build_user_messages(instr, done))
    assert requests == len(held), f"{requests}/{len(held)} held-out first turns are requests"
    assert stops >= 0.7 * len(held), f"{stops}/{len(held)} held-out replies to the closing message stop"
