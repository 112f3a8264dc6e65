"""`longhaul models check`: resolve every model a spec needs offline, exactly as the container will, and fail
fast with a message that names the missing model and how to bake it.

A model is found by `path` (a directory, relative to the working directory) when the spec gives one, else by
`name` (and `revision`, default the baked `main`) in the Hugging Face cache under HF_HOME — never over the
network. A model counts as present when its directory has `config.json` and weights (`*.safetensors`/`*.bin`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from longhaul.commands import fail_on_spec_error, plain_console

if TYPE_CHECKING:
    from longhaul.spec import Experiment
    from longhaul.spec.serving import ModelRef

err = plain_console(stderr=True)
out = plain_console()

WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")


class ModelNotBaked(LookupError):
    """A model the spec needs is not available offline (message says where it looked and how to fix it)."""


@dataclass(frozen=True)
class NeededModel:
    role: str  # "policy" | "user_simulator"
    field: str  # dotted spec path of the ModelRef
    ref: ModelRef


def needed_models(exp: Experiment) -> list[NeededModel]:
    """The models a run of `exp` loads inside the job: the policy, a colocated simulator, and the SFT teacher
    when trajectories are collected in the job (no dataset, no teacher URL); each distinct model once."""
    # deferred: the spec's pydantic models (~0.2 s): `longhaul --help` imports this module, a caller holds `exp`
    from longhaul.spec.models import Stage
    from longhaul.spec.simulator import Placement

    spec = exp.spec
    models = [NeededModel("policy", "spec.policy.model", spec.policy.model)]
    if spec.user_simulator.placement == Placement.COLOCATED:
        models.append(NeededModel("user_simulator", "spec.user_simulator.model", spec.user_simulator.model))
    sft = spec.sft
    if Stage.SFT in spec.stages and sft is not None and sft.dataset is None and sft.teacher.url is None:
        models.append(NeededModel("sft_teacher", "spec.sft.teacher.model", sft.teacher.model))
    unique: dict[ModelRef, NeededModel] = {}
    for m in models:
        unique.setdefault(m.ref, m)
    return list(unique.values())


def _check_complete(directory: Path, what: str) -> Path:
    if not (directory / "config.json").is_file():
        raise ModelNotBaked(f"{what}: {directory} has no config.json (an incomplete download or the wrong directory)")
    if not any(next(directory.glob(p), None) for p in WEIGHT_PATTERNS):
        raise ModelNotBaked(f"{what}: {directory} has config.json but no weights (*.safetensors or *.bin)")
    return directory


def find_baked_model(ref: ModelRef, *, field: str = "model", cwd: Path | None = None) -> Path:
    """Directory of `ref` on this machine without any network access; raises ModelNotBaked otherwise."""
    if ref.path:
        path = Path(ref.path).expanduser()
        if not path.is_absolute():
            path = (cwd or Path.cwd()) / path
        if not path.is_dir():
            raise ModelNotBaked(
                f"{field}.path: model directory {path} does not exist; mount it there or remove `path` to "
                f"resolve '{ref.name}' in HF_HOME"
            )
        return _check_complete(path, f"{field}.path")

    revision = ref.revision or "main"
    hf_home = os.environ.get("HF_HOME", "~/.cache/huggingface")
    # Read at call time (huggingface_hub reads its variables once, at import).
    cache_dir = Path(os.environ.get("HF_HUB_CACHE") or Path(hf_home).expanduser() / "hub")
    arg = "POLICY" if "policy" in field else "SIMULATOR"  # the teacher is served like the simulator
    hint = (
        f"bake it into the image (build args MODEL_SRC=hub {arg}_MODEL={ref.name} {arg}_REVISION=<40-hex commit>, "
        f"images/README.md) or mount its directory and set {field}.path"
    )
    try:
        # deferred: huggingface_hub (~0.1 s), optional: only a model resolved by name needs it
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError as exc:  # pragma: no cover - every image stack ships huggingface_hub
        raise ModelNotBaked(f"{field}: resolving '{ref.name}' by name needs huggingface_hub ({exc})") from exc
    try:
        snapshot = Path(snapshot_download(ref.name, revision=revision, cache_dir=cache_dir, local_files_only=True))
    except LocalEntryNotFoundError:
        raise ModelNotBaked(
            f"{field}.name: model '{ref.name}' (revision {revision}) is not baked: not in the Hugging Face "
            f"cache {cache_dir} (HF_HOME={hf_home}; looked offline only); {hint}"
        ) from None
    return _check_complete(snapshot, f"{field}.name '{ref.name}'")


def register(app: typer.Typer) -> None:
    models = typer.Typer(help="Models baked into the image.", no_args_is_help=True)

    @models.command("check")
    def check(
        files: Annotated[list[Path], typer.Argument(help="Experiment YAML files.")],
    ) -> None:
        """Resolve every model the specs need offline (HF_HOME or `path`); exit 1 naming each missing one."""
        from longhaul.spec import SpecError, load_specs  # deferred: the spec's pydantic models (~0.2 s)

        try:
            exps = load_specs(list(files))
        except SpecError as exc:
            fail_on_spec_error(exc)
        missing = 0
        for f, exp in zip(files, exps, strict=True):
            for need in needed_models(exp):
                try:
                    where = find_baked_model(need.ref, field=need.field)
                except ModelNotBaked as exc:
                    missing += 1
                    err.print(f"error {f}: {exc}")
                else:
                    out.print(f"ok {f} {need.role} {need.ref.name} -> {where}")
        if missing:
            err.print(f"{missing} model(s) missing; the job would fail at start.")
            raise typer.Exit(1)

    app.add_typer(models, name="models")
