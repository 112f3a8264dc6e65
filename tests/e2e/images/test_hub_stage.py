"""The trainer's `models-hub` stage for real: `hf download` of pinned commits at build time, with the token as a
build secret, from a Hub stand-in on 127.0.0.1 (HF_ENDPOINT, the same knob a site with a Hub mirror uses).
Proves: the token reaches the download, appears in no layer, no history entry and not in the exported archive;
the baked models resolve offline by name; they are world-readable."""

from __future__ import annotations

import io
import runpy
import subprocess
import tarfile
from pathlib import Path

import pytest
from fake_hub import FakeHub
from images_harness import BAKED_REPO, BAKED_USER, ROOT, build, mount, run, sh, write_spec

pytestmark = [pytest.mark.images, pytest.mark.slow]

HUB_IMAGE = "localhost/longhaul-trainer:ci-hub"
TOKEN = "hf_longhaulBuildSecret0123456789"


def test_hub_stage_bakes_pinned_models_with_token_as_build_secret(base_image: str, tmp_path: Path) -> None:
    tiny = runpy.run_path(str(ROOT / "images" / "tiny-model.py"))
    repos = {}
    for repo in (BAKED_REPO, BAKED_USER):
        snap = tiny["write_model"](tmp_path / "src", repo)
        repos[repo] = (snap.name, {p.name: p.read_bytes() for p in snap.iterdir()})
    token_file = tmp_path / "hf_token"
    token_file.write_text(TOKEN)

    with FakeHub(repos) as hub:
        build(
            "trainer",
            "STACK=cpu-min",
            f"BUILDER_IMAGE={base_image}",
            f"BASE_IMAGE={base_image}",
            "MODEL_SRC=hub",
            f"POLICY_MODEL={BAKED_REPO}",
            f"POLICY_REVISION={repos[BAKED_REPO][0]}",
            f"SIMULATOR_MODEL={BAKED_USER}",
            f"SIMULATOR_REVISION={repos[BAKED_USER][0]}",
            f"HF_ENDPOINT={hub.url}",
            "BUILD_NETWORK=host",
            f"HF_TOKEN_FILE={token_file}",
            f"IMAGE={HUB_IMAGE}",
        )
    assert f"Bearer {TOKEN}" in hub.authorization, hub.requests
    assert any("/resolve/" in r and "model.safetensors" in r for r in hub.requests)

    specs = tmp_path / "specs"
    specs.mkdir(mode=0o755)
    write_spec(specs / "baked.yaml", BAKED_REPO, BAKED_USER)
    res = run(HUB_IMAGE, "models", "check", "/specs/baked.yaml", opts=("--user", "4242:4242", *mount(specs)))
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("ok /specs/baked.yaml") == 2

    secrets = run(HUB_IMAGE, "-c", "test ! -e /run/secrets/hf_token && echo absent", opts=("--entrypoint", "bash"))
    assert secrets.stdout.strip() == "absent"
    history = sh("podman", "history", "--no-trunc", "--format", "{{.CreatedBy}}", HUB_IMAGE, check=True).stdout
    assert TOKEN not in history
    archive = tmp_path / "hub.tar"
    sh("podman", "save", "--format", "docker-archive", "-o", str(archive), HUB_IMAGE, check=True, timeout=600)
    with tarfile.open(archive) as outer:
        for member in outer.getmembers():
            if member.isfile():
                data = outer.extractfile(member).read()
                assert TOKEN.encode() not in data, member.name
                if member.name.endswith(".tar") or member.name.endswith("/layer.tar"):
                    with tarfile.open(fileobj=io.BytesIO(data)) as layer:
                        for f in layer.getmembers():
                            if f.isfile():
                                assert TOKEN.encode() not in layer.extractfile(f).read(), (
                                    member.name,
                                    f.name,
                                )
    subprocess.run(["podman", "rmi", "-f", HUB_IMAGE], capture_output=True, timeout=120)
