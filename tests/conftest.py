"""Shared fixtures. Every multi-process test starts real launchers and real ranks."""
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# The stack probe (a Python importing torch, Horovod and DeepSpeed: about 5 s of a core
# here) is answered from a cache of the session's own (lab.host.places.stack_cache, keyed as a
# user's is) for what runs the real stack: every `invoke` a test starts and the modules'
# `stack` fixtures. Inside a test's own process it is off (_stack_cache_off below): the
# fakes of images and Pythons there would otherwise meet each other's answers.
# tests/test_startup.py and tests/test_cache_keys.py give the cache folders of their own.
if "LAB_STACK_CACHE" not in os.environ:
    os.environ["LAB_STACK_CACHE"] = tempfile.mkdtemp(prefix="lab-test-stack-cache-")
    _MADE_STACK_CACHE = os.environ["LAB_STACK_CACHE"]
else:
    _MADE_STACK_CACHE = None

# The compose cluster the tests bring up is a project of its own (not the checkout's,
# which a user's `invoke up` makes: the two never meet, lab.host.places.compose.cluster),
# and it mounts a temporary results folder, not the checkout's results/ (compose.yaml's
# LAB_RESULTS). Set once, here, so xdist's workers and every `invoke` a test starts
# inherit them.
os.environ.setdefault("COMPOSE_PROJECT_NAME", f"labtest{os.getpid()}")
# What the kit prints is fitted to the terminal (lab.common.display.width): the tests read
# its content, one line a row, as wide as it is; the widths themselves are tests/test_display.py's
# and tests/test_doctor.py's, which give COLUMNS where they run a command.
os.environ["COLUMNS"] = "1000"
# One run at a time holds this machine (lab.host.places.hold): each test process (xdist's
# workers too) holds its own, so that the suite's workers never wait for each other;
# tests/test_hold.py gives its runs a shared folder of their own.
_HOLD_DIR = Path(tempfile.gettempdir()) / f"lab-test-holds-{os.getpid()}"
os.environ["LAB_HOLD_DIR"] = str(_HOLD_DIR)
if "LAB_RESULTS" not in os.environ:
    os.environ["LAB_RESULTS"] = tempfile.mkdtemp(prefix="lab-test-results-")
    _MADE_RESULTS = os.environ["LAB_RESULTS"]
else:
    _MADE_RESULTS = None
CLUSTER_RESULTS = Path(os.environ["LAB_RESULTS"])


def checkout_results() -> set[str]:
    """Every path under the checkout's results/ (relative), to find what a session added."""
    root = REPO / "results"
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


def _controller(session) -> bool:
    return not hasattr(session.config, "workerinput")     # xdist's workers have it


def pytest_sessionstart(session):
    if _controller(session):
        session.config._results_before = checkout_results()


def pytest_sessionfinish(session, exitstatus):
    """Fail the session when the checkout's results/ gained anything: a user's results
    hold only the runs they made (tests write into temporary folders)."""
    shutil.rmtree(_HOLD_DIR, ignore_errors=True)
    if not _controller(session):
        return
    for made in (_MADE_RESULTS, _MADE_STACK_CACHE):
        if made:
            shutil.rmtree(made, ignore_errors=True)
    added = sorted(checkout_results() - getattr(session.config, "_results_before", set()))
    if added:
        top = sorted({a.split("/", 1)[0] for a in added})
        sys.stderr.write(f"\nerror: the test session wrote into {REPO / 'results'}: "
                         f"{', '.join(top[:10])}{' ...' if len(top) > 10 else ''} "
                         f"(tests write into tmp_path)\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

def _top_of_results() -> set[str]:
    root = REPO / "results"
    return set(os.listdir(root)) if root.is_dir() else set()


@pytest.fixture(autouse=True)
def _stack_cache_off(request, monkeypatch):
    """No stack cache for the test's own process (see the top of this file); the processes
    it starts still read LAB_STACK_CACHE."""
    if request.module.__name__.rsplit(".", 1)[-1] not in ("test_cache_keys", "test_startup"):
        from lab.host.places import stack_cache
        monkeypatch.setattr(stack_cache, "cache_dir", lambda: None)


@pytest.fixture(autouse=True)
def _checkout_results_untouched():
    """Name the test during which the checkout's results/ gained a folder (the session's
    check above says only that it did). Under xdist the other worker's test ran at the
    same time: the message says "while", not "by"."""
    before = _top_of_results()
    yield
    added = sorted(_top_of_results() - before)
    if added:
        pytest.fail(f"the checkout's results/ gained {', '.join(added)} while this test ran "
                    f"(tests write into tmp_path)", pytrace=False)


# The modules whose tests share the Docker engine: the lab images, the compose cluster
# (one per module, brought up and down), containers counted by label. Under pytest-xdist
# (`-n 2`, the README's test command) they run one after another on one worker while the
# other worker takes the rest (local processes only). The grouping is xdist's own
# scheduler for scopes (LoadScopeScheduling) with the scope decided here: xdist 3.8's
# `--dist loadgroup` marks a group by rewriting item._nodeid, which pytest 9.2 no longer
# reads (its nodeid comes from item._id), so its groups are silently ignored.
DOCKER_MODULES = {"test_image", "test_cluster", "test_setup"}


def scope_of(nodeid: str) -> str:
    """"docker" for a test of those modules, else the test itself (a scope of one)."""
    module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    return "docker" if module[:-3] in DOCKER_MODULES else nodeid


@pytest.hookimpl(optionalhook=True)     # a hook of xdist's: unknown when xdist is not loaded
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "load":      # -n alone means load; another --dist is xdist's
        return None
    from xdist.scheduler import LoadScopeScheduling

    class DockerTestsTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return scope_of(nodeid)
    return DockerTestsTogether(config, log)


# CI (.ci/run) builds the GPU images beside the tests, not before them. It names a folder
# in LAB_TEST_PENDING_IMAGES where that build writes a file per image as it is made (its
# tag with "/" and ":" as "_") and a file `ended` holding its exit status when it stops.
# A test of such an image waits for it there: otherwise it would skip as "not built", or
# on a warm machine read the image of an earlier run while the new one is being built.
PENDING_IMAGES_WAIT_S = 3600
PENDING_IMAGES_POLL_S = 5.0


def wait_for_pending_image(tag: str) -> None:
    """Return once `tag` is made or the build beside the tests has ended; fail the test
    when that build failed before making it. Returns at once outside CI."""
    folder = os.environ.get("LAB_TEST_PENDING_IMAGES")
    if not folder:
        return
    made, ended = Path(folder, tag.replace("/", "_").replace(":", "_")), Path(folder, "ended")
    deadline = time.monotonic() + PENDING_IMAGES_WAIT_S
    while not made.exists() and not ended.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"{tag}: the image build beside the tests made nothing in "
                        f"{PENDING_IMAGES_WAIT_S} s", pytrace=False)
        time.sleep(PENDING_IMAGES_POLL_S)
    if not made.exists() and ended.read_text().strip() != "0":
        pytest.fail(f"{tag}: the image build beside the tests failed (exit {ended.read_text().strip()}); "
                    "CI prints its output after the tests", pytrace=False)


