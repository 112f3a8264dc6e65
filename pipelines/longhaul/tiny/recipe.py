"""The tiny build's recipe, run in a child process with deterministic arithmetic (`longhaul.tiny.arithmetic`):
tokenizer, both models, their warm starts and held-out checks, written into a build directory.

    python -m longhaul.tiny.recipe BUILD_DIR     (BUILD_DIR/config.json in; tiny-policy/, tiny-user/, report.json out)

`longhaul.tiny.build.ensure_tiny_models` is the only caller: it owns the cache, the lock and the criteria.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from longhaul.sft.masking import build_supervised_dataset
from longhaul.tiny.arithmetic import arithmetic_facts
from longhaul.tiny.checks import GREEDY_CRITERION, check_policy, check_user, criteria
from longhaul.tiny.gate import Gate, Measurement
from longhaul.tiny.inputs import build_inputs, default_date_line
from longhaul.tiny.models import POLICY_ARCH, USER_ARCH, build_model
from longhaul.tiny.tokenizer import ENDOFTEXT, IM_END, build_hf_tokenizer
from longhaul.tiny.warmstart import warm_start

CONFIG_FILE = "config.json"
REPORT_FILE = "report.json"


def _warm_start(
    model: Any,
    examples: list,
    *,
    steps: int,
    seed: int,
    lr: float,
    log: Callable[[str], None],
    stop_after: Callable[[int], bool] | None = None,
) -> Any:

    t = time.perf_counter()

    def progress(step: int, loss: float) -> None:
        if step % 50 == 0 or step == steps - 1:
            log(f"  step {step:4d}  loss {loss:.3f}  ({time.perf_counter() - t:.0f}s)")

    return warm_start(
        model, examples, steps=steps, seed=seed, learning_rate=lr, on_step=progress, stop_after=stop_after
    )


def _policy_measure(
    policy: Any, tokenizer: Any, inputs: dict[str, Any], prompts: int, step0: Callable[[], dict[str, Any]] | None
) -> Callable[[], Measurement]:
    """The policy's checks for its gate, cheapest first, each only when those before it meet their criteria: the
    decision probabilities (forward passes only), the greedy first turns (generation), then the demo's step-0
    estimate (`step0`: whole episodes with the simulator)."""

    def measure() -> Measurement:
        quick = check_policy(policy, tokenizer, inputs, prompts=0)
        judged = [c for c in criteria(quick, {}) if c.name != GREEDY_CRITERION]
        if not prompts or not all(c.met for c in judged):
            return quick, judged
        found = check_policy(policy, tokenizer, inputs, prompts=prompts)
        judged = criteria(found, {})
        if step0 is None or not all(c.met for c in judged):
            return found, judged
        found["step0"] = step0()
        return found, criteria(found, {})

    return measure


def _step0_estimator(config: dict[str, Any], policy: Any, user: Any, tokenizer: Any) -> Callable[[], dict] | None:
    """The demo's step-0 estimate on the current weights (`longhaul.tiny.local_chat`), or None without a spec."""
    text = config.get("step0_spec_text")
    if not text:
        return None
    # deferred: the spec's models and the evaluation's clients (~1 s), only for a gated build
    from longhaul.spec import parse_spec_text
    from longhaul.tiny.local_chat import LocalChat, step0_estimate

    spec = parse_spec_text(text, file=config["step0_spec"])
    agent, customer = LocalChat(policy, tokenizer, "policy", "warm start"), LocalChat(user, tokenizer, "user", "build")
    return lambda: step0_estimate(spec, agent, customer)


