"""render_slurm: directives, runtimes, protocol, quoting (pure; the script is also executed with bash)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from longhaul.render.slurm import EXIT_REQUEUE, memory_mib, render_slurm, slurm_run_dir
from longhaul.spec import load_spec, run_name
from longhaul.spec.models import Experiment
from support.slurm import sbatch_directives

REPO = Path(__file__).resolve().parents[3]
SPECS = sorted((REPO / "specs").glob("*.yaml"))


def _doc(base: str = "smoke") -> dict:
    return yaml.safe_load((REPO / "specs" / f"{base}.yaml").read_text(encoding="utf-8"))


def _exp(base: str = "smoke", **changes: object) -> Experiment:
    doc = _doc(base)
    for dotted, value in changes.items():
        node = doc
        keys = dotted.split("__")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return Experiment.model_validate(doc)


def _bash_n(script: str, tmp_path: Path) -> None:
    path = tmp_path / "job.sbatch"
    path.write_text(script, encoding="utf-8")
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_every_spec_renders_valid_bash(spec: Path, tmp_path: Path) -> None:
    exp = load_spec(spec)
    script = render_slurm(exp)
    _bash_n(script, tmp_path)
    d = sbatch_directives(script)
    assert d["job-name"] == run_name(exp)
    assert d["output"] == f"{slurm_run_dir(exp)}/slurm-%j.out"
    assert d["open-mode"] == "append" and "requeue" in d
    assert d["signal"] == f"B:USR1@{exp.spec.backends.slurm.signal_lead_s}"
    assert d["time"] == exp.spec.resources.time_limit
    assert d["nodes"] == str(exp.spec.resources.nodes)
    launch = (
        f"longhaul launch --spec {slurm_run_dir(exp)}/experiment.yaml --backend slurm --run-dir {slurm_run_dir(exp)} &"
    )
    assert launch in script


def test_lata_resources() -> None:
    d = sbatch_directives(render_slurm(load_spec(REPO / "specs/lata.yaml")))
    assert d["gres"] == "gpu:a800:2" and d["cpus-per-task"] == "32" and d["mem"] == "524288M"
    assert d["time"] == "3-00:00:00"
    assert "partition" not in d and "account" not in d and "qos" not in d


def test_cpu_spec_has_no_gres_and_untyped_gpus_have_no_type() -> None:
    assert "gres" not in sbatch_directives(render_slurm(_exp()))
    exp = _exp("lata", spec__resources__gpu_type=None)
    assert sbatch_directives(render_slurm(exp))["gres"] == "gpu:2"


def test_site_fields_and_no_requeue() -> None:
    exp = _exp(
        spec__backends__slurm={
            "partition": "gpu",
            "account": "proj-1",
            "qos": "high",
            "requeue": False,
            "container": {"runtime": "none"},
            "signal_lead_s": 120,
        }
    )
    script = render_slurm(exp)
    d = sbatch_directives(script)
    assert (d["partition"], d["account"], d["qos"]) == ("gpu", "proj-1", "high")
    assert "no-requeue" in d and "requeue" not in d and d["signal"] == "B:USR1@120"
    assert "scontrol requeue" not in script and "requeue is off" in script


@pytest.mark.parametrize(
    "quantity,mib",
    [
        ("512Gi", 524288),
        ("8Gi", 8192),
        ("64G", 61036),
        ("1Ti", 1048576),
        ("1500Mi", 1500),
        ("1048576", 1),
        ("0.5Gi", 512),
    ],
)
def test_memory_mib(quantity: str, mib: int) -> None:
    assert memory_mib(quantity) == mib


def test_stage_and_dependency() -> None:
    exp = _exp()
    script = render_slurm(exp, stage="eval", dependency="afterok:123")
    d = sbatch_directives(script)
    assert d["dependency"] == "afterok:123" and d["output"].endswith("/slurm-eval-%j.out")
    assert "--stage eval &" in script and "export LONGHAUL_STAGE=eval" in script
    with pytest.raises(ValueError, match="valid: grpo, eval"):
        render_slurm(exp, stage="sft")
    for bad in ("afterok:1;touch x", "afterok:", "afterok:12 --wrap=x", "after:$(id)"):
        with pytest.raises(ValueError, match="dependency"):
            render_slurm(exp, dependency=bad)


def test_runtime_apptainer_and_pyxis(tmp_path: Path) -> None:
    app = render_slurm(
        _exp(
            "lata",
            spec__backends__slurm={
                "container": {"runtime": "apptainer", "image": "/sif/longhaul.sif", "binds": ["/data"]}
            },
        )
    )
    _bash_n(app, tmp_path)
    assert "CONTAINER=(apptainer exec --nv --containall" in app and "-B /data" in app
    assert '--env "HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-}"' in app and "/sif/longhaul.sif)" in app
    pyx = render_slurm(
        _exp("lata", spec__backends__slurm={"container": {"runtime": "pyxis", "image": "nvcr.io/x/y+1"}})
    )
    _bash_n(pyx, tmp_path)
    assert "PYXIS=(--container-image=nvcr.io/x/y+1" in pyx
    assert 'srun --overlap --nodes=1 --ntasks=1 "${PYXIS[@]}" longhaul launch' in pyx
    # No image in the spec: named at submit time, the job refuses to start without it.
    noimg = render_slurm(load_spec(REPO / "specs/lata.yaml"))
    assert '"${LONGHAUL_IMAGE:?runtime apptainer: set spec.backends.slurm.container.image' in noimg


def test_multi_node_ray_layout(tmp_path: Path) -> None:
    exp = _exp(
        "lata",
        spec__resources__nodes=2,
        spec__backends__slurm={"container": {"runtime": "apptainer", "image": "/sif/l.sif"}},
    )
    script = render_slurm(exp)
    _bash_n(script, tmp_path)
    assert sbatch_directives(script)["nodes"] == "2"
    head = script.index("ray start --head")
    workers = script.index('-w "$node" "${PYXIS[@]}" "${CONTAINER[@]}" ray start --address="$RAY_ADDRESS"')
    launch = script.index('srun --overlap --nodes=1 --ntasks=1 -w "$LH_HEAD" "${PYXIS[@]}" "${CONTAINER[@]}" longhaul')
    assert head < workers < launch
    assert "--num-cpus=32 --num-gpus=2" in script and "RAY_AUTH_MODE=token" in script
    assert '--env "RAY_ADDRESS=${RAY_ADDRESS:-}"' in script  # exported before the container prefix is built
    assert script.index("export RAY_ADDRESS=") < script.index("CONTAINER=(")
    assert "ray start" not in render_slurm(_exp("lata"))
    # Node i's dashboard agent on Ray's port + i (two nodes of a job may share a host); every node joins first.
    assert "--dashboard-agent-listen-port=52365 --block" in script
    assert '--dashboard-agent-listen-port="$((52365 + LH_I))"' in script
    assert script.index("nodes up") < launch
    # The job's own Ray temporary root (no stale /tmp/ray/ray_current_cluster for later plain `ray.init()`s).
    assert script.index('export RAY_TMPDIR="/tmp/longhaul-ray-${SLURM_JOB_ID}"') < head
    assert '--env "RAY_TMPDIR=${RAY_TMPDIR:-}"' in script


def test_multi_node_cpu_ray_advertises_one_rank_slot_per_node(tmp_path: Path) -> None:
    exp = _exp(
        "smoke",
        spec__stages=["grpo"],
        spec__resources__nodes=2,
        spec__algorithm__ppo_micro_batch_size_per_gpu=2,
        spec__backends__slurm={"partition": "multi", "container": {"runtime": "none"}},
    )
    script = render_slurm(exp)
    _bash_n(script, tmp_path)
    # veRL's CPU platform: one logical "GPU" per node (its trainer rank) and the CPU platform's Ray slots.
    assert script.count("--num-cpus=8 --num-gpus=1") == 2 and "--num-gpus=0" not in script


def test_protocol_constant_matches_launcher() -> None:
    from longhaul import protocol
    from longhaul.launcher import protocol as cited  # the module the script's comment names

    assert "Protocol: longhaul.launcher.protocol." in render_slurm(_exp("lata"))
    assert EXIT_REQUEUE == protocol.EXIT_REQUEUE == cited.EXIT_REQUEUE
    assert cited.CHECKPOINT_SIGNAL.name == "SIGUSR1"


# ---------------------------------------------------------------------------------------------- hostile input

HOSTILE = [
    "$(touch PWNED)",
    "`touch PWNED`",
    "a;touch PWNED",
    "a && touch PWNED",
    "a|touch PWNED",
    "a\ntouch PWNED",
    "a b",
    "'",
    '"',
    "a$HOME",
    "a>PWNED",
    "a%j",
]


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize(
    "field",
    [
        "metadata__name",
        "spec__backends__slurm__partition",
        "spec__backends__slurm__account",
        "spec__backends__slurm__qos",
        "spec__backends__slurm__output_dir",
        "spec__backends__slurm__venv",
        "spec__resources__gpu_type",
        "spec__resources__time_limit",
        "spec__backends__slurm__container__image",
    ],
)
def test_hostile_values_are_rejected_at_the_door(field: str, value: str) -> None:
    with pytest.raises(ValidationError):
        _exp(**{field: value})


def test_setup_lines_must_be_single_lines() -> None:
    with pytest.raises(ValidationError):
        _exp(spec__backends__slurm__setup=["module load x\ntouch PWNED"])
    with pytest.raises(ValidationError):
        _exp(spec__backends__slurm__setup=["#SBATCH --partition=other"])


def test_sbatch_values_are_checked_even_without_validation() -> None:
    exp = _exp()
    slurm = exp.spec.backends.slurm.model_copy(update={"partition": "debug --wrap=id"})
    spec = exp.spec.model_copy(update={"backends": exp.spec.backends.model_copy(update={"slurm": slurm})})
    with pytest.raises(ValueError, match="#SBATCH --partition"):
        render_slurm(exp.model_copy(update={"spec": spec}))


def test_script_passes_odd_but_valid_strings_verbatim(tmp_path: Path) -> None:
    """Run the rendered script with bash: shell-meaningful characters the patterns allow reach argv unchanged."""
    odd = tmp_path / "v=1,a+b@c-d"
    (odd / "bin").mkdir(parents=True)
    (odd / "bin" / "activate").write_text(f'export PATH="{odd}/bin:$PATH"\n')
    dump = tmp_path / "argv.json"
    (odd / "bin" / "longhaul").write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"json.dump({{'argv': sys.argv[1:], 'env': {{k: v for k, v in os.environ.items() if k.startswith(('LONGHAUL_', 'HF_'))}}}},"  # noqa: E501 - a string literal kept whole
        f" open({str(dump)!r}, 'w'))\n"
    )
    (odd / "bin" / "longhaul").chmod(0o755)
    out_dir = f"{tmp_path}/o=1,x+y@z-"
    marker = tmp_path / "setup-ran"
    exp = _exp(
        spec__backends__slurm={
            "container": {"runtime": "none"},
            "venv": str(odd),
            "output_dir": out_dir,
            "setup": [f"echo ok > {marker}"],
        }
    )
    script = tmp_path / "job.sbatch"
    script.write_text(render_slurm(exp))
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "7", "SLURM_SUBMIT_DIR": str(tmp_path), "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(dump.read_text())
    run_dir = f"{out_dir}/{run_name(exp)}"
    assert got["argv"] == ["launch", "--spec", f"{run_dir}/experiment.yaml", "--backend", "slurm", "--run-dir", run_dir]
    assert got["env"]["LONGHAUL_RUN_DIR"] == run_dir and got["env"]["LONGHAUL_JOB_ID"] == "7"
    assert got["env"]["HF_HUB_OFFLINE"] == "1" and marker.read_text() == "ok\n"
    assert not list(tmp_path.rglob("PWNED"))


def test_launcher_exit_code_is_the_job_exit_code(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text(f'export PATH="{venv}/bin:$PATH"\n')
    (venv / "bin" / "longhaul").write_text("#!/bin/sh\nexit 3\n")
    (venv / "bin" / "longhaul").chmod(0o755)
    script = tmp_path / "job.sbatch"
    script.write_text(render_slurm(_exp(spec__backends__slurm__output_dir=str(tmp_path / "runs"))))
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "8", "LONGHAUL_VENV": str(venv)}
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and "launcher exited with 3" in proc.stderr
    # Without a venv the job stops before running anything, naming both ways to provide one.
    env.pop("LONGHAUL_VENV")
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "spec.backends.slurm.venv" in proc.stderr and "LONGHAUL_VENV" in proc.stderr


_STUBS = {
    # srun: runs its command (options dropped) and forwards SIGUSR1/SIGTERM to it, as the real one does
    "srun": """#!/bin/bash
