"""Building the lab image through the Docker SDK. Host side only: workers never
import this module. Pure pieces (build arguments, tags, labels) are separate from the
one function that talks to the engine."""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lab.common import docker_api, kit, versions
from lab.common.docker_api import IMAGE_REPO, LABEL_PREFIX
from lab.common.kit import PACKAGES, REPO_ROOT, kit_version

FLAVORS = ("gpu", "cpu")
# The kit's extras an image installs (docker/Dockerfile's kit step names the same).
IMAGE_EXTRAS = ("train", "test")
KIT_REQUIREMENTS = "kit-requirements.txt"
GPU_OPERATIONS = ("NCCL", "MPI")


class BuildError(Exception):
    """Bad input, no engine, or a failed build: the message says what to do."""


@dataclass
class BuildSettings:
    flavor: str = "gpu"
    gpu_ops: str = ""           # GPU flavor: NCCL (when empty) or MPI; CPU flavor: none
    cuda: str = ""              # GPU flavor: a CUDA entry of the matrix (empty: CUDA_DEFAULT)
    base_image: str = ""        # empty: the matrix's base for the flavor (and CUDA)
    extra_ca: str = ""          # a CA bundle to trust in the image (and use for pip)
    wheelhouse: str = ""        # a folder of wheels pip looks at first
    torch_index: str = ""       # index URL for torch; empty: the matrix's; "default": pip's own
    with_torchvision: bool = True
    nccl_tests: bool = True     # GPU flavor: build nccl-tests (needs GitHub at build time)
    cuda_archs: str = ""        # GPU flavor: compute capabilities to compile for (empty: the matrix's)


def cuda_entries(matrix: dict[str, str]) -> list[str]:
    """The CUDA versions the matrix has a GPU entry for, e.g. ['13.0', '12.6']."""
    found = []
    for key in matrix:
        m = re.fullmatch(r"CUDA_(\d+)_(\d+)_BASE_IMAGE", key)
        if m:
            found.append(f"{m.group(1)}.{m.group(2)}")
    return found


def variant(s: BuildSettings, matrix: dict[str, str]) -> str:
    """The matrix prefix of the flavor's entries: CPU_ or CUDA_13_0_."""
    if s.flavor == "cpu":
        return "CPU_"
    return "CUDA_" + (s.cuda or matrix["CUDA_DEFAULT"]).replace(".", "_") + "_"


def archs(s: BuildSettings, matrix: dict[str, str]) -> str:
    """The compute capabilities the image's CUDA code is compiled for (Horovod's kernels,
    nccl-tests): --cuda-archs, a subset of the matrix's list, or the whole list. The
    image's cuda_archs label says which, and bench and doctor choose images by it."""
    return s.cuda_archs or matrix[variant(s, matrix) + "ARCHS"]


def gpu_ops(s: BuildSettings) -> str:
    return (s.gpu_ops or "NCCL") if s.flavor == "gpu" else ""


def check(s: BuildSettings, matrix: dict[str, str] | None = None) -> None:
    matrix = versions.read() if matrix is None else matrix
    if s.flavor not in FLAVORS:
        raise BuildError(f"--flavor takes gpu or cpu, not {s.flavor!r}")
    if s.gpu_ops and s.gpu_ops not in GPU_OPERATIONS:
        raise BuildError(f"--gpu-ops takes NCCL or MPI, not {s.gpu_ops!r}")
    if s.gpu_ops and s.flavor == "cpu":
        raise BuildError("--gpu-ops needs the GPU flavor: drop it for --flavor cpu")
    if s.cuda and s.flavor == "cpu":
        raise BuildError("--cuda needs the GPU flavor: drop it for --flavor cpu")
    if s.cuda and s.cuda not in cuda_entries(matrix):
        raise BuildError(f"--cuda {s.cuda}: the version matrix (docker/versions.env) has entries "
                         f"for CUDA {', '.join(cuda_entries(matrix))}; pick one of those")
    if s.extra_ca and not Path(s.extra_ca).is_file():
        raise BuildError(f"--extra-ca {s.extra_ca}: no such file; give a PEM certificate bundle")
    if s.extra_ca:
        try:
            text = Path(s.extra_ca).read_text(errors="replace")
        except OSError as e:
            raise BuildError(f"--extra-ca {s.extra_ca} cannot be read ({e.strerror})") from None
        if "-----BEGIN CERTIFICATE-----" not in text:
            raise BuildError(f"--extra-ca {s.extra_ca} holds no PEM certificate (no \"-----BEGIN "
                             f"CERTIFICATE-----\" line): give the proxy's CA in PEM form "
                             f"(openssl x509 -inform der -in CA.cer -out ca.pem converts a DER one)")
    if s.cuda_archs and s.flavor == "cpu":
        raise BuildError("--cuda-archs needs the GPU flavor: drop it for --flavor cpu")
    if s.cuda_archs:
        if not re.fullmatch(r"\d{2,3}(,\d{2,3})*", s.cuda_archs):
            raise BuildError(f"--cuda-archs takes compute capabilities like 80 or 80,90, "
                             f"not {s.cuda_archs!r}")
        allowed = matrix[variant(s, matrix) + "ARCHS"].split(",")
        extra = [a for a in s.cuda_archs.split(",") if a not in allowed]
        if extra:
            raise BuildError(f"--cuda-archs {s.cuda_archs}: CUDA {s.cuda or matrix['CUDA_DEFAULT']}'s "
                             f"entry supports {', '.join(allowed)}; pick from those")
    if s.wheelhouse and not Path(s.wheelhouse).is_dir():
        raise BuildError(f"--wheelhouse {s.wheelhouse}: no such folder")


