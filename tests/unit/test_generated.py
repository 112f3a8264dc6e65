"""Generated files (JSON schema, CRD, golden renders, README field reference) match the schema: no drift."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("longhaul_generate", ROOT / "scripts" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_files_are_up_to_date() -> None:
    gen = _generator()
    expected = gen.expected_files()
    stale = [str(p.relative_to(ROOT)) for p, text in expected.items() if not p.exists() or p.read_text() != text]
    orphans = [str(p.relative_to(ROOT)) for p in gen.orphan_goldens(expected)]
    assert not stale and not orphans, f"run `make generate` and review the diff: stale {stale}, orphans {orphans}"


def test_every_spec_has_golden_renders_for_every_backend() -> None:
    from longhaul.render import BACKENDS

    for spec in sorted((ROOT / "specs").glob("*.yaml")):
        for backend in BACKENDS:
            assert list((ROOT / "tests" / "golden" / spec.stem).glob(f"{backend}.*")), (spec.stem, backend)


def _openapi_to_jsonschema(node):
    """OpenAPI 3.0 `nullable: true` means "or null" (the API server honours it); jsonschema needs it spelled out."""
    if isinstance(node, list):
        return [_openapi_to_jsonschema(v) for v in node]
    if not isinstance(node, dict):
        return node
    node = {k: _openapi_to_jsonschema(v) for k, v in node.items()}
    if node.pop("nullable", False):
        if "type" in node:
            node["type"] = [node["type"], "null"]
        if "enum" in node:
            node["enum"] = [*node["enum"], None]
    return node


def _crd_schema() -> dict:
    crd = yaml.safe_load((ROOT / "charts" / "longhaul" / "crds" / "experiments.longhaul.dev.yaml").read_text())
    schema = _openapi_to_jsonschema(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    # CRDs use OpenAPI 3.0, whose keywords match JSON schema draft 4 (boolean exclusiveMinimum).
    return {"$schema": "http://json-schema.org/draft-04/schema#", **schema}


@pytest.mark.parametrize("spec", sorted((ROOT / "specs").glob("*.yaml")), ids=lambda p: p.stem)
def test_spec_validates_against_generated_crd_schema(spec: Path) -> None:
    doc = yaml.safe_load(spec.read_text())
    jsonschema.Draft4Validator(_crd_schema()).validate(doc)


def test_crd_schema_rejects_what_pydantic_rejects() -> None:
    doc = yaml.safe_load((ROOT / "specs" / "lata.yaml").read_text())
    doc["spec"]["algorithm"]["advantage"] = "lata2"
    with pytest.raises(jsonschema.ValidationError, match="lata2"):
        jsonschema.Draft4Validator(_crd_schema()).validate(doc)


def test_check_jsonschema_cli_accepts_specs(tmp_path: Path) -> None:
    """The real `check-jsonschema` tool, as an editor or CI step would use it, against the committed schema."""
    schema_file = tmp_path / "experiment.crd.schema.json"
    schema_file.write_text(json.dumps(_crd_schema()))
    specs = [str(p) for p in sorted((ROOT / "specs").glob("*.yaml"))]
    exe = Path(sys.executable).with_name("check-jsonschema")
    res = subprocess.run([str(exe), "--schemafile", str(schema_file), *specs], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    res = subprocess.run(
        [str(exe), "--schemafile", str(ROOT / "specs" / "experiment.schema.json"), *specs],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_crd_is_valid_for_kubernetes() -> None:
    import kubernetes_validate

    crd = yaml.safe_load((ROOT / "charts" / "longhaul" / "crds" / "experiments.longhaul.dev.yaml").read_text())
    kubernetes_validate.validate(crd, "1.32", strict=True)
    cols = {c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert {"Phase", "Run", "MLflow", "Age"} <= cols
    assert crd["spec"]["versions"][0]["subresources"] == {"status": {}}


@pytest.mark.parametrize("spec", sorted((ROOT / "specs").glob("*.yaml")), ids=lambda p: p.stem)
def test_rendered_kubernetes_objects_pass_official_schemas(spec: Path) -> None:
    import kubernetes_validate

    from longhaul.render.kubernetes import render_kubernetes
    from longhaul.spec import load_spec

    objs = render_kubernetes(load_spec(spec))
    assert objs
    for obj in objs:
        if obj["apiVersion"].startswith(("batch/", "v1")) or obj["apiVersion"] == "v1":
            kubernetes_validate.validate(obj, "1.32", strict=True)


@pytest.mark.parametrize("spec", sorted((ROOT / "specs").glob("*.yaml")), ids=lambda p: p.stem)
def test_rendered_sbatch_is_valid_bash(spec: Path) -> None:
    from longhaul.render.slurm import render_slurm
    from longhaul.spec import load_spec

    res = subprocess.run(["bash", "-n"], input=render_slurm(load_spec(spec)), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
