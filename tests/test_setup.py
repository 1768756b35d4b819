"""The README's set-up from a bare machine: in a container of the debootstrapped Debian
base (which has no Python, no compiler, no MPI), with only Python 3 added,
`docker/setup-venv.sh` run as root installs the system packages it needs; run as
another user it names the `sudo apt-get` line instead and stops. Skipped, with the
reason, where no engine or no base image is there (CI makes both)."""
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BASE = "lab-base/debian:bookworm"


@pytest.fixture(scope="module")
def base():
    from lab.common import docker_api
    try:
        cli = docker_api.client(timeout=900)
    except docker_api.DockerUnavailable as e:
        pytest.skip(str(e))
    if docker_api.find_image(cli, [BASE]) is None:
        pytest.skip(f"{BASE} is not made (bash docker/make-base-image.sh)")
    return cli


def test_setup_installs_its_system_packages_as_root_and_names_them_otherwise(base):
    script = r"""
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq && apt-get install -y -qq --no-install-recommends python3 >/dev/null
useradd -m student
# Not root, packages missing: one line to run, exit 1, nothing installed.
if su student -c 'bash /src/docker/setup-venv.sh --system' 2>/tmp/user.err; then exit 10; fi
grep -q 'sudo apt-get update && sudo apt-get install -y --no-install-recommends' /tmp/user.err || exit 11
grep -q 'openmpi-bin' /tmp/user.err || exit 12
! command -v mpirun >/dev/null || exit 13
# Root: installs them.
bash /src/docker/setup-venv.sh --system
mpirun --version | head -n1
cmake --version | head -n1
g++ --version | head -n1
python3 -m venv /tmp/v && test -x /tmp/v/bin/pip
test -f "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h"
# A second run finds everything and installs nothing.
bash /src/docker/setup-venv.sh --system 2>/tmp/again.err
! grep -q installing /tmp/again.err
echo SETUP-OK
"""
    label = {"org.dl-lab-kit.test": "1"}
    c = base.containers.run(BASE, ["bash", "-c", script], detach=True, labels=label,
                            name=f"lab-test-setup-{uuid.uuid4().hex[:8]}",
                            volumes={str(REPO): {"bind": "/src", "mode": "ro"}})
    try:
        status = c.wait(timeout=900)
        logs = c.logs().decode(errors="replace")
    finally:
        c.remove(force=True)
    assert status["StatusCode"] == 0, logs[-3000:]
    assert "SETUP-OK" in logs and "Open MPI" in logs