def build_args(s: BuildSettings, matrix: dict[str, str]) -> dict[str, str]:
    """The Dockerfile's build arguments, every version from the matrix."""
    v = variant(s, matrix)
    index = s.torch_index or matrix[v + "TORCH_INDEX_URL"]
    args = {
        "BASE_IMAGE": s.base_image or matrix[v + "BASE_IMAGE"],
        "FLAVOR": s.flavor,
        "TORCH_VERSION": matrix["TORCH_VERSION"],
        "TORCHVISION_VERSION": matrix["TORCHVISION_VERSION"] if s.with_torchvision else "",
        "TORCH_INDEX_URL": "" if index == "default" else index,
        "SETUPTOOLS_VERSION": matrix["SETUPTOOLS_VERSION"],
        "WHEEL_VERSION": matrix["WHEEL_VERSION"],
        "HOROVOD_VERSION": matrix["HOROVOD_VERSION"],
        "HOROVOD_SHA256": matrix["HOROVOD_SHA256"],
        "HOROVOD_GPU_OPERATIONS": gpu_ops(s),
        "ONECCL_VERSION": matrix["ONECCL_VERSION"],
        "ONECCL_SHA256": matrix["ONECCL_SHA256"],
        "DEEPSPEED_VERSION": matrix.get("DEEPSPEED_VERSION", ""),
    }
    if s.flavor == "gpu":
        args.update({
            "OPENMPI_VERSION": matrix["OPENMPI_VERSION"],
            "OPENMPI_URL": matrix["OPENMPI_URL"],
            "OPENMPI_SHA256": matrix["OPENMPI_SHA256"],
            "EXPECT_NCCL_VERSION": matrix[v + "NCCL_VERSION"],
            "CUDA_ARCHS": archs(s, matrix),
            "NCCL_TESTS": "1" if s.nccl_tests else "0",
            "NCCL_TESTS_VERSION": matrix["NCCL_TESTS_VERSION"],
            "NCCL_TESTS_COMMIT": matrix["NCCL_TESTS_COMMIT"],
        })
    return args


def tags(s: BuildSettings, version: str, matrix: dict[str, str] | None = None) -> list[str]:
    """dl-lab-kit:cpu, dl-lab-kit:gpu-nccl, dl-lab-kit:gpu-mpi-cu126 (a CUDA other than
    the default is named), each also with -<kit version>."""
    name = s.flavor
    if s.flavor == "gpu":
        matrix = versions.read() if matrix is None else matrix
        name += "-" + gpu_ops(s).lower()
        if s.cuda and s.cuda != matrix["CUDA_DEFAULT"]:
            name += "-cu" + s.cuda.replace(".", "")
    return [f"{IMAGE_REPO}:{name}", f"{IMAGE_REPO}:{name}-{version}"]


def labels(s: BuildSettings, args: dict[str, str], matrix: dict[str, str],
           version: str) -> dict[str, str]:
    """The versions in the image as labels; every results record carries them."""
    out = {LABEL_PREFIX + k.lower(): v for k, v in args.items()
           if v and k not in ("NCCL_TESTS", "CUDA_ARCHS", "EXPECT_NCCL_VERSION")}
    out[LABEL_PREFIX + "kit_version"] = version
    if s.flavor == "gpu":
        v = variant(s, matrix)
        out[LABEL_PREFIX + "cuda_version"] = s.cuda or matrix["CUDA_DEFAULT"]
        out[LABEL_PREFIX + "nccl_version"] = matrix[v + "NCCL_VERSION"]     # torch's NCCL wheel
        out[LABEL_PREFIX + "cudnn_version"] = matrix[v + "CUDNN_VERSION"]
        out[LABEL_PREFIX + "cuda_archs"] = archs(s, matrix)
        out[LABEL_PREFIX + "cuda_ptx"] = matrix.get(v + "PTX", "0")
        if not s.nccl_tests:
            out.pop(LABEL_PREFIX + "nccl_tests_version", None)
            out.pop(LABEL_PREFIX + "nccl_tests_commit", None)
    return out