def _horovod_state():
    if importlib.util.find_spec("horovod") is None:
        return "Horovod is not installed (build it with docker/install-horovod.sh)"
    cp = subprocess.run([sys.executable, "-c", "import horovod.torch"], capture_output=True, text=True)
    if cp.returncode != 0:
        return "horovod.torch does not import: " + (cp.stderr.strip().splitlines() or [""])[-1]
    return None


HOROVOD_MISSING = _horovod_state()
requires_horovod = pytest.mark.skipif(HOROVOD_MISSING is not None, reason=HOROVOD_MISSING or "")
requires_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not on the PATH")


def _torchvision_state():
    cp = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True, text=True)
    return None if cp.returncode == 0 else (cp.stderr.strip().splitlines() or ["no torchvision"])[-1]


TORCHVISION_MISSING = _torchvision_state()


def make_mnist_like(root: Path, train: int = 1536, test: int = 512, seed: int = 0) -> Path:
    """Write the four MNIST IDX files with a learnable problem: each class is a fixed
    random stroke pattern plus noise."""
    import numpy as np

    from lab.worker.data import write_idx

    rng = np.random.default_rng(seed)
    templates = (rng.random((10, 28, 28)) > 0.8).astype(np.float32)

    def split(n):
        y = rng.integers(0, 10, n).astype(np.uint8)
        x = templates[y] * 200 + rng.normal(0, 40, (n, 28, 28))
        return np.clip(x, 0, 255).astype(np.uint8), y

    root.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", train), ("t10k", test)):
        x, y = split(n)
        write_idx(root / f"{prefix}-images-idx3-ubyte.gz", x)
        write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", y)
    return root


@pytest.fixture
def short_ceiling(monkeypatch):
    """The compute ceiling timed for 5 steps (lab.host.run.ceiling.command's flags): how long a
    ceiling is timed is its own rule (tests/test_gpu_records.py), not what a test of where
    and around what it is measured checks."""
    from lab.host.run import ceiling
    full = ceiling.command

    def short(s, processes, python):
        argv = full(s, processes, python)
        for flag, value in (("--steps", "5"), ("--warmup", "1"), ("--min-seconds", "0")):
            argv[argv.index(flag) + 1] = value
        return argv
    monkeypatch.setattr(ceiling, "command", short)


@pytest.fixture(scope="session")
def mnist_like(tmp_path_factory):
    return make_mnist_like(tmp_path_factory.mktemp("mnist-like"))


@pytest.fixture
def no_network_mirrors(monkeypatch):
    """Mirrors that refuse at once (a closed loopback port), so no test reaches out."""
    monkeypatch.setenv("LAB_MNIST_MIRRORS", "http://127.0.0.1:9/")


class FakeImage:
    """An image as the Docker SDK returns it: tags, id, labels (lab.host.images writes
    them: the CUDA architectures and PTX of its build, docker/versions.env)."""
    def __init__(self, tag, archs, ptx="0"):
        from lab.common.docker_api import LABEL_PREFIX
        self.tags, self.id, self.short_id = [tag], "sha256:" + tag, tag
        self.labels = {LABEL_PREFIX + "cuda_archs": archs, LABEL_PREFIX + "cuda_ptx": ptx}


@pytest.fixture
def engine_with(monkeypatch):
    """A Docker engine that has the given images (tag -> FakeImage) on a host whose GPUs
    have the given compute capabilities: engine_with(images, ["8.9"]). What the engine
    stands for is only its image lookup (images.get); no GPU exists here."""
    import docker
    from lab.common import docker_api
    from lab.host.images import choice as image_choice

    def make(images, capabilities):
        class Images:
            def get(self, tag):
                if tag in images:
                    return images[tag]
                raise docker.errors.ImageNotFound(tag)
        cli = type("Cli", (), {"images": Images()})()
        monkeypatch.setattr(docker_api, "client", lambda *a, **k: cli)
        monkeypatch.setattr(image_choice, "host_gpu_capabilities", lambda: capabilities)
    return make


@pytest.fixture(scope="module")
def stack():
    """What local ranks can run (bench's own probe), once per module."""
    from lab.host.run import bench
    return bench.probe_stack()
