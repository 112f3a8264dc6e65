"""`spec.user_simulator`: the LLM user simulator, an OpenAI-compatible server started inside the job or external."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, model_validator

from longhaul.spec.base import FieldError, SpecModel
from longhaul.spec.bounds import MAX_STARTUP_S, Fraction, Seqs, TensorParallel, Tokens
from longhaul.spec.serving import ModelRef, Sampling, SecretRef
from longhaul.spec.strings import Url


class Quantization(StrEnum):
    NONE = "none"
    AWQ = "awq"
    AWQ_MARLIN = "awq_marlin"
    GPTQ = "gptq"
    FP8 = "fp8"


class Placement(StrEnum):
    COLOCATED = "colocated"
    EXTERNAL = "external"


class GpuShare(StrEnum):
    SHARED = "shared"
    DEDICATED = "dedicated"


class SimulatorSpec(SpecModel):
    """The LLM user simulator (an OpenAI-compatible server)."""

    model: ModelRef = Field(
        default_factory=lambda: ModelRef(name="Qwen/Qwen2.5-72B-Instruct-AWQ"), description="Simulator model."
    )
    quantization: Quantization = Field(default=Quantization.AWQ_MARLIN, description="vLLM quantization.")
    tensor_parallel_size: TensorParallel = Field(default=2, description="Tensor-parallel size of the simulator.")
    gpu_memory_utilization: Fraction = Field(default=0.4, description="vLLM memory fraction per GPU.")
    max_model_len: Tokens = Field(default=16384, description="Simulator context length.")
    max_num_seqs: Seqs = Field(default=8, description="Simulator concurrent sequences.")
    enforce_eager: bool = Field(default=False, description="Disable CUDA graphs in the simulator.")
    sampling: Sampling = Field(
        default_factory=lambda: Sampling(temperature=0.7, top_p=0.9, max_tokens=1024),
        description="Simulator sampling.",
    )
    placement: Placement = Field(
        default=Placement.COLOCATED,
        description="colocated: started inside the job; external: an existing server at `url`.",
    )
    gpu_share: GpuShare = Field(
        default=GpuShare.SHARED,
        description="colocated only. shared: the simulator shares GPUs 0..tp-1 with the trainer; "
        "dedicated: it gets its own GPUs and the trainer the rest.",
    )
    url: Url | None = Field(default=None, description="Base URL (…/v1) of an external server.")
    api_key_secret: SecretRef | None = Field(default=None, description="Secret holding the external server's key.")
    port: int = Field(default=8001, ge=1024, le=65535, description="Port of the colocated server.")
    startup_timeout_s: int = Field(
        default=1800, ge=1, le=MAX_STARTUP_S, description="Health-check timeout at start (seconds)."
    )

    @model_validator(mode="after")
    def _placement(self) -> SimulatorSpec:
        if self.placement == Placement.EXTERNAL and not self.url:
            raise FieldError("url", "placement 'external' needs `url` (the server's base URL, e.g. http://sim:8001/v1)")
        if self.placement == Placement.COLOCATED and self.url:
            raise FieldError(
                "url", "`url` is only used with placement 'external'; remove it or set placement: external"
            )
        return self