def build_into(build_dir: Path, config: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
    """Run the recipe with `config` (a `TinyBuildConfig` as a dict); save both models under `build_dir`; return the
    report's measured fields (timings, warm starts, checks, arithmetic)."""
    # deferred: torch (~1 s), in the build's child process only
    import torch

    torch.set_num_threads(config["threads"])
    report: dict[str, Any] = {"timings_s": {}, "arithmetic": arithmetic_facts()}
    timings = report["timings_s"]
    t = time.perf_counter()
    inputs = build_inputs(config["date_line"] or default_date_line())
    tokenizer = build_hf_tokenizer(inputs["corpus"], config["vocab_size"])
    timings["tokenizer"] = round(time.perf_counter() - t, 2)
    report["vocab_size"] = vocab = len(tokenizer)
    padded_vocab = (vocab + 63) // 64 * 64
    eos, pad = tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    system_text = tokenizer.apply_chat_template(inputs["held_prompts"][0][:1], tools=inputs["tools"], tokenize=False)
    report["system_prompt_tokens"] = len(tokenizer(system_text, add_special_tokens=False)["input_ids"])
    log(f"tokenizer: {vocab} tokens; system prompt (policy + tools) = {report['system_prompt_tokens']} tokens")
    seed = config["seed"]
    policy = build_model(POLICY_ARCH, vocab_size=padded_vocab, eos_token_id=eos, pad_token_id=pad, seed=seed)
    user = build_model(USER_ARCH, vocab_size=padded_vocab, eos_token_id=eos, pad_token_id=pad, seed=seed + 1)

    # (report key, label, model, conversations, tools, steps, learning rate, seed) of each warm start.
    policy_run = ("warmstart", "policy", policy, inputs["conversations"], inputs["tools"], config["steps"])
    user_run = ("user_warmstart", "user simulator", user, inputs["user_conversations"], None, config["user_steps"])
    user_checks = inputs["user_checks"][: config["check_user_tasks"]]
    stop = config["stop_on_criteria"]
    step0 = _step0_estimator(config, policy, user, tokenizer)
    policy_gate = Gate(
        policy,
        _policy_measure(policy, tokenizer, inputs, config["check_prompts"], step0),
        config["check_every"] if config["check_prompts"] else 0,
        config["check_from"],
        stop,
        log,
    )
    user_gate = Gate(
        user,
        lambda: (found := check_user(user, tokenizer, user_checks), criteria({}, found)),
        config["user_check_every"] if user_checks else 0,
        config["user_check_from"],
        stop,
        log,
    )
    # The simulator first: the policy's step-0 estimate talks to it. (Each warm start seeds its own stream, so the
    # order changes neither model.)
    for (role, label, model, conversations, tools, steps), lr, role_seed, gate in (
        (user_run, config["user_learning_rate"], seed + 1, user_gate),
        (policy_run, config["learning_rate"], seed, policy_gate),
    ):
        examples, _, stats = build_supervised_dataset(
            tokenizer, [(c, tools) for c in conversations], max_length=config["max_length"]
        )
        log(
            f"{label} warm start: {stats.kept} conversations ({stats.label_tokens} label tokens; "
            f"dropped {dict(stats.dropped)}), {steps} steps"
        )
        t = time.perf_counter()
        result = _warm_start(model, examples, steps=steps, seed=role_seed, lr=lr, log=log, stop_after=gate)
        timings[role] = round(time.perf_counter() - t, 2)
        model.eval()  # measured and served from here on
        report[role] = {
            **asdict(result),
            "examples": stats.kept,
            "dropped": dict(stats.dropped),
            "label_tokens": stats.label_tokens,
            "checks": gate.history,
        }
    report["warmstart"]["train_task_ids"] = inputs["train_task_ids"]

    # The final findings: those of the check training stopped on, else measured now (the same weights either way).
    t = time.perf_counter()
    prompts = config["check_prompts"]
    found = policy_gate.findings_at(report["warmstart"]["steps"])
    if found is None or found["greedy"]["prompts"] != min(prompts, len(inputs["held_prompts"])):
        found = check_policy(policy, tokenizer, inputs, prompts=prompts) if prompts else {}
    if found and step0 is not None and "step0" not in found:  # training ran out before every check was met
        found["step0"] = step0()
    report["tool_calls"] = found
    found = user_gate.findings_at(report["user_warmstart"]["steps"])
    if found is None:
        found = check_user(user, tokenizer, user_checks) if user_checks else {}
    report["user_check"] = found
    timings["checks"] = round(time.perf_counter() - t, 2)

    for name, model in (("tiny-policy", policy), ("tiny-user", user)):
        model.generation_config.eos_token_id = eos
        model.generation_config.pad_token_id = pad
        model.save_pretrained(build_dir / name)
        tokenizer.save_pretrained(build_dir / name)
    return report


def main(argv: list[str]) -> int:
    """Entry point of the child process: BUILD_DIR holds config.json; writes report.json there."""
    # deferred: transformers (~1 s)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    build_dir = Path(argv[0])
    config = json.loads((build_dir / CONFIG_FILE).read_text(encoding="utf-8"))

    def log(msg: str) -> None:
        print(msg, flush=True)

    report = build_into(build_dir, config, log)
    (build_dir / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":  # pragma: no cover - run by ensure_tiny_models
    sys.exit(main(sys.argv[1:]))
