"""The CUDA stand-in base (docker/make-cuda-base-image.sh) is nvidia/cuda's devel image as
far as a build can tell: NVIDIA's own ENV, LABEL and ENTRYPOINT (docker/nvidia-cuda-base.conf,
taken from NVIDIA's published Dockerfiles), a held system NCCL of another version, and an
entry point that prints before the command. The Docker tests are skipped, with the reason,
where no engine or no stand-in is there (CI makes it before the GPU images)."""
import re
import shlex
import subprocess
import uuid

import pytest

from lab.common import versions
from lab.common.kit import REPO_ROOT
from tests.conftest import wait_for_pending_image

CONF = REPO_ROOT / "docker" / "nvidia-cuda-base.conf"
STAND_IN = "lab-base/cuda:13.0-devel-trixie"        # the tag .ci/run makes
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"   # ubuntu:24.04's and Debian's


def sections() -> dict[str, list[tuple[str, str, str]]]:
    """{"13.0": [(instruction, key, raw value), ...]} from the .conf, in order."""
    out, cur = {}, None
    for line in CONF.read_text().splitlines():
        if line.startswith("["):
            cur = out.setdefault(line[1:].split()[0], [])
        elif cur is not None and line.startswith(("ENV ", "LABEL ")):
            inst, rest = line.split(" ", 1)
            for tok in shlex.split(rest):
                k, v = tok.split("=", 1)
                cur.append((inst, k, v))
        elif cur is not None and line.startswith("ENTRYPOINT "):
            cur.append(("ENTRYPOINT", "", line.split(" ", 1)[1]))
    return out


def expected_config(release: str) -> tuple[dict[str, str], dict[str, str], str]:
    """(Env, Labels, Entrypoint) as Docker makes them from the section: ${VAR} is what
    the image's config held when the line was read."""
    env, labels, entry = {"PATH": BASE_PATH}, {}, ""
    for inst, k, v in sections()[release]:
        if inst == "ENTRYPOINT":
            entry = v
            continue
        v = re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), ""), v)
        (env if inst == "ENV" else labels)[k] = v
    return env, labels, entry


# What the kit's build and run depend on, by name: each must be in every release's section.
NVIDIA_NAMES = {"NVARCH", "NVIDIA_REQUIRE_CUDA", "NV_CUDA_CUDART_VERSION", "CUDA_VERSION", "PATH",
                "LD_LIBRARY_PATH", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
                "NV_CUDA_LIB_VERSION", "NCCL_VERSION", "NV_LIBNCCL_PACKAGE", "NV_LIBNCCL_PACKAGE_NAME",
                "NV_LIBNCCL_PACKAGE_VERSION", "NV_LIBNCCL_DEV_PACKAGE", "NV_LIBNCCL_DEV_PACKAGE_NAME",
                "NV_LIBNCCL_DEV_PACKAGE_VERSION", "NVIDIA_PRODUCT_NAME", "LIBRARY_PATH",
                "NV_LIBCUBLAS_PACKAGE", "NV_LIBCUBLAS_DEV_PACKAGE", "NV_NVML_DEV_VERSION"}


def test_the_conf_has_nvidias_configuration_for_every_cuda_of_the_matrix():
    matrix = versions.read()
    cudas = {k[len("CUDA_"):-len("_BASE_IMAGE")].replace("_", ".") for k in matrix
             if re.fullmatch(r"CUDA_\d+_\d+_BASE_IMAGE", k)}
    assert cudas == {"13.0", "12.6"}
    have = sections()
    for cuda in cudas:
        env, labels, entry = expected_config(cuda)
        assert NVIDIA_NAMES <= set(env), (cuda, NVIDIA_NAMES - set(env))
        assert env["NCCL_VERSION"] == env["NV_LIBNCCL_PACKAGE_VERSION"]
        assert env["CUDA_VERSION"].startswith(cuda + ".")
        assert env["PATH"].endswith(":" + BASE_PATH) and "/usr/local/cuda/bin" in env["PATH"]
        assert env["NVIDIA_REQUIRE_CUDA"].startswith(f"cuda>={cuda} ")
        assert labels["maintainer"].startswith("NVIDIA CORPORATION")
        assert entry == '["/opt/nvidia/nvidia_entrypoint.sh"]'
        # a system NCCL of another version than the one torch brings: what the build must ignore
        assert not env["NCCL_VERSION"].startswith(matrix[f"CUDA_{cuda.replace('.', '_')}_NCCL_VERSION"])
        assert len([1 for inst, *_ in have[cuda] if inst == "ENV"]) >= 35   # not cut short


def _client():
    try:
        import docker
        c = docker.from_env(timeout=300)
        c.ping()
        return c
    except Exception as e:
        pytest.skip(f"no Docker engine reachable ({type(e).__name__})")


@pytest.fixture(scope="module")
def stand_in():
    client = _client()
    wait_for_pending_image(STAND_IN)
    try:
        return client, client.images.get(STAND_IN)
    except Exception:
        pytest.skip(f"{STAND_IN} is not made (bash docker/make-cuda-base-image.sh {STAND_IN} '' trixie)")


