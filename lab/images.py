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

from lab import versions

REPO_ROOT = Path(__file__).resolve().parent.parent
IMAGE_REPO = "dl-lab-kit"
LABEL_PREFIX = "org.dl-lab-kit."
FLAVORS = ("cpu",)            # the GPU flavor is not built yet
GPU_OPERATIONS = ("NCCL", "MPI")


class BuildError(Exception):
    """Bad input, no engine, or a failed build: the message says what to do."""


@dataclass
class BuildSettings:
    flavor: str = "cpu"
    gpu_ops: str = ""
    base_image: str = ""        # empty: the matrix's base for the flavor
    extra_ca: str = ""          # a CA bundle to trust in the image (and use for pip)
    wheelhouse: str = ""        # a folder of wheels pip looks at first
    torch_index: str = ""       # an index URL for torch/torchvision
    with_torchvision: bool = False


def check(s: BuildSettings) -> None:
    if s.flavor not in FLAVORS:
        raise BuildError(f"--flavor {s.flavor!r} cannot be built yet: use --flavor cpu "
                         f"(the GPU flavor is an open issue)")
    if s.gpu_ops and s.gpu_ops not in GPU_OPERATIONS:
        raise BuildError(f"--gpu-ops takes NCCL or MPI, not {s.gpu_ops!r}")
    if s.gpu_ops and s.flavor == "cpu":
        raise BuildError("--gpu-ops needs the GPU flavor: drop it for --flavor cpu")
    if s.extra_ca and not Path(s.extra_ca).is_file():
        raise BuildError(f"--extra-ca {s.extra_ca}: no such file; give a PEM certificate bundle")
    if s.wheelhouse and not Path(s.wheelhouse).is_dir():
        raise BuildError(f"--wheelhouse {s.wheelhouse}: no such folder")


def build_args(s: BuildSettings, matrix: dict[str, str]) -> dict[str, str]:
    """The Dockerfile's build arguments, every version from the matrix."""
    base = s.base_image or matrix[f"BASE_IMAGE_{s.flavor.upper()}"]
    return {
        "BASE_IMAGE": base,
        "FLAVOR": s.flavor,
        "TORCH_VERSION": matrix["TORCH_VERSION"],
        "TORCHVISION_VERSION": matrix["TORCHVISION_VERSION"] if s.with_torchvision else "",
        "TORCH_INDEX_URL": s.torch_index,
        "SETUPTOOLS_VERSION": matrix["SETUPTOOLS_VERSION"],
        "WHEEL_VERSION": matrix["WHEEL_VERSION"],
        "HOROVOD_VERSION": matrix["HOROVOD_VERSION"],
        "HOROVOD_SHA256": matrix["HOROVOD_SHA256"],
        "HOROVOD_GPU_OPERATIONS": s.gpu_ops,
    }


def kit_version() -> str:
    text = (REPO_ROOT / "pyproject.toml").read_text()
    m = re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE)
    return m.group(1) if m else "0"


def tags(s: BuildSettings, version: str) -> list[str]:
    """dl-lab-kit:cpu and dl-lab-kit:cpu-<kit version> (gpu-nccl, gpu-mpi likewise)."""
    name = s.flavor + (f"-{s.gpu_ops.lower()}" if s.gpu_ops else "")
    return [f"{IMAGE_REPO}:{name}", f"{IMAGE_REPO}:{name}-{version}"]


def labels(args: dict[str, str], version: str) -> dict[str, str]:
    """The matrix as image labels; every results record carries them."""
    out = {LABEL_PREFIX + k.lower(): v for k, v in args.items() if v}
    out[LABEL_PREFIX + "kit_version"] = version
    return out


def assemble_context(dest: Path, s: BuildSettings) -> None:
    """Copy what the Dockerfile needs into dest."""
    for item in ("docker", "lab", "envcheck"):
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
    """A Docker client, or BuildError saying how to start an engine."""
    try:
        import docker
    except ImportError:
        raise BuildError("the Docker SDK is missing: pip install -e . installs it") from None
    try:
        client = docker.from_env(timeout=600)
        client.ping()
        return client
    except Exception as e:
        raise BuildError(f"no Docker engine is reachable ({type(e).__name__}): start one "
                         f"(`sudo systemctl start docker`, or `sudo dockerd &`) and try again") from None


def build(s: BuildSettings, echo=print) -> str:
    """Build the image, streaming its progress; returns the image id."""
    check(s)
    matrix = versions.read()
    args = build_args(s, matrix)
    version = kit_version()
    image_tags = tags(s, version)
    client = connect()
    with tempfile.TemporaryDirectory(prefix="lab-build-") as ctx:
        assemble_context(Path(ctx), s)
        step, log = "", []
        image_id = None
        stream = client.api.build(path=ctx, dockerfile="docker/Dockerfile", buildargs=args,
                                  tag=image_tags[0], labels=labels(args, version), rm=True,
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
                raise BuildError(f"the image build failed at {step or 'its start'}: "
                                 f"{chunk['error'].strip()}\n--- end of that step's log ---\n{tail}")
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
