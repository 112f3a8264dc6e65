"""A tiny Qwen3-architecture policy with a Qwen3-style tokenizer and chat template, for the thinking-mode tests.

`Qwen3ForCausalLM` (explicit head_dim, q/k norms, `model_type: qwen3`), random weights — no warm start: the tests
that use it script the generated text and check how it is rendered, fed back, masked and parsed. The tokenizer is
the tiny BPE (Qwen's pre-tokenizer) plus `<think>` / `</think>` as single, non-special tokens, as in Qwen3's own
tokenizer; its chat template is longhaul's Qwen3-style one (`longhaul/chat/qwen3.jinja`), whose default rendering
is Qwen3's. Built in seconds, deterministically, and cached under a content key like the other tiny models:

  <out_dir>/tiny-qwen3-policy/   config.json, model.safetensors, tokenizer files, longhaul-tiny.json (the key)
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from longhaul.chat.thinking import load_qwen3_template
from longhaul.envs.airline.tasks import policy_text
from longhaul.envs.prompt import tool_schemas
from longhaul.tiny.models import POLICY_ARCH, build_model
from longhaul.tiny.tokenizer import ENDOFTEXT, IM_END, MARKUP_TOKENS, THINK_TOKENS, build_hf_tokenizer

#: Bump when the recipe changes in a way the key cannot see.
RECIPE_VERSION = 1
DIRNAME = "tiny-qwen3-policy"
#: The model name specs use for it (matched as a Qwen3 hybrid-thinking policy, `longhaul.spec.policy.model_thinks`).
MODEL_NAME = "longhaul/tiny-qwen3-policy"
VOCAB_SIZE = 2048
SEED = 11
KEY_FILE = "longhaul-tiny.json"

#: Reasoning-style text, so the BPE has merges for what think blocks say.
THINK_SAMPLES = (
    "Okay, the user wants to change a reservation. First I need their user id, then the reservation details.",
    "Let me check the policy: basic economy flights cannot be modified. I should look up the reservation.",
    "The user confirmed. Now I can call the tool with the exact arguments from the previous observation.",
)


def _corpus() -> list[str]:

    return [policy_text(), *(json.dumps(t, ensure_ascii=False) for t in tool_schemas()), *THINK_SAMPLES]


def build_key(corpus: list[str], template: str) -> str:
    payload = {
        "recipe": RECIPE_VERSION,
        "arch": asdict(POLICY_ARCH),
        "vocab": VOCAB_SIZE,
        "seed": SEED,
        "template": template,
        "corpus": corpus,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


def ensure_tiny_qwen3(out_dir: Path, *, log: Callable[[str], None] = print) -> Path:
    """Build `<out_dir>/tiny-qwen3-policy` unless a build with the same key is there; returns its directory.
    Concurrent callers serialise on a lock file; the build is written aside and moved into place."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / DIRNAME
    corpus, template = _corpus(), load_qwen3_template()
    key = build_key(corpus, template)
    with (out_dir / ".lock-qwen3").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if json.loads((target / KEY_FILE).read_text())["key"] == key and (target / "config.json").exists():
                return target
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            pass
        tokenizer = build_hf_tokenizer(
            corpus, VOCAB_SIZE, markup=(*MARKUP_TOKENS, *THINK_TOKENS), chat_template=template
        )
        eos, pad = tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(ENDOFTEXT)
        model = build_model(
            POLICY_ARCH,
            vocab_size=(len(tokenizer) + 63) // 64 * 64,
            eos_token_id=eos,
            pad_token_id=pad,
            seed=SEED,
            family="qwen3",
        )
        model.generation_config.eos_token_id = eos
        model.generation_config.pad_token_id = pad
        tmp = out_dir / f".build-{DIRNAME}-{key}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / KEY_FILE).write_text(json.dumps({"key": key, "role": DIRNAME}, indent=2) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
        log(f"tiny Qwen3 policy written to {target} (key {key})")
        return target
