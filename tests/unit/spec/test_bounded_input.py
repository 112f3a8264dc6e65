"""Hostile spec files are refused fast, in little memory, with one `file:line path: message; fix` line.

Everywhere a spec is read goes through `longhaul.bounded.SPEC`: `load_spec` (CLI validate/render/submit/run,
the launcher's re-validation), `parse_spec_text` (the operator's ConfigMap read-back) and `build_experiment`
(the operator's already-parsed custom resources). Timings are asserted generously (shared CI machines); the
measured ones are far lower (see the README).
"""

from __future__ import annotations

import io
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from longhaul import bounded
from longhaul.cli import app
from longhaul.spec import SpecError, build_experiment, load_spec, parse_spec_text, resolved_yaml, run_name

ROOT = Path(__file__).resolve().parents[3]
HEAD = "apiVersion: longhaul.dev/v1alpha1\nkind: Experiment\nmetadata: {name: x}\n"

RECURSIVE_ALIAS = HEAD + "spec: &a {x: *a}\n"


def _billion_laughs(levels: int = 9, width: int = 9) -> str:
    lines = [HEAD.rstrip("\n"), "a0: &a0 [" + ", ".join(['"lol"'] * width) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels + 1)]
    return "\n".join([*lines, f"spec: *a{levels}"]) + "\n"


