"""The caches of stack measurements (the run folder's manifest, lab.worker.manifest; the
stack probe's answer for a Python and for an image, lab.host.places.stack_cache) answer anew
when what the measurement depends on changes: an installed package, the user site, the
visible GPUs, the driver. Real Pythons (a scratch venv) where a package changes."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab.common import stack_facts
from lab.host.places import stack_cache
from lab.worker import manifest

REPO = Path(__file__).resolve().parent.parent
# A manifest collected into a run folder, its measurement replaced by a stamp of when it ran.
COLLECT = ("import json, sys, time\n"
           "from lab.worker import manifest\n"
           "manifest.measure = lambda hosts: {'measured': time.time_ns()}\n"
           "print(json.dumps(manifest.collect(['h'], sys.argv[1])))\n")


@pytest.fixture
def venv(tmp_path):
    """A scratch venv (no pip: made in a fraction of a second) and the environment that
    runs the kit in it with a user base folder (~/.local) whose site folder does not
    exist yet."""
    folder = tmp_path / "venv"
    (tmp_path / "userbase").mkdir()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages",
                    str(folder)], check=True, timeout=60)
    python = str(folder / "bin" / "python")
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUSERBASE=str(tmp_path / "userbase"),
               PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONNOUSERSITE", None)
    out = subprocess.run([python, "-c", "import site, sysconfig; print(sysconfig.get_path("
                          "'purelib')); print(site.getusersitepackages())"], env=env,
                         capture_output=True, text=True, check=True, timeout=60).stdout.split()
    return python, env, Path(out[0]), Path(out[1])


def test_a_run_folders_manifest_is_measured_again_when_an_installed_package_changes(tmp_path, venv):
    python, env, site_packages, user_site = venv
    run_dir = tmp_path / "run"

    def collect():
        cp = subprocess.run([python, "-c", COLLECT, str(run_dir)], env=env, capture_output=True,
                            text=True, timeout=60)
        assert cp.returncode == 0, cp.stderr[-2000:]
        return json.loads(cp.stdout)["measured"]
    first = collect()
    assert collect() == first                      # a sweep's next launch reads it back
    (site_packages / "torch-2.4.0.dist-info").mkdir()
    upgraded = collect()
    assert upgraded != first
    (site_packages / "torch-2.4.0.dist-info").rename(site_packages / "torch-2.5.1.dist-info")
    assert collect() != upgraded                   # `pip install -U torch`
    again = collect()
    (user_site / "horovod-0.28.1.dist-info").mkdir(parents=True)   # `pip install --user`
    assert collect() != again


def test_a_run_folders_manifest_is_measured_again_for_other_gpus_or_driver(tmp_path, monkeypatch):
    driver = tmp_path / "version"
    driver.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15\n")
    monkeypatch.setattr(stack_facts, "DRIVER_VERSION_FILE", str(driver))
    for name in stack_facts.VISIBLE_GPU_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    calls = []
    monkeypatch.setattr(manifest, "measure", lambda hosts: {"measured": len(calls.append(1) or calls)})

    def collect():
        return manifest.collect(["h"], tmp_path / "run")["measured"]
    assert collect() == collect() == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert collect() == 2
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "1")
    assert collect() == 3
    driver.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.10\n")
    assert collect() == 4
    assert collect() == 4


def test_an_images_cached_stack_is_probed_again_for_other_visible_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv(stack_cache.CACHE_ENV, str(tmp_path / "cache"))
    for name in stack_facts.VISIBLE_GPU_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    driver = tmp_path / "version"
    driver.write_text("550.54.15\n")
    monkeypatch.setattr(stack_facts, "DRIVER_VERSION_FILE", str(driver))
    calls = []

    def probe():
        calls.append(1)
        return {"gpus": len(calls)}

    def stack(gpus=True):
        return stack_cache.cached(stack_cache.image_key("sha256:abc", False, gpus), probe,
                                  depends=False)["gpus"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert stack() == stack() == 1
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")     # every GPU: another container
    assert stack() == 2
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "0,1")
    assert stack() == 3
    driver.write_text("570.86.10\n")
    assert stack() == 4
    # A container given no GPU sees none, whichever the host's variables name.
    cpu = stack(gpus=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert stack(gpus=False) == cpu
    # The simulated cluster's nodes running the same image keep an answer of their own.
    assert stack_cache.cached(stack_cache.image_key("sha256:abc", False, False, kind="cluster"), probe,
                              depends=False)["gpus"] == cpu + 1
    # a cluster brought up again on the same image with other GPUs is probed again
    one, two = ([{"Driver": "nvidia", "DeviceIDs": ids, "Capabilities": [["gpu"]]}] for ids in (["0"], ["0", "1"]))
    assert stack_cache.image_key("sha256:abc", False, True, kind="cluster", devices=one) != \
        stack_cache.image_key("sha256:abc", False, True, kind="cluster", devices=two)


def test_a_pythons_cached_stack_is_probed_again_after_a_user_site_install(tmp_path, monkeypatch, venv):
    """The real probe in a scratch venv whose user site folder does not exist when it
    runs: `pip install --user horovod` makes it, and the next answer has Horovod."""
    python, env, _, user_site = venv
    monkeypatch.setenv(stack_cache.CACHE_ENV, str(tmp_path / "cache"))

    def probe():
        cp = subprocess.run([python, "-m", "lab.worker.capabilities"], env=env, cwd=REPO,
                            capture_output=True, text=True, timeout=60)
        return json.loads(cp.stdout.strip().splitlines()[-1])

    key = stack_cache.local_key(python, env)
    assert "horovod" not in stack_cache.cached(key, probe)
    horovod = user_site / "horovod"
    horovod.mkdir(parents=True)
    (horovod / "__init__.py").write_text("__version__ = '0.28.1'\n")
    (horovod / "torch.py").write_text("__version__ = '0.28.1'\n"
                                      "gloo_built = mpi_built = lambda: True\n"
                                      "nccl_built = lambda: 0\n"
                                      "ccl_built = lambda: False\n")
    assert stack_cache.cached(key, probe)["horovod"]["version"] == "0.28.1"
