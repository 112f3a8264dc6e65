"""The CPU rollout replica: a token-in/token-out Hugging Face generation server inside a Ray actor.

What veRL's agent loop needs from a rollout server (`LLMServerManager` → `server.generate.remote(...)` →
`TokenOutput`) and what the trainer needs to keep it on-policy (`update_weights` after every update):

* `CPUGenerationServer` — one Ray actor per replica owning a causal LM on the CPU. `generate` samples with the
  request's temperature / top-k / top-p, stops at EOS or any `stop_token_ids`, honours `max_tokens`, and reports
  the log-probability of every sampled token under the **temperature-scaled** distribution
  (`log_softmax(logits / T)`), which is what vLLM reports and what veRL's actor recomputes (raw log-probs at
  T = 0.3 correlate only ~0.8 with the actor's). Requests run one at a time (a 2-core machine gains nothing from
  batching a tiny model) in a worker thread, so the actor's event loop keeps serving control calls.
  `extra_fields["global_steps"]` is the trainer step whose weights produced the tokens (veRL derives
  min/max global steps from it).
* `CPUReplica` — the `RolloutReplica` veRL builds per replica (`RolloutReplicaRegistry`).
* `CPUServerAdapter` — the `BaseRollout` that lives in every trainer worker (hybrid engine): every rank drains
  the weight generator (it may run collectives); rank 0 of the replica sends the full state dict to the server.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

from longhaul import constants as C
from longhaul.verlcpu import ROLLOUT_NAME

logger = logging.getLogger(__name__)


def server_actor_name(replica_rank: int, name_suffix: str = "") -> str:
    """The Ray actor name of replica `replica_rank`'s server (the adapter in the trainer looks it up by name)."""
    return f"{ROLLOUT_NAME}_server_{replica_rank}{name_suffix}"


def sample_token(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, generator: torch.Generator | None
) -> tuple[int, float]:
    """Sample one token from 1-D `logits`; returns (token, log-prob under the temperature-scaled distribution).

    temperature ≤ 0 is greedy (log-prob of the raw distribution). top_k ≤ 0 and top_p ≥ 1 disable those filters;
    the reported log-prob is always of the unfiltered temperature-scaled distribution, as vLLM's processed
    log-probs and veRL's actor compute it."""
    logits = logits.float()
    if temperature is None or temperature <= 0:
        logp = torch.log_softmax(logits, -1)
        tok = int(torch.argmax(logits))
        return tok, float(logp[tok])
    scaled = logits / temperature
    logp = torch.log_softmax(scaled, -1)
    filtered = scaled
    if top_k and 0 < top_k < filtered.numel():
        kth = torch.topk(filtered, top_k).values[-1]
        filtered = filtered.masked_fill(filtered < kth, float("-inf"))
    probs = torch.softmax(filtered, -1)
    if top_p is not None and top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep_sorted = (torch.cumsum(sorted_p, -1) - sorted_p) < top_p  # the top token is always kept
        keep = torch.zeros_like(keep_sorted).scatter(0, order, keep_sorted)
        probs = torch.where(keep, probs, torch.zeros_like(probs))
        probs = probs / probs.sum()
    tok = int(torch.multinomial(probs, 1, generator=generator))
    return tok, float(logp[tok])


