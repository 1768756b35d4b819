"""docker/install-horovod.sh before its compile: Horovod's Python requirements named when
pip cannot install them, and Horovod 0.28.1's CMake configure step under CMake 4 (whose
bundled gloo asks for CMake 2.8.12). The compile itself runs once per CI, in the set-up
(docker/setup-venv.sh), under the machine's CMake."""
import importlib.util
import os
import subprocess
import sys

import pytest
from conftest import REPO

SCRIPT = REPO / "docker" / "install-horovod.sh"
HAS_TORCH = importlib.util.find_spec("torch") is not None


def run(env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT)], env={**os.environ, "PYTHON": sys.executable, **env},
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch in the test's Python (the script checks it first)")
def test_a_requirement_pip_cannot_install_offline_is_named_before_the_compile(tmp_path):
    """cffi 1.0.0 first on the path (Horovod needs >= 1.4.0) and no package index: one
    sentence naming it and the pip line, before any download or compile."""
    dist = tmp_path / "site" / "cffi-1.0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: cffi\nVersion: 1.0.0\n")
    cp = run({"PYTHONPATH": str(tmp_path / "site"), "PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull,
              "PIP_FIND_LINKS": "", "HOROVOD_WITHOUT_MPI": "1"}, timeout=300)
    assert cp.returncode == 1, cp.stderr[-2000:]
    last = cp.stderr.strip().splitlines()[-1]
    assert last.startswith("install-horovod: error: Horovod 0.28.1 needs cffi>=1.4.0,"), last
    assert f"{sys.executable} -m pip install 'cffi>=1.4.0'" in last and "Traceback" not in cp.stderr
    assert "downloading" not in cp.stderr and "building" not in cp.stderr


@pytest.fixture(scope="module")
def cmake4(tmp_path_factory) -> str:
    """A CMake 4 (pip's cmake package) in a throwaway folder: the folder of its binary."""
    target = tmp_path_factory.mktemp("cmake4")
    cp = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target),
                         "cmake>=4,<5"], capture_output=True, text=True, timeout=300)
    if cp.returncode != 0:
        pytest.skip(f"pip could not install cmake>=4 (no package index?): {cp.stderr.strip()[-300:]}")
    return str(target / "cmake" / "data" / "bin")


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TORCH, reason="needs torch in the test's Python (Horovod's CMake asks it)")
def test_horovod_configures_under_cmake_4(cmake4):
    """The script's configure-only mode (Horovod's own configure command, as its setup.py
    runs it) under CMake 4: without CMAKE_POLICY_VERSION_MINIMUM, CMake 4 stops at
    third_party/gloo/CMakeLists.txt ("Compatibility with CMake < 3.5 has been removed").
    About a minute on 2 cores with a CUDA build of torch (CUDA detected too)."""
    env = {"PATH": f"{cmake4}:{os.environ['PATH']}", "HOROVOD_CONFIGURE_ONLY": "1",
           "HOROVOD_WITHOUT_MPI": "1"}
    cp = run({**env, "CMAKE_POLICY_VERSION_MINIMUM": ""})
    assert "install-horovod: CMake 4." in cp.stderr, cp.stderr[-3000:]
    assert cp.returncode == 0, (cp.stdout + cp.stderr)[-3000:]
    assert "configured; nothing built or installed" in cp.stderr
    # Horovod's RelWithDebInfo flags keep their -O3 and lose -g (the script's patch).
    flags = [line.split(" flags: ", 1)[1].split() for line in cp.stderr.splitlines()
             if line.startswith(("install-horovod: CXX flags: ", "install-horovod: CUDA flags: "))]
    assert flags and all("-O3" in f and "-g" not in f for f in flags), cp.stderr[-3000:]
