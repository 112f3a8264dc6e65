"""Bounds of every number in an Experiment (pure data and types).

Every integer and float of the spec has a lowest and a highest value (a test walks the JSON schema to hold every
new field to it), and no float may be NaN or infinite (`allow_inf_nan=False` on every model). The highest
values are far above any real run and far below what breaks one: a NaN clip, `kl.coef: .inf` or 10³⁰ CPUs
would otherwise pass validation and fail after the job queued and the models loaded, or render a value no
scheduler or JSON encoder accepts.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

#: Nodes of one job; GPUs and CPUs of one node.
MAX_NODES = 1_024
MAX_GPUS_PER_NODE = 64
MAX_CPUS_PER_NODE = 4_096
#: Tensor-parallel ranks of one engine (at most one node's GPUs).
MAX_TENSOR_PARALLEL = MAX_GPUS_PER_NODE
#: Tokens: context lengths, batched tokens, sample lengths, per-call caps (4 Mi tokens).
MAX_TOKENS = 4_194_304
#: Concurrent sequences of one engine.
MAX_SEQS = 65_536
#: Assistant turns of one episode (`environment.max_turns`; `longhaul explain` refuses longer trajectories).
MAX_TURNS = 1_000
#: Training steps (and the checkpoint / validation intervals, and the steps `evaluation.checkpoints` names).
MAX_STEPS = 10_000_000
#: Tasks or sequences of one batch.
MAX_BATCH = 1_000_000
#: Rollouts per task (GRPO's n).
MAX_GROUP = 1_024
#: Epochs of PPO over one batch, and of SFT.
MAX_EPOCHS = 1_000
#: Trials per task (evaluation) and attempts per task (the SFT teacher's best-of-N); k of pass^k.
MAX_SAMPLES = 10_000
#: Bootstrap resamples of a confidence interval (the spec and `longhaul eval summarize --bootstrap`).
MAX_BOOTSTRAP = 100_000
#: Episodes in flight.
MAX_CONCURRENCY = 4_096
#: Seconds a server may take to become healthy.
MAX_STARTUP_S = 86_400
#: Characters of a tool result shown to the policy (veRL's "unlimited" is 10 million).
MAX_TOOL_CHARS = 10_000_000
#: Tool errors or repeated calls before an episode ends.
MAX_EPISODE_EVENTS = 10_000
#: A random seed (data order, rollouts, evaluation): what every library's seed accepts.
MAX_RANDOM_SEED = 2**31 - 1
#: LoRA rank and alpha.
MAX_LORA_RANK = 4_096
MAX_LORA_ALPHA = 65_536
#: The KL loss coefficient (the usual values are 0.001 … 0.1).
MAX_KL_COEF = 10.0
#: Task ids of each τ²-bench domain are 0 … n-1 (airline: 50 tasks, `longhaul.envs.airline.tasks`; a test checks
#: the count against the task file).
DOMAIN_TASKS: dict[str, int] = {"airline": 50}

NodeCount = Annotated[int, Field(ge=1, le=MAX_NODES)]
TensorParallel = Annotated[int, Field(ge=1, le=MAX_TENSOR_PARALLEL)]
Tokens = Annotated[int, Field(ge=1, le=MAX_TOKENS)]
Seqs = Annotated[int, Field(ge=1, le=MAX_SEQS)]
Turns = Annotated[int, Field(ge=1, le=MAX_TURNS)]
Steps = Annotated[int, Field(ge=1, le=MAX_STEPS)]
Step = Annotated[int, Field(ge=0, le=MAX_STEPS)]
Batch = Annotated[int, Field(ge=1, le=MAX_BATCH)]
Epochs = Annotated[int, Field(ge=1, le=MAX_EPOCHS)]
Samples = Annotated[int, Field(ge=1, le=MAX_SAMPLES)]
Concurrency = Annotated[int, Field(ge=1, le=MAX_CONCURRENCY)]
EpisodeEvents = Annotated[int, Field(ge=1, le=MAX_EPISODE_EVENTS)]
RandomSeed = Annotated[int, Field(ge=0, le=MAX_RANDOM_SEED)]
#: A share of a whole, above 0 and at most 1 (the fraction of a GPU's memory a vLLM engine takes).
Fraction = Annotated[float, Field(gt=0.0, le=1.0)]
