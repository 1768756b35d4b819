"""The packages say where code runs, and imports keep to it: a rank never imports the
host's packages (Docker, invoke, tabulate) or lab.host; the host, the report, the
shared code and envcheck never import torch at import time; lab.common imports no
other part of the kit; envcheck imports only lab.common. Modules are found by walking
the packages, so a new module is checked without being listed here."""
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def modules(package: str) -> list[str]:
    path = REPO.joinpath(*package.split("."))
    return [f"{package}.{m.name}" for m in pkgutil.iter_modules([str(path)])
            if not m.name.startswith("__")]


def imported_after(mods: list[str]) -> set:
    code = f"import sys, {', '.join(mods)}; print(' '.join(sorted(sys.modules)))"
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                        cwd=REPO)
    assert cp.returncode == 0, cp.stderr
    return set(cp.stdout.split())


def kit_parts(mods: set) -> set:
    """lab.host.bench -> lab.host; envcheck.probes -> envcheck."""
    return {".".join(m.split(".")[:2]) if m.startswith("lab.") else "envcheck" for m in mods
            if m.startswith(("lab.", "envcheck"))}


def test_the_packages_are_regular_packages():
    for pkg in ("lab", "lab.common", "lab.worker", "lab.host", "lab.report", "envcheck"):
        assert REPO.joinpath(*pkg.split("."), "__init__.py").is_file(), pkg
    assert len(modules("lab.host")) >= 8 and "lab.worker.train" in modules("lab.worker")


def test_worker_side_does_not_import_the_hosts_packages():
    mods = imported_after(modules("lab.worker"))
    assert "torch" in mods  # the check itself works: the worker does use torch
    assert not {"docker", "invoke", "tabulate"} & mods
    assert not any(m.startswith("lab.host") for m in mods)


@pytest.mark.parametrize("package", ["lab.host", "lab.report", "lab.common", "envcheck"])
def test_host_report_and_shared_code_do_not_import_training_packages(package):
    extra = ["tasks"] if package == "lab.host" else []
    mods = imported_after(modules(package) + extra)
    assert not {"torch", "numpy", "horovod"} & mods


def test_shared_code_imports_no_other_part_of_the_kit():
    assert kit_parts(imported_after(modules("lab.common"))) <= {"lab.common"}


def test_envcheck_uses_only_the_shared_code():
    parts = kit_parts(imported_after(modules("envcheck")))
    assert parts <= {"lab.common", "envcheck"}, parts
