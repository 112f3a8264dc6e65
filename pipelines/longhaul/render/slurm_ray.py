"""Multi-node Slurm jobs (pure): a Ray head on the first node and one worker per other node, each an `srun` step
in the job's runtime, the driver attached through RAY_ADDRESS — the layout veRL documents for Slurm. The script
waits until every node has joined; on veRL's CPU platform each node advertises one trainer rank
(`render.verl.cpu_ray_start_resources`)."""

from __future__ import annotations

from longhaul import constants as C
from longhaul.render.slurm_runtime import srun_on
from longhaul.render.verl import cpu_ray_start_resources
from longhaul.spec.models import Experiment

RAY_PORT = 6379
RAY_HEAD_TIMEOUT_S = 300
#: Prefix of the job's own Ray temporary root on each node (`<prefix>-<job id>`, see `ray_env_block`).
RAY_TMP_ROOT = "/tmp/longhaul-ray"
#: Ray's default dashboard-agent port; node i of the job uses this + i (see `ray_start_block`).
RAY_AGENT_PORT = 52365


def ray_env_block(exp: Experiment) -> list[str]:
    """The head node's address, the job's own Ray temporary root and the token auth, exported for every step."""
    res = exp.spec.resources
    return [
        f"# Multi-node ({res.nodes} nodes): Ray head on the first node, a worker on each other node (each an srun",
        "# step), the driver attached via RAY_ADDRESS (veRL's documented Slurm layout). Token auth with one token",
        "# file in the run directory, which must be on a filesystem shared by the nodes (checkpoints need it too).",
        'mapfile -t LH_NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        'LH_HEAD="${LH_NODES[0]}"',
        'LH_HEAD_IP="$(srun --overlap --nodes=1 --ntasks=1 -w "$LH_HEAD" hostname --ip-address | awk \'{print $1}\')"',
        f'export RAY_ADDRESS="$LH_HEAD_IP:{RAY_PORT}"',
        "# Ray's temporary root, private to the job on every node: `ray start` records its cluster in",
        "# <root>/ray/ray_current_cluster, where a later plain `ray.init()` on that node (another job, a one-node",
        "# run) would find this job's cluster, long gone, and try to attach to it instead of starting its own.",
        f'export RAY_TMPDIR="{RAY_TMP_ROOT}-${{SLURM_JOB_ID}}"',
        "export RAY_AUTH_MODE=token",
        f'export RAY_AUTH_TOKEN_PATH="${C.ENV_RUN_DIR}/.ray/auth_token"',
        'mkdir -p "$(dirname "$RAY_AUTH_TOKEN_PATH")"',
        "( umask 077; od -An -N32 -tx1 /dev/urandom | tr -d ' \\n' > \"$RAY_AUTH_TOKEN_PATH\" )",
        "",
    ]


def ray_start_block(exp: Experiment) -> list[str]:
    """Start the head and one worker per other node (srun steps), and wait until every node has joined."""
    res = exp.spec.resources
    if res.gpus_per_node == 0:
        # veRL's CPU platform: each node's trainer rank is one logical "GPU" (render.verl.render_cpu_overrides).
        cpu_res = cpu_ray_start_resources()
        ray_res = f"--num-cpus={cpu_res['num_cpus']} --num-gpus={cpu_res['num_gpus']}"
    else:
        ray_res = f"--num-cpus={res.cpus_per_node} --num-gpus={res.gpus_per_node}"
    return [
        f'on_node() {{ local node="$1"; shift; {srun_on("$node")} "$@"; }}',
        "LH_RAY_PIDS=()",
        'stop_ray() { for p in "${LH_RAY_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; }',
        "trap stop_ray EXIT",
        "# Each node's dashboard agent gets its own port (Ray's default plus the node's index): Slurm may place two",
        "# of the job's nodes on one host (several slurmd per host), where the default port would clash.",
        f'{srun_on("$LH_HEAD")} ray start --head --node-ip-address="$LH_HEAD_IP" --port={RAY_PORT} {ray_res} '
        f"--dashboard-agent-listen-port={RAY_AGENT_PORT} --block &",
        "LH_RAY_PIDS+=($!)",
        f"for _ in $(seq 1 {RAY_HEAD_TIMEOUT_S}); do",
        '  on_node "$LH_HEAD" ray status --address="$RAY_ADDRESS" >/dev/null 2>&1 && break',
        "  sleep 1",
        "done",
        "LH_I=0",
        'for node in "${LH_NODES[@]:1}"; do',
        "  LH_I=$((LH_I + 1))",
        f'  {srun_on("$node")} ray start --address="$RAY_ADDRESS" {ray_res} '
        f'--dashboard-agent-listen-port="$(({RAY_AGENT_PORT} + LH_I))" --block &',
        "  LH_RAY_PIDS+=($!)",
        "done",
        "# The driver needs every node: veRL places one trainer rank group per node and fails when one is missing.",
        "LH_RAY_UP=0",
        f"for _ in $(seq 1 {RAY_HEAD_TIMEOUT_S}); do",
        '  LH_RAY_UP="$(on_node "$LH_HEAD" ray status --address="$RAY_ADDRESS" 2>/dev/null '
        "| awk '/^Active:/{a=1;next} /^[A-Za-z]/{a=0} a&&/node_/{n++} END{print n+0}')\"",
        '  [ "$LH_RAY_UP" -ge "${#LH_NODES[@]}" ] && break',
        "  sleep 2",
        "done",
        'echo "longhaul: Ray cluster at $RAY_ADDRESS: $LH_RAY_UP of ${#LH_NODES[@]} nodes up (${LH_NODES[*]})" >&2',
        'if [ "$LH_RAY_UP" -lt "${#LH_NODES[@]}" ]; then',
        f'  echo "longhaul: Ray nodes missing after {RAY_HEAD_TIMEOUT_S} s; see the ray start output above" >&2',
        "  exit 1",
        "fi",
        "",
    ]