def _refuse(path: Path) -> tuple[str, float, int]:
    """(message, seconds, peak traced bytes) of loading a file that must be refused."""
    t0 = time.monotonic()
    with pytest.raises(SpecError) as first:
        load_spec(path)
    seconds = time.monotonic() - t0
    tracemalloc.start()
    try:
        with pytest.raises(SpecError):
            load_spec(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return str(first.value), seconds, peak


@pytest.mark.parametrize(
    ("name", "text", "line", "needle"),
    [
        ("recursive.yaml", RECURSIVE_ALIAS, 4, "spec: YAML anchors are not allowed (got '&a')"),
        ("laughs.yaml", _billion_laughs(), 4, "a0: YAML anchors are not allowed (got '&a0')"),
    ],
)
def test_alias_bombs_are_refused_fast_in_one_line(tmp_path: Path, name: str, text: str, line: int, needle: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    msg, seconds, peak = _refuse(path)
    assert msg.startswith(f"{path}:{line} ") and needle in msg and "\n" not in msg, msg
    assert "write the value out in full" in msg
    assert seconds < 5, seconds
    assert peak < 100 * 2**20, peak


def test_alias_bombs_through_the_cli_exit_2_without_traceback(tmp_path: Path) -> None:
    for name, text in (("recursive.yaml", RECURSIVE_ALIAS), ("laughs.yaml", _billion_laughs())):
        path = tmp_path / name
        path.write_text(text)
        for cmd in (["validate", str(path)], ["render", str(path), "--backend", "local"]):
            t0 = time.monotonic()
            res = CliRunner().invoke(app, cmd)
            assert time.monotonic() - t0 < 5
            assert res.exit_code == 2, res.output
            assert f"{path}:4" in res.output and "anchors are not allowed" in res.output
            assert "Traceback" not in res.output and "RecursionError" not in res.output


def test_launcher_revalidation_refuses_an_alias_bomb(tmp_path: Path) -> None:
    from longhaul.launcher import EXIT_USAGE, supervisor

    path = tmp_path / "experiment.yaml"
    path.write_text(_billion_laughs())
    echo = io.StringIO()
    assert supervisor.launch(path, "local", tmp_path / "run", environ={}, echo=echo) == EXIT_USAGE
    assert f"{path}:4 a0: YAML anchors are not allowed" in echo.getvalue()


@pytest.mark.parametrize(
    ("text", "line", "path", "needle"),
    [
        # an alias without its anchor, and a merge key (needs an alias)
        (HEAD + "spec: *nowhere\n", 4, "spec", "YAML aliases are not allowed (got '*nowhere')"),
        (HEAD + "base: &b {seed: 1}\nspec:\n  algorithm: {<<: *b}\n", 4, "base", "anchors are not allowed"),
        # block nesting past 32 levels: refused with the field path, before the 33rd level is built
        (
            HEAD + "spec:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 40)) + "  " * 40 + "v: 1\n",
            35,
            "spec.k1.k2",
            "nested deeper than the 32 levels allowed in an Experiment spec",
        ),
        # flow nesting: refused by the scanner (its look-ahead would be quadratic in the depth)
        (HEAD + "spec: " + "[" * 30_000 + "]" * 30_000 + "\n", 4, "", "nested deeper than the 32 levels"),
        (HEAD + "spec: " + "{a: " * 10_000 + "}" * 10_000 + "\n", 4, "spec.a.a.a", "nested deeper than the 32 levels"),
        # nested explicit keys do not lengthen the field path, but count as depth
        (HEAD + "spec:\n  " + "? " * 3_000 + "a\n", 5, "spec", "nested deeper than the 32 levels"),
        # an integer Python refuses to convert (over 4,300 digits) is a one-line problem, not a ValueError
        (HEAD + "spec: {seed: " + "9" * 5_000 + "}\n", 4, "spec.seed", "value cannot be read as int"),
        # too many nodes: counted while composing, refused at node 5,001
        (HEAD + "spec:\n  x: [" + ",".join(["1"] * 20_000) + "]\n", 5, "spec.x[4987]", "more than 5,000 YAML nodes"),
        (HEAD + "spec:\n  x:\n" + "  - 1\n" * 9_000, 4993, "spec.x[4987]", "more than 5,000 YAML nodes"),
        # thousands of documents: refused at the second
        (HEAD + "---\n" * 10_000, 4, "", "expected one YAML document, found a second one"),
    ],
)
def test_deep_wide_and_multi_document_specs_refused(
    tmp_path: Path, text: str, line: int, path: str, needle: str
) -> None:
    f = tmp_path / "hostile.yaml"
    f.write_text(text)
    msg, seconds, peak = _refuse(f)
    assert msg.startswith(f"{f}:{line}{' ' + path if path else ''}") and needle in msg, msg
    assert "\n" not in msg
    assert seconds < 5 and peak < 100 * 2**20, (seconds, peak)


def test_oversized_spec_refused_without_reading_it_whole(tmp_path: Path) -> None:
    f = tmp_path / "big.yaml"
    f.write_text(HEAD + "spec:\n" + "  # padding\n" * 2_000_000)  # 24 MB
    msg, seconds, peak = _refuse(f)
    limit_line = (bounded.SPEC.max_bytes - len(HEAD) - len("spec:\n")) // len("  # padding\n") + 5
    assert msg.startswith(f"{f}:{limit_line}: file is larger than the 64 KiB limit of an Experiment spec"), msg
    assert "24,000," in msg and seconds < 5 and peak < 10 * 2**20, (msg, seconds, peak)
    with pytest.raises(SpecError, match="larger than the 64 KiB limit"):
        parse_spec_text(HEAD + "#" * (bounded.SPEC.max_bytes + 1), "configmap x")


def test_non_utf8_spec_names_the_line(tmp_path: Path) -> None:
    f = tmp_path / "latin1.yaml"
    f.write_bytes(HEAD.encode() + "spec: {x: 'caf\xe9'}\n".encode("latin-1"))
    with pytest.raises(SpecError, match=r"latin1.yaml:4: not UTF-8 text"):
        load_spec(f)


def test_operator_bodies_are_bounded_before_they_are_copied() -> None:
    """Custom resources arrive parsed (JSON from the API server): depth and size are checked on the data."""
    from longhaul.k8s.reconcile import validate_body

    deep: dict = {"v": 1}
    for _ in range(5_000):  # deeper than copy.deepcopy or pydantic could recurse
        deep = {"a": deep}
    body = {
        "apiVersion": "longhaul.dev/v1alpha1",
        "kind": "Experiment",
        "metadata": {"name": "x", "namespace": "team"},
        "spec": deep,
    }
    msg = validate_body(body)
    assert isinstance(msg, str) and msg.startswith("team/x spec.a.a") and "nested deeper than the 32 levels" in msg
    wide = dict(body, spec={"environment": {"split": {"preset": "explicit", "train": list(range(6_000))}}})
    msg = validate_body(wide)
    assert isinstance(msg, str) and "more than 5,000 values" in msg
    with pytest.raises(SpecError, match="nested deeper"):
        build_experiment({"apiVersion": "longhaul.dev/v1alpha1", "kind": "Experiment", "spec": deep}, "api")


def test_operator_configmap_read_back_refuses_aliases() -> None:
    import asyncio

    from longhaul import constants as C
    from longhaul.k8s.reconcile import load_running

    class Api:
        async def list(self, *_a):  # noqa: ANN202
            return [{"metadata": {"name": "cm"}, "data": {C.SPEC_FILENAME: _billion_laughs()}}]

    body = {"metadata": {"namespace": "team"}, "status": {"runName": "x-12345678", "phase": "Running"}}
    t0 = time.monotonic()
    assert asyncio.run(load_running(Api(), body)) is None  # refused (not expanded): treated as no running spec
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("path", sorted((ROOT / "specs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_and_resolved_specs_fit_well_inside_the_limits(path: Path) -> None:
    """What jobs mount (the resolved spec) is re-validated with the same bounds: it must never need anchors."""
    exp = load_spec(path)
    text = resolved_yaml(exp)
    # yaml.safe_dump writes anchors for objects it meets twice; the resolved spec must have none
    assert not any(getattr(e, "anchor", None) for e in yaml.parse(text, Loader=yaml.SafeLoader))
    assert run_name(parse_spec_text(text, "resolved")) == run_name(exp)
    assert len(text.encode()) * 10 < bounded.SPEC.max_bytes
    assert len(path.read_bytes()) * 10 < bounded.SPEC.max_bytes