def kit_requirements(extras=IMAGE_EXTRAS) -> list[str]:
    """The kit's dependencies with those extras (installed metadata), a layer before Horovod's:
    editing the kit re-runs only its own install, which resolves them again."""
    from importlib import metadata
    try:
        from packaging.requirements import Requirement
        reqs = [Requirement(r) for r in metadata.requires(kit.DIST_NAME) or []]
    except Exception:           # the kit not installed, or no packaging: the kit's step does it all
        return []
    return [str(r).split(";")[0].strip() for r in reqs if r.marker is None or (
        not _environment_marker(r.marker) and any(r.marker.evaluate({"extra": e}) for e in extras))]


def _environment_marker(marker) -> bool:
    """The marker names more than `extra` (python_version...): pip decides it in the image."""
    unquoted = re.sub(r"\"[^\"]*\"|'[^']*'", "", str(marker))
    return bool(set(re.findall(r"[A-Za-z_][\w.]*", unquoted)) - {"extra", "and", "or", "in", "not"})


def assemble_context(dest: Path, s: BuildSettings) -> None:
    """Copy what the Dockerfile needs into dest."""
    (dest / KIT_REQUIREMENTS).write_text("".join(f"{r}\n" for r in kit_requirements()))
    for item in ("docker", *PACKAGES):
        shutil.copytree(REPO_ROOT / item, dest / item,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for item in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO_ROOT / item, dest / item)
    (dest / "extra-ca").mkdir()
    if s.extra_ca:
        shutil.copy2(s.extra_ca, dest / "extra-ca" / "extra-ca.crt")
    (dest / "wheelhouse").mkdir()
    if s.wheelhouse:
        for whl in Path(s.wheelhouse).glob("*.whl"):
            try:
                os.link(whl, dest / "wheelhouse" / whl.name)  # no copy on the same file system
            except OSError:
                shutil.copy2(whl, dest / "wheelhouse" / whl.name)


def connect():
    """A Docker client with a long read timeout (a build step may print nothing for
    minutes), or BuildError saying how to start an engine."""
    try:
        return docker_api.client(timeout=600)
    except docker_api.DockerUnavailable as e:
        raise BuildError(f"{e}: {docker_api.START_HINT} and try again") from None


def build(s: BuildSettings, echo=print) -> str:
    """Build the image, streaming its progress; returns the image id."""
    matrix = versions.read()
    check(s, matrix)
    args = build_args(s, matrix)
    version = kit_version()
    image_tags = tags(s, version, matrix)
    client = connect()
    with tempfile.TemporaryDirectory(prefix="lab-build-") as ctx:
        assemble_context(Path(ctx), s)
        step, log = "", []
        image_id = None
        stream = client.api.build(path=ctx, dockerfile="docker/Dockerfile", buildargs=args,
                                  tag=image_tags[0], labels=labels(s, args, matrix, version), rm=True,
                                  forcerm=True, decode=True)
        for chunk in stream:
            if "stream" in chunk:
                for line in chunk["stream"].splitlines():
                    if line.startswith("Step "):
                        step, log = line, []
                    log.append(line)
                    echo(line)
            elif "error" in chunk:
                tail = "\n".join(log[-25:])
                hint = ""
                if not step or " : FROM " in step:
                    hint = (f" The base image {args['BASE_IMAGE']} could not be had: pull it "
                            f"(`docker pull {args['BASE_IMAGE']}`) or pass --base-image with one "
                            f"this engine has (docker/make-base-image.sh and "
                            f"docker/make-cuda-base-image.sh make them without a registry).")
                raise BuildError(f"the image build failed at {step or 'its start'}: "
                                 f"{chunk['error'].strip()}.{hint}\n--- end of that step's log ---\n{tail}")
            elif "aux" in chunk and "ID" in chunk["aux"]:
                image_id = chunk["aux"]["ID"]
    if image_id is None:
        raise BuildError("the engine finished the build without an image id; see the log above")
    image = client.images.get(image_id)
    for t in image_tags[1:]:
        repo, tag = t.split(":")
        image.tag(repo, tag)
    echo(f"built {image.short_id} as {', '.join(image_tags)}")
    return image_id