def test_the_stand_in_holds_every_env_label_and_the_entry_point_of_nvidias_image(stand_in):
    _, img = stand_in
    cfg = img.attrs["Config"]
    env = dict(e.split("=", 1) for e in cfg["Env"])
    want_env, want_labels, entry = expected_config("13.0")
    missing = sorted(k for k in want_env if k not in env)
    assert not missing, f"the stand-in lacks NVIDIA's variables {missing}"
    assert {k: env[k] for k in want_env} == want_env
    assert {k: cfg["Labels"].get(k) for k in want_labels} == want_labels
    assert cfg["Entrypoint"] == ["/opt/nvidia/nvidia_entrypoint.sh"] == eval(entry)


def _run(client, image, command, **kw):
    name = f"lab-test-{uuid.uuid4().hex[:8]}"
    c = client.containers.run(image, command, name=name, detach=True, **kw)
    try:
        c.wait(timeout=120)
        return c.logs(stdout=True, stderr=False).decode()
    finally:
        c.remove(force=True)


def test_the_stand_in_has_a_held_system_nccl_and_a_chatty_entry_point(stand_in):
    client, img = stand_in
    env, _, _ = expected_config("13.0")
    out = _run(client, img.id, ["bash", "-c", "dpkg-query -W -f='${Package} ${Version}\\n' 'libnccl*'; "
                                "apt-mark showhold; ls /usr/lib/x86_64-linux-gnu/libnccl.so.2 /usr/include/nccl.h"])
    v = env["NV_LIBNCCL_PACKAGE_VERSION"] + "+cuda13.0"
    for want in (f"libnccl2 {v}", f"libnccl-dev {v}", "/usr/lib/x86_64-linux-gnu/libnccl.so.2", "/usr/include/nccl.h"):
        assert want in out, out
    held = out.split("\n")
    assert "libnccl2" in held and "libnccl-dev" in held, out
    # As nvidia/cuda's entry point: a banner, and the driver warning here, before the command's output.
    assert out.index("== CUDA ==") < out.index("NVIDIA Driver was not detected") < out.index("libnccl2 ")


def test_on_the_stand_in_nvidias_env_wins_over_a_build_argument_of_its_name(stand_in, tmp_path):
    """Why the matrix's NCCL is passed as EXPECT_NCCL_VERSION: a build argument named
    NCCL_VERSION never reaches RUN on nvidia/cuda (moby buildargs.go FilterAllowed)."""
    client, img = stand_in
    (tmp_path / "Dockerfile").write_text(
        f"FROM {img.id}\nARG NCCL_VERSION\nARG EXPECT_NCCL_VERSION\n"
        "RUN echo \"seen NCCL_VERSION=$NCCL_VERSION EXPECT_NCCL_VERSION=$EXPECT_NCCL_VERSION\"\n")
    tag = f"lab-test-buildarg:{uuid.uuid4().hex[:8]}"
    cp = subprocess.run(["docker", "build", "--no-cache", "--build-arg", "NCCL_VERSION=2.29.7",
                         "--build-arg", "EXPECT_NCCL_VERSION=2.29.7", "-t", tag, str(tmp_path)],
                        capture_output=True, text=True, env={"DOCKER_BUILDKIT": "0", "PATH": BASE_PATH})
    try:
        assert cp.returncode == 0, cp.stderr
        env, _, _ = expected_config("13.0")
        assert f"seen NCCL_VERSION={env['NCCL_VERSION']} EXPECT_NCCL_VERSION=2.29.7" in cp.stdout, cp.stdout
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


def _configure_args(tmp_path, **env):
    cuda = tmp_path / "cuda"
    (cuda / "include").mkdir(parents=True, exist_ok=True)
    (cuda / "include" / "cuda.h").write_text("")
    return subprocess.run(["bash", str(REPO_ROOT / "docker" / "install-openmpi.sh")], capture_output=True,
                          text=True, env={"PATH": BASE_PATH, "CUDA_HOME": str(cuda), "CONFIGURE_ONLY": "1", **env})


def test_open_mpi_is_built_without_ucx_unless_a_cuda_ucx_is_given(tmp_path):
    """A UCX that configure finds on its own (a host's MOFED, HPC-X) would make the UCX PML,
    which outranks ob1 on InfiniBand; built without CUDA it cannot carry GPU buffers."""
    cp = _configure_args(tmp_path)
    assert cp.returncode == 0 and "--without-ucx" in cp.stdout.split() and "--with-cuda=" in cp.stdout
    ucx = tmp_path / "ucx"
    (ucx / "lib" / "ucx").mkdir(parents=True)
    cp = _configure_args(tmp_path, UCX_HOME=str(ucx))
    assert cp.returncode == 1 and cp.stdout == ""
    assert "no CUDA transport" in cp.stderr and "unset UCX_HOME" in cp.stderr and "Traceback" not in cp.stderr
    (ucx / "lib" / "ucx" / "libuct_cuda.so.0").write_text("")
    cp = _configure_args(tmp_path, UCX_HOME=str(ucx))
    assert cp.returncode == 0 and f"--with-ucx={ucx}" in cp.stdout.split() and "--without-ucx" not in cp.stdout
