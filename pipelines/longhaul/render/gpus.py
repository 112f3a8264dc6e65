"""A server's GPUs inside the job's device mask (pure).

The launch plan names a server's GPUs by position in the job's visible set (0 = the job's first GPU): the plan is
rendered before the job knows which GPUs it will get. The launcher maps the positions into the job's own
`CUDA_VISIBLE_DEVICES` when it starts the server. A Slurm job given GPUs 2,3 on a node without device constraints
sees `CUDA_VISIBLE_DEVICES=2,3`, so the simulator's positions `0,1` become `2,3`, never GPUs 0 and 1, which belong
to another job. Unset stays unset: the positions are then the devices themselves (a Kubernetes container sees
only its own GPUs, as 0..n-1; so does a Slurm job with ConstrainDevices).
"""

from __future__ import annotations


class GpuMaskError(ValueError):
    """A server's GPUs cannot be found in the job's mask; the message says why and what to change."""


def within_job_mask(positions: str, job_mask: str | None) -> str:
    """The devices at `positions` ("0,1") of `job_mask` ("2,3" → "2,3"; UUID and MIG entries pass through
    unchanged); `job_mask` None (unset) → `positions` as they are."""
    wanted = [p.strip() for p in positions.split(",") if p.strip()]
    if job_mask is None:
        return ",".join(wanted)
    devices = [d.strip() for d in job_mask.split(",") if d.strip()]
    if not devices:
        raise GpuMaskError(
            "the job's CUDA_VISIBLE_DEVICES is set but empty, which hides every GPU: unset it, or let the "
            "scheduler set it (Slurm --gres, the Kubernetes device plugin)"
        )
    out = []
    for p in wanted:
        if not p.isdigit():
            raise GpuMaskError(f"GPU position {p!r} in the launch plan is not an index (render the plan again)")
        if int(p) >= len(devices):
            raise GpuMaskError(
                f"needs the job's GPU #{p}, but the job sees {len(devices)} (CUDA_VISIBLE_DEVICES={job_mask}): "
                "give the job spec.resources.gpus_per_node GPUs"
            )
        out.append(devices[int(p)])
    return ",".join(out)