while [[ $1 == -* ]]; do case $1 in -w) shift 2;; *) shift;; esac; done
"$@" & child=$!
trap 'kill -USR1 $child' USR1; trap 'kill -TERM $child' TERM
rc=0; while kill -0 $child 2>/dev/null; do wait $child; rc=$?; done
exit $rc
""",
    "scontrol": """#!/bin/bash
case $1 in show) printf 'n1\\nn2\\n';; requeue) echo "requeue $2" >> "$STUB_LOG";; esac
""",
    "ray": """#!/bin/bash
case $1 in status) printf 'Active:\\n 1 node_a\\n 1 node_b\\n';; start) exec sleep 600;; esac
""",
    "hostname": "#!/bin/bash\necho 127.0.0.1\n",
    "longhaul": """#!/bin/bash
trap 'echo "stub launcher: checkpoint saved" >&2; exit 75' USR1
touch "$STUB_LOG.started"
while :; do sleep 0.1; done
""",
}


def test_multi_node_pre_limit_signal_reaches_the_launcher_and_requeues(tmp_path: Path) -> None:
    """The batch shell's USR1 trap signals the launcher's own srun (which forwards it), so the launcher saves and
    exits 75 and the job requeues itself; a signal to a subshell wrapped around srun would kill the wrapper only."""
    import signal
    import time

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text(f'export PATH="{venv}/bin:$PATH"\n')
    for name, body in _STUBS.items():
        (venv / "bin" / name).write_text(body)
        (venv / "bin" / name).chmod(0o755)
    exp = _exp(
        "smoke",
        spec__stages=["grpo"],
        spec__resources__nodes=2,
        spec__algorithm__ppo_micro_batch_size_per_gpu=2,
        spec__backends__slurm={
            "partition": "multi",
            "output_dir": str(tmp_path / "runs"),
            "container": {"runtime": "none"},
        },
    )
    script = tmp_path / "job.sbatch"
    script.write_text(render_slurm(exp))
    log = tmp_path / "stub.log"
    env = {
        "PATH": f"{venv}/bin:{os.environ['PATH']}",
        "SLURM_JOB_ID": "9",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "LONGHAUL_VENV": str(venv),
        "STUB_LOG": str(log),
    }
    proc = subprocess.Popen(
        ["bash", str(script)], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 60
        while not Path(f"{log}.started").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert Path(f"{log}.started").exists(), proc.stderr.read() if proc.poll() is not None else "no launcher"
        proc.send_signal(signal.SIGUSR1)
        _, err = proc.communicate(timeout=60)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the stubs' sleeps too, whatever the outcome
        except ProcessLookupError:
            pass
        proc.wait()
    assert proc.returncode == 0, err
    assert "stub launcher: checkpoint saved" in err and "checkpoint saved; requeueing job 9" in err, err
    assert log.read_text() == "requeue 9\n"


@pytest.mark.parametrize(
    ("runtime", "image"),
    [
        ("pyxis", "nvcr.io#nvidia/pytorch:24.01-py3"),
        ("pyxis", "user@registry.example.com:5000#team/longhaul:v1"),
        ("pyxis", "longhaul/trainer@sha256:" + "a" * 64),
        ("pyxis", "/images/longhaul.sqsh"),
        ("apptainer", "docker://ghcr.io/org/longhaul-trainer:0.3"),
        ("apptainer", "/images/longhaul.sif"),
    ],
)
def test_image_references_with_a_registry_and_tag_are_accepted_and_quoted(
    runtime: str, image: str, tmp_path: Path
) -> None:
    """Registry references (pyxis `REGISTRY#IMAGE:TAG`, apptainer `docker://…`) validate, and the script passes them
    to the runtime verbatim, quoted (`#` would start a bash comment)."""
    script = render_slurm(_exp("lata", spec__backends__slurm={"container": {"runtime": runtime, "image": image}}))
    _bash_n(script, tmp_path)
    # The runtime's arrays as bash builds them: the image is one word, whole.
    start = script.index("PYXIS=(")
    block = script[start : script.index("\n\n", start)]
    words = subprocess.run(
        ["bash", "-c", block + '\nprintf "%s\\n" "${PYXIS[@]}" "${CONTAINER[@]}"'],
        env={"SLURM_SUBMIT_DIR": "/submit", "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert (f"--container-image={image}" if runtime == "pyxis" else image) in words, words


@pytest.mark.parametrize("image", ["nvcr.io#-rm", "-e x", "docker://", "a#b#c", "x:1 y", "file:///etc/passwd#x"])
def test_malformed_image_references_are_refused(image: str) -> None:
    with pytest.raises(ValidationError, match="not an image"):
        _exp("lata", spec__backends__slurm={"container": {"runtime": "pyxis", "image": image}})
