"""Worker code never imports host-only packages, and the host side never needs torch."""
import subprocess
import sys

import pytest

WORKER_MODULES = "lab.train, lab.data, lab.dist, lab.models, lab.manifest, lab.metrics, lab.ceiling"
HOST_MODULES = ("lab.bench, lab.launch, lab.summary, lab.results, lab.fetch, lab.images, "
                "lab.versions, envcheck.probes, tasks")


def imported_after(modules: str) -> set:
    code = f"import sys, {modules}; print(' '.join(sorted(sys.modules)))"
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    return set(cp.stdout.split())


def test_worker_side_does_not_import_the_docker_sdk():
    mods = imported_after(WORKER_MODULES)
    assert "torch" in mods  # the check itself works: the worker does use torch
    assert "docker" not in mods and "invoke" not in mods and "tabulate" not in mods


@pytest.mark.parametrize("heavy", ["torch", "numpy", "horovod"])
def test_host_side_does_not_import_training_packages(heavy):
    assert heavy not in imported_after(HOST_MODULES)
