"""Write a tiny, loadable Llama model into a Hugging Face cache layout: the "baked" model of CI image builds.

    python3 images/tiny-model.py OUT_DIR [REPO_ID]     (default REPO_ID longhaul-ci/tiny-policy)

Result: OUT_DIR/hf/hub/models--ORG--NAME/{refs/main, snapshots/<commit>/{config.json, model.safetensors}},
exactly what `hf download --revision <commit>` plus images/bake-models.sh leave in /models/hf. The weights are
seeded pseudo-random float32 (one layer, hidden size 16); transformers loads them with LlamaForCausalLM.
Standard library only, so it runs before any ML package is installed.
"""

from __future__ import annotations

import hashlib
import json
import random
import struct
import sys
from pathlib import Path

VOCAB, HIDDEN, INTER, HEADS, KV_HEADS, LAYERS = 128, 16, 32, 2, 1, 1


def tensor_shapes() -> dict[str, tuple[int, ...]]:
    head_dim = HIDDEN // HEADS
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (HEADS * head_dim, HIDDEN),
            p + "self_attn.k_proj.weight": (KV_HEADS * head_dim, HIDDEN),
            p + "self_attn.v_proj.weight": (KV_HEADS * head_dim, HIDDEN),
            p + "self_attn.o_proj.weight": (HIDDEN, HEADS * head_dim),
            p + "mlp.gate_proj.weight": (INTER, HIDDEN),
            p + "mlp.up_proj.weight": (INTER, HIDDEN),
            p + "mlp.down_proj.weight": (HIDDEN, INTER),
            p + "input_layernorm.weight": (HIDDEN,),
            p + "post_attention_layernorm.weight": (HIDDEN,),
        }
    return shapes


def build_safetensors(seed: int = 0) -> bytes:
    """A safetensors file (8-byte header length, JSON header, raw little-endian F32 data)."""
    rng = random.Random(seed)
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs: list[bytes] = []
    offset = 0
    for name, shape in sorted(tensor_shapes().items()):
        n = 1
        for d in shape:
            n *= d
        norm = name.endswith("norm.weight")
        values = [1.0] * n if norm else [rng.gauss(0.0, 0.02) for _ in range(n)]
        blob = struct.pack(f"<{n}f", *values)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + b"".join(blobs)


def config() -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def write_model(out_dir: Path, repo_id: str = "longhaul-ci/tiny-policy") -> Path:
    """Write the model under out_dir/hf/hub; returns the snapshot directory. Idempotent."""
    files = {"config.json": json.dumps(config(), indent=2).encode(), "model.safetensors": build_safetensors()}
    commit = hashlib.sha1(b"".join(files[k] for k in sorted(files)) + repo_id.encode()).hexdigest()
    entry = out_dir / "hf" / "hub" / ("models--" + repo_id.replace("/", "--"))
    snapshot = entry / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (snapshot / name).write_bytes(data)
    (entry / "refs").mkdir(exist_ok=True)
    (entry / "refs" / "main").write_text(commit)
    return snapshot


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        raise SystemExit(2)
    print(write_model(Path(sys.argv[1]), *sys.argv[2:]))
