"""Pure renderers: spec → Kubernetes objects | sbatch script | veRL overrides | launch plan.

`render(exp, backend)` returns the exact text that `longhaul render` prints, `--out DIR` writes, golden
files pin, and `submit` ships. Rendering never queries a cluster.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import yaml

from longhaul.layout import Paths, default_run_dir
from longhaul.render.kubernetes import render_kubernetes
from longhaul.render.plan import render_plan
from longhaul.render.slurm import render_slurm
from longhaul.render.verl import render_verl_overrides
from longhaul.spec.models import Experiment
from longhaul.spec.naming import run_name, seed_runs

BACKENDS = ("kubernetes", "slurm", "verl", "local")


@dataclass(frozen=True)
class Rendered:
    """Files produced by a renderer: name → text."""

    backend: str
    files: dict[str, str]

    def text(self) -> str:
        """All files as one printable text (file headers when there are several)."""
        if len(self.files) == 1:
            return next(iter(self.files.values()))
        return "".join(f"# ---- {name} ----\n{body}" for name, body in self.files.items())


def _yaml_docs(objs: list[dict]) -> str:
    return "".join("---\n" + yaml.safe_dump(o, sort_keys=False, width=1_000_000) for o in objs)


def render(exp: Experiment, backend: str, *, run_dir: str | None = None) -> Rendered:
    """Render `exp` for `backend` (one of BACKENDS)."""
    name = run_name(exp)
    if backend == "kubernetes":
        return Rendered(backend, {f"{name}.k8s.yaml": _yaml_docs(render_kubernetes(exp))})
    if backend == "slurm":
        return Rendered(backend, {f"{name}.sbatch": render_slurm(exp)})
    if backend not in ("verl", "local"):
        raise ValueError(f"unknown backend '{backend}'; valid: {', '.join(BACKENDS)}")
    runs = seed_runs(exp)
    if run_dir is not None and len(runs) > 1:
        raise ValueError(
            f"a run directory names one run; this spec has {len(runs)} training seeds (one run directory "
            "each, named after the seed run): drop the run directory"
        )
    files: dict[str, str] = {}
    for r in runs:
        name = run_name(r)
        if backend == "verl":
            paths = Paths.under(run_dir or default_run_dir(r, "kubernetes"))
            files[f"{name}.verl-overrides.txt"] = "\n".join(render_verl_overrides(r, paths)) + "\n"
        else:
            plan = render_plan(r, "local", run_dir or default_run_dir(r, "local"))
            files[f"{name}.plan.json"] = json.dumps(plan.to_dict(), indent=2) + "\n"
    return Rendered(backend, files)
