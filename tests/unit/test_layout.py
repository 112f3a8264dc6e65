"""One run layout and one job environment (`longhaul.layout`, `longhaul.render.jobenv`): every backend's renderer,
adapter and the launcher agree on where a run's files are and on the variables a job gets. Each test pins a place
where copies used to differ."""

from __future__ import annotations

from pathlib import Path

import pytest

from longhaul import constants as C
from longhaul import layout, protocol
from longhaul.layout import Paths, default_run_dir
from longhaul.render import kubernetes, slurm
from longhaul.render.jobenv import job_env
from longhaul.render.plan import render_plan
from longhaul.render.verl import policy_model_path
from longhaul.spec import run_name
from support.specs import spec_variant


def _exports(script: str) -> dict[str, str]:
    out = {}
    for line in script.splitlines():
        if line.startswith("export ") and "=" in line:
            name, _, value = line.removeprefix("export ").partition("=")
            out[name] = value
    return out


@pytest.mark.parametrize("root", ["/ckpt", "/ckpt/", "/ckpt//"])
def test_kubernetes_run_dir_is_the_layouts_whatever_the_mount_paths_slashes(root: str) -> None:
    exp = spec_variant("lata", backends__kubernetes__checkpoint_volume={"claim_name": "c", "mount_path": root})
    assert kubernetes.run_dir(exp) == default_run_dir(exp, "kubernetes") == f"/ckpt/{run_name(exp)}"
    env = {
        e["name"]: e["value"]
        for e in kubernetes.render_job(exp, "grpo")["spec"]["template"]["spec"]["containers"][0]["env"]
        if "value" in e
    }
    assert env[C.ENV_RUN_DIR] == f"/ckpt/{run_name(exp)}"


@pytest.mark.parametrize("root", ["out", "out/", "/abs/out/"])
def test_slurm_and_local_run_dirs_are_the_layouts(root: str) -> None:
    from longhaul.submit.local import local_run_dir

    exp = spec_variant("smoke", backends__slurm__output_dir=root, backends__local__output_dir=root)
    expected = f"{root.rstrip('/')}/{run_name(exp)}"
    assert slurm.slurm_run_dir(exp) == default_run_dir(exp, "slurm") == expected
    assert default_run_dir(exp, "local") == expected and local_run_dir(exp) == Path(expected)


def test_every_renderer_sets_the_same_job_environment() -> None:
    """The offline flags, run name, run directory and backend are the same in the Kubernetes container, the sbatch
    script and the local plan; what differs is deliberate and listed here."""
    exp = spec_variant("lata")
    name = run_name(exp)
    k8s_dir, slurm_dir = default_run_dir(exp, "kubernetes"), default_run_dir(exp, "slurm")
    container = kubernetes.render_job(exp, "grpo")["spec"]["template"]["spec"]["containers"][0]["env"]
    k8s_env = {e["name"]: e["value"] for e in container if "value" in e}
    sh_env = {k: v.strip("'\"") for k, v in _exports(slurm.render_slurm(exp)).items()}
    plan_env = render_plan(exp, "local", "/r").env
    for backend, got, run_dir in (
        ("kubernetes", k8s_env, k8s_dir),
        ("slurm", sh_env, slurm_dir),
        ("local", plan_env, "/r"),
    ):
        want = job_env(backend, name, run_dir, "")
        del want[C.ENV_SPEC]  # the one deliberate difference, checked below
        assert {k: got.get(k) for k in want} == want, backend
    # The pod reads its spec from the mounted ConfigMap, the batch job and the stages from the run directory.
    assert k8s_env[C.ENV_SPEC] == kubernetes.CONTAINER_SPEC_PATH
    assert sh_env[C.ENV_SPEC] == f"{slurm_dir}/{C.SPEC_FILENAME}" and plan_env[C.ENV_SPEC] == f"/r/{C.SPEC_FILENAME}"
    # A job knows its id and stage; the launcher's processes get where the agent loop writes and the experiment.
    assert k8s_env[C.ENV_JOB_ID] == kubernetes.stage_job_name(exp, "grpo") and k8s_env[C.ENV_STAGE] == "grpo"
    assert sh_env[C.ENV_JOB_ID] == "${SLURM_JOB_ID:-}"
    assert plan_env[C.ENV_ROLLOUT_DIR] == Paths.under("/r").rollouts_dir and "MLFLOW_EXPERIMENT_NAME" in plan_env