class CPUGenerationServer:
    """A causal LM on the CPU answering veRL's token-in/token-out `generate` (module docstring)."""

    def __init__(self, config: Any, model_config: Any, replica_rank: int) -> None:
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(int(os.environ.get(C.ENV_CPU_ROLLOUT_THREADS, "1")))
        self.config = config
        self.replica_rank = replica_rank
        path = getattr(model_config, "local_path", None) or model_config.path
        self.model = AutoModelForCausalLM.from_pretrained(
            path,
            dtype=torch.float32,
            trust_remote_code=bool(getattr(model_config, "trust_remote_code", False)),
        ).eval()
        eos = self.model.generation_config.eos_token_id if self.model.generation_config else None
        eos = eos if eos is not None else self.model.config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()
        self.max_positions = int(getattr(self.model.config, "max_position_embeddings", 1 << 30))
        self.generator = torch.Generator().manual_seed(int(getattr(config, "seed", 0) or 0))
        self._lock = threading.Lock()
        self._aborted = threading.Event()
        self.global_steps: int | None = None
        self.weight_version = 0

    # -- control plane (no device memory to release on the CPU) ---------------------------------------------

    def get_server_address(self) -> tuple[str, int]:
        return "127.0.0.1", 0

    async def wake_up(self, tags: list[str] | None = None) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def start_profile(self, **_: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        """Stop the generation in flight (it returns what it has, stop_reason 'aborted')."""
        self._aborted.set()
        return {"aborted_count": 0, "request_ids": []}

    async def resume_generation(self) -> None:
        self._aborted.clear()

    def load_weights(self, state: dict[str, torch.Tensor], global_steps: int | None) -> dict[str, Any]:
        """Load the trainer's full state dict; every parameter must be present (with tied embeddings the output
        embedding is the input embedding: a separate `lm_head.weight` is ignored, so it cannot overwrite it)."""
        if getattr(self.model.config, "tie_word_embeddings", False):
            state = {k: v for k, v in state.items() if not k.endswith("lm_head.weight")}
        with self._lock:
            result = self.model.load_state_dict(state, strict=False)
            missing = [
                k
                for k in result.missing_keys
                if not k.endswith("lm_head.weight") or not getattr(self.model.config, "tie_word_embeddings", False)
            ]
            if missing or result.unexpected_keys:
                raise RuntimeError(
                    f"weight sync: {len(missing)} parameters missing (e.g. {missing[:3]}), "
                    f"{len(result.unexpected_keys)} unexpected (e.g. {result.unexpected_keys[:3]})"
                )
            self.weight_version += 1
            self.global_steps = None if global_steps is None else int(global_steps)
        return {"tensors": len(state), "weight_version": self.weight_version, "global_steps": self.global_steps}

    # -- data plane -----------------------------------------------------------------------------------------

    def _generate(
        self, prompt_ids: list[int], max_tokens: int, params: dict[str, Any], stop_ids: set[int]
    ) -> tuple[list[int], list[float], str, int | None]:
        with self._lock, torch.inference_mode():
            steps = self.global_steps
            past = None
            current = torch.tensor([prompt_ids], dtype=torch.long)
            tokens: list[int] = []
            logprobs: list[float] = []
            reason = "length"
            for _ in range(max_tokens):
                if self._aborted.is_set():
                    reason = "aborted"
                    break
                out = self.model(input_ids=current, past_key_values=past, use_cache=True)
                past = out.past_key_values
                tok, lp = sample_token(
                    out.logits[0, -1],
                    params.get("temperature", 1.0),
                    int(params.get("top_k", -1) or -1),
                    params.get("top_p", 1.0),
                    self.generator,
                )
                tokens.append(tok)
                logprobs.append(lp)
                if tok in stop_ids:
                    reason = "completed"
                    break
                current = torch.tensor([[tok]], dtype=torch.long)
            return tokens, logprobs, reason, steps

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        **_: Any,
    ) -> TokenOutput:
        """Token-in/token-out generation (veRL's server contract)."""
        params = dict(sampling_params or {})
        room = min(self.config.prompt_length + self.config.response_length, self.max_positions) - len(prompt_ids)
        requested = params.pop("max_tokens", params.pop("max_new_tokens", self.config.response_length))
        max_tokens = max(0, min(int(requested), room))
        stop_ids = self.eos_ids | set(params.get("stop_token_ids") or ())
        if max_tokens == 0:
            tokens, logprobs, reason, steps = [], [], "length", self.global_steps
        else:
            tokens, logprobs, reason, steps = await asyncio.to_thread(
                self._generate, list(prompt_ids), max_tokens, params, stop_ids
            )
        return TokenOutput(
            token_ids=tokens,
            log_probs=logprobs if params.get("logprobs", True) else None,
            stop_reason=reason,
            num_preempted=0,
            extra_fields={"global_steps": steps, "weight_version": self.weight_version},
        )


class CPUReplica(RolloutReplica):
    """veRL rollout replica whose server is a `CPUGenerationServer` actor (hybrid mode: weights from the actor)."""

    async def launch_servers(self) -> None:
        name = server_actor_name(self.replica_rank, self.name_suffix)
        server = (
            ray.remote(CPUGenerationServer)
            .options(name=name, num_cpus=0, max_concurrency=self.max_concurrency)
            .remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        )
        await server.get_server_address.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = name

    def rollout_worker_use_gpu(self) -> bool:
        return False


class CPUServerAdapter(BaseRollout):
    """The rollout side of each trainer worker: forwards the trainer's weights to the replica's server."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1, **_: Any) -> None:
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        per_replica = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        self.replica_rank = rank // per_replica if replica_rank == -1 else replica_rank
        self.is_leader = rank % per_replica == 0
        self.sleep_level = 1
        self._server = None

    def _server_handle(self) -> Any:
        if self._server is None:
            self._server = ray.get_actor(server_actor_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    async def update_weights(self, weights: Any, wire_format: str = "named_tensors", **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise NotImplementedError(f"the CPU rollout takes full named tensors, not {wire_format!r}")
        if kwargs.get("peft_config") is not None:
            raise NotImplementedError(
                "LoRA adapters are not synced to the CPU rollout: use policy.lora.rank: 0 on the CPU platform"
            )
        state: dict[str, torch.Tensor] = {}
        for name, tensor in weights:  # every rank drains the generator: producing a tensor may be a collective
            if hasattr(tensor, "full_tensor"):
                tensor = tensor.full_tensor()
            if self.is_leader:
                state[name] = tensor.detach().to("cpu", torch.float32).clone()
        if self.is_leader:
            result = await self._server_handle().load_weights.remote(state, kwargs.get("global_steps"))
            logger.info("CPU rollout weights loaded: %s", result)
