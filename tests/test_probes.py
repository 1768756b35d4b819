"""Probes: parsers on real captured outputs; failures become results, never exceptions."""
import os
import stat
from pathlib import Path

import pytest

from envcheck import probes

FIXTURES = Path(__file__).parent / "fixtures"


def test_parse_open_mpi_version():
    text = (FIXTURES / "mpirun-version-openmpi-4.1.4.txt").read_text()
    assert probes.parse_mpirun_version(text) == {"implementation": "Open MPI", "version": "4.1.4"}


def test_parse_mpich_version():
    text = (FIXTURES / "mpirun-version-mpich-4.0.2.txt").read_text()
    assert probes.parse_mpirun_version(text) == {"implementation": "MPICH", "version": "4.0.2"}


def test_parse_garbage_raises_for_the_probe_to_catch():
    with pytest.raises(ValueError):
        probes.parse_mpirun_version("command not found\n")


def test_parsers_of_proc_and_os_release():
    assert probes.parse_cpu_model("processor\t: 0\nmodel name\t: AMD EPYC 7B13\n") == "AMD EPYC 7B13"
    assert probes.parse_os_release('NAME="Debian"\nPRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n') \
        == "Debian GNU/Linux 12 (bookworm)"


def _fake_bin(tmp_path, body):
    """A real executable script standing in for mpirun, to make the probe fail on purpose."""
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    p = d / "mpirun"
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(d)


@pytest.mark.parametrize("body,expected", [
    ("echo 'garbage'\n", "probe crashed: ValueError"),
    ("echo oops >&2; exit 3\n", "exited with 3: oops"),
    ("sleep 5\n", "did not finish within 0.5 s"),
])
def test_mpi_probe_failures_are_results(tmp_path, monkeypatch, body, expected):
    monkeypatch.setenv("PATH", _fake_bin(tmp_path, body) + os.pathsep + "/usr/bin:/bin")
    r = probes.probe_mpi_version(timeout=0.5)
    assert r.status == probes.FAIL and expected in r.fix


def test_missing_binary_is_a_fail_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    r = probes.probe_mpi_version()
    assert r.status == probes.FAIL and "mpirun not found" in r.fix


def test_gpu_probe_without_a_driver_skips_with_a_reason():
    from envcheck.host import probe_gpus
    r = probe_gpus()
    if r.status == probes.PASS:  # a machine with a GPU
        assert r.value["count"] >= 1
    else:
        assert r.status == probes.SKIP and r.fix


def test_envcheck_module_prints_json():
    import json
    import subprocess
    import sys
    cp = subprocess.run([sys.executable, "-m", "envcheck", "--part", "host", "--json"],
                        capture_output=True, text=True, timeout=120,
                        cwd=os.path.dirname(os.path.dirname(__file__)))
    assert cp.returncode == 0, cp.stderr
    names = {c["name"] for c in json.loads(cp.stdout)["checks"]}
    assert {"os", "cpu", "gpus", "shm", "memlock", "docker_engine", "lab_images"} <= names