def test_apptainer_passes_every_job_variable_into_the_container() -> None:
    exp = spec_variant("lata", backends__slurm__container__runtime="apptainer")
    for stage in (None, "grpo"):
        script = slurm.render_slurm(exp, stage=stage)
        passed = {
            line.split('"')[1].split("=")[0]
            for line in script.splitlines()
            if line.strip().startswith("--env") or '--env "' in line
        }
        assert set(_exports(script)) - {"RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH"} <= passed, stage


def test_one_name_for_each_run_file() -> None:
    from longhaul import checkpoints, submit
    from longhaul.submit import kubernetes as k8s_submit
    from longhaul.submit import local
    from longhaul.submit import slurm as slurm_submit

    assert submit.RECORD == local.RECORD == slurm_submit.RECORD == k8s_submit.RECORD == layout.RECORD_FILE
    assert checkpoints.TRACKER_FILE == layout.TRACKER_FILE
    paths = Paths.under("/runs/r/")
    assert paths.run_dir == "/runs/r" and paths.tracker_file == f"/runs/r/checkpoints/{layout.TRACKER_FILE}"
    sft = spec_variant(
        "lata",
        stages=["sft", "grpo"],
        sft={"epochs": 1, "batch_size": 8, "micro_batch_size_per_gpu": 2, "max_length": 12288},
    )
    assert paths.sft.model == "/runs/r/sft/model" == policy_model_path(sft, paths)


def test_the_batch_script_speaks_the_launchers_protocol() -> None:
    assert slurm.EXIT_REQUEUE == protocol.EXIT_REQUEUE
    assert f"SIG{slurm.CHECKPOINT_SIGNAL}" == protocol.CHECKPOINT_SIGNAL.name
    script = slurm.render_slurm(spec_variant("lata"))
    assert f"--signal=B:{slurm.CHECKPOINT_SIGNAL}@" in script and f'"$rc" -eq {protocol.EXIT_REQUEUE}' in script


def test_tracking_takes_its_run_files_from_the_layout() -> None:
    """The MLflow adapter's files in a run directory (the store, the run record, the relay's files, the rollout
    traces it reads back) are named in `longhaul.layout` only: no string of `longhaul.tracking`'s code (docstrings
    aside) spells one of them."""
    import ast

    names = (
        layout.MLFLOW_STORE_FILE,
        layout.MLFLOW_ARTIFACTS_SUBDIR,
        layout.MLFLOW_RUN_FILE,
        layout.MLFLOW_RUN_ID_FILE,
        layout.RELAY_DIR.rsplit("/", 1)[-1],
        layout.RELAY_BUFFER_DB,
        layout.RELAY_STATE_FILE,
        layout.RELAY_OUTBOX_SUBDIR,
        layout.ROLLOUT_STEP_PREFIX,
        layout.STATE_DIR,
    )
    root = Path(layout.__file__).parent / "tracking"
    spelled = []
    for path in sorted(root.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                spelled += [f"{path.name}: {node.value!r}" for name in names if node.value == name]
    assert not spelled, spelled
    paths = Paths.under("/runs/r")
    assert paths.mlflow_run_file == "/runs/r/mlflow_run.json" and paths.relay.state_file == (
        "/runs/r/.longhaul/mlflow-relay/state.json"
    )
    assert layout.rollout_step_name(3) == "step_3" and layout.rollout_step_name(3, validation=True) == "val_step_3"
    assert [layout.rollout_step_of(n) for n in ("step_3", "val_step_3", "step_x")] == [3, None, None]
