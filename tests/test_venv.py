"""docker/setup-venv.sh with a shared cache: two checkouts on one machine each import
their own kit, whichever ran the set-up last (the cache holds the heavy dependencies,
never the kit)."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO

READY = (REPO / ".venv" / "bin" / "python").exists()
KIT = ("lab", "envcheck", "docker", "pyproject.toml", "README.md", "tasks.py", "invoke.yaml")


def checkout(dest: Path) -> Path:
    dest.mkdir()
    for name in KIT:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / name)
    return dest


def setup(repo: Path) -> str:
    cp = subprocess.run(["bash", str(repo / "docker" / "setup-venv.sh")], cwd=repo,
                        capture_output=True, text=True, timeout=900)
    assert cp.returncode == 0, cp.stderr[-3000:]
    return cp.stderr


def imported_from(repo: Path, where: Path) -> dict:
    code = "import lab, envcheck, lab.host.run.bench as b; print(lab.__file__); print(envcheck.__file__); print(b.__file__)"
    cp = subprocess.run([str(repo / ".venv" / "bin" / "python"), "-c", code], cwd=where,
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr[-2000:]
    return [Path(p) for p in cp.stdout.split()]


@pytest.mark.skipif(not READY, reason="no .venv: run docker/setup-venv.sh first (the test reuses its "
                                       "cache instead of building one)")
def test_two_checkouts_sharing_the_cache_each_import_their_own_kit(tmp_path):
    a, b = checkout(tmp_path / "a"), checkout(tmp_path / "b")
    assert "reusing" in setup(a)          # the same cache as this checkout's: nothing rebuilt
    setup(b)                              # b ran last
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for repo in (a, b):
        for path in imported_from(repo, elsewhere):
            assert path.is_relative_to(repo), (repo, path)
    # the commands of the cached environment run with the checkout's own Python
    invoke = (a / ".venv" / "bin" / "invoke").read_text().splitlines()[0]
    assert invoke == f"#!{a / '.venv' / 'bin' / 'python'}"
    cp = subprocess.run([str(a / ".venv" / "bin" / "invoke"), "--list"], cwd=a, capture_output=True,
                        text=True, timeout=120)
    assert cp.returncode == 0 and "bench" in cp.stdout, cp.stderr[-2000:]


def test_the_cached_environment_is_keyed_by_the_cuda_code_horovod_compiles(tmp_path):
    """--key names the cached environment a set-up would use: another compute capability,
    by the kit's name (CUDA_ARCHS) or Horovod's own (HOROVOD_BUILD_CUDA_CC_LIST), is another
    environment, and the same settings find the same one."""
    def key(**env):
        cp = subprocess.run(["bash", str(REPO / "docker" / "setup-venv.sh"), "--key"], capture_output=True,
                            text=True, timeout=60, env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), **env})
        assert cp.returncode == 0, cp.stderr
        return cp.stdout.strip()
    plain = key()
    assert plain.startswith(f"{tmp_path}/.cache/dl-lab-kit/venv-") and key() == plain
    assert len({plain, key(CUDA_ARCHS="90"), key(HOROVOD_BUILD_CUDA_CC_LIST="90"), key(CUDA_ARCHS="80")}) == 4

