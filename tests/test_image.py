"""The CPU lab image, for real: a Docker engine runs containers of the image that
`invoke build` made, and jobs run inside them with the lab's worker. Every container
carries a label and is removed in a finally, so a failed test leaks nothing.
Skipped, with the reason, where no engine or no image is there (CI builds both)."""
import json
import os
import uuid

import pytest

from lab.common import results
from lab.common.docker_api import IMAGE_REPO, LABEL_PREFIX
from tests.conftest import make_mnist_like, wait_for_pending_image

IMAGE = f"{IMAGE_REPO}:cpu"
TEST_LABEL = LABEL_PREFIX + "test"


def _client():
    try:
        import docker
        c = docker.from_env(timeout=300)
        c.ping()
        return c, None
    except Exception as e:
        return None, f"no Docker engine reachable ({type(e).__name__})"


@pytest.fixture(scope="module")
def image():
    client, why = _client()
    if client is None:
        pytest.skip(why)
    try:
        img = client.images.get(IMAGE)
    except Exception:
        pytest.skip(f"{IMAGE} is not built (invoke build --flavor cpu)")
    yield client, img
    leaked = client.containers.list(all=True, filters={"label": TEST_LABEL})
    for c in leaked:
        c.remove(force=True)
    assert not leaked, f"containers left behind: {[c.name for c in leaked]}"


def run_in_image(image, command, tmp_path, timeout=300):
    client, img = image
    res = tmp_path / "results"
    data = tmp_path / "data"
    res.mkdir(exist_ok=True)
    if not data.exists():
        make_mnist_like(data, train=768, test=256)
    for d in (res, data):
        os.chmod(d, 0o777)
    name = f"lab-test-{uuid.uuid4().hex[:8]}"
    container = client.containers.run(
        img.id, ["bash", "-c", command], name=name, detach=True, labels={TEST_LABEL: "1"},
        shm_size="1g", volumes={str(res): {"bind": "/results", "mode": "rw"},
                                str(data): {"bind": "/data", "mode": "ro"}},
        environment={"LAB_IMAGE_ID": img.id, "LAB_IMAGE_LABELS": json.dumps(img.labels)})
    try:
        status = container.wait(timeout=timeout)
        logs = container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)
    return status["StatusCode"], logs, res


WORKER = ("python -m lab.worker.train --data mnist --data-dir /data --epochs 2 --batch-size 32 "
          "--warmup-steps 2 --results-dir /results --run-id img --expected-np 2")


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_horovodrun_two_ranks_in_the_image(image, tmp_path, controller):
    rc, logs, res = run_in_image(
        image, f"horovodrun -np 2 -H localhost:2 --{controller} {WORKER} --framework horovod "
               f"--backend {controller}", tmp_path)
    assert rc == 0, logs[-3000:]
    recs, _ = results.read_records(res / "img" / results.RESULTS_FILE)
    r = recs[-1]
    assert r["world"]["np"] == 2 and r["world"]["controller"] == controller
    assert r["epochs"][-1]["train_loss"] < r["epochs"][0]["train_loss"]
    assert r["manifest"]["image"]["id"] == image[1].id
    assert r["manifest"]["image"]["labels"][LABEL_PREFIX + "horovod_version"]


def test_ddp_over_gloo_in_the_image(image, tmp_path):
    rc, logs, res = run_in_image(
        image, f"python -m torch.distributed.run --nproc-per-node=2 --standalone -m {WORKER[10:]} "
               f"--framework ddp", tmp_path)
    assert rc == 0, logs[-3000:]
    recs, _ = results.read_records(res / "img" / results.RESULTS_FILE)
    assert recs[-1]["world"]["np"] == 2 and recs[-1]["world"]["controller"] == "gloo"


def test_gpus_without_an_nvidia_runtime_say_what_to_install(image, tmp_path):
    """This engine has no NVIDIA runtime: a container asking for GPUs does not start, and
    the runner says in one sentence what to do instead of the engine's raw error."""
    from lab.host.places.base import RunnerError
    from lab.host.places.image import ImageRunner
    client, img = image
    if "nvidia" in (client.info().get("Runtimes") or {}):
        pytest.skip("this engine has an NVIDIA runtime")
    runner = ImageRunner(client, img, frozen=False, gpus=True, results_dir=str(tmp_path), data_dir=None)
    with pytest.raises(RunnerError) as e:
        runner.run({runner.tag: ["true"]}, {}, 60, lambda line: None, name=f"lab-test-gpus-{os.getpid()}")
    text = str(e.value)
    assert "nvidia-ctk runtime configure --runtime=docker" in text and "--device cpu" in text
    assert "could not select device driver" not in text and "\n" not in text


def test_what_the_image_runner_runs_is_its_commands(image, tmp_path):
    """commands(launch) is what run() has the engine start: the container's command as
    the engine reports it (Config.Cmd), and the run it makes writes its record."""
    from lab.common.config import RunConfig
    from lab.host.places.base import Launch
    from lab.host.places.image import ImageRunner
    client, img = image
    runner = ImageRunner(client, img, frozen=False, gpus=False, results_dir=str(tmp_path),
                         data_dir=None)
    cfg = RunConfig(framework="ddp", max_steps=4, warmup_steps=1, results_dir=runner.results_in,
                    run_id="cmds", expected_np=2, attempt="a0")
    (tmp_path / "cmds").mkdir()             # as bench makes the run's folder, then prepares it
    runner.prepare(str(tmp_path / "cmds"))
    commands = runner.commands(Launch("ddp", "gloo", 2, tuple(cfg.to_args()), (), 300, "cmds", "a0"))
    lines: list[str] = []
    res = runner.run(commands, {}, 300, lines.append, name=f"lab-test-cmds-{os.getpid()}")
    assert res.returncode == 0, "\n".join(lines[-30:])
    assert runner.started == commands
    [r] = results.read_records(tmp_path / "cmds" / results.RESULTS_FILE)[0]
    assert r["status"] == "ok" and r["world"]["np"] == 2


def test_image_runs_jobs_as_an_unprivileged_user_and_holds_no_keys(image, tmp_path):
    rc, logs, _ = run_in_image(image, "id -u; ls /etc/ssh/ | grep -c ssh_host_ || true; "
                                      "ls ~/.ssh 2>/dev/null | wc -l", tmp_path)
    uid, host_keys, user_keys = logs.split()[:3]
    assert rc == 0 and uid != "0" and host_keys == "0" and user_keys == "0"


def test_the_image_sets_no_run_time_choice_that_bench_makes_per_run(image):
    """bench sets Open MPI's yield_when_idle per run (CPU yes, GPU no, the user's value
    first); an ENV in the image would hold for GPU runs and every other tool."""
    _, img = image
    env = dict(e.split("=", 1) for e in img.attrs["Config"]["Env"])
    assert "OMPI_MCA_mpi_yield_when_idle" not in env


# `invoke bench` running its jobs in the image: one labelled container per job, with
# the checkout's code mounted (or the image's own with --frozen), removed at the end.
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from lab.common.docker_api import MANAGED_BY as LABEL_KEY  # noqa: E402
from lab.host.places.image import LABEL_VALUE, RESULTS_IN  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bench_cli(*args, timeout=600, **kw):
    return subprocess.run([sys.executable, "-m", "invoke", "bench", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, **kw)


_MINE: list[str] = []      # this test process's base temp folder (set below)


@pytest.fixture(autouse=True)
def _this_worker(tmp_path_factory):
    _MINE[:] = [os.path.realpath(tmp_path_factory.getbasetemp())]


def bench_containers(client):
    """The bench containers of this test process: those whose results folder is in its
    temporary folders (another xdist worker's bench in the image may run meanwhile; the
    engine lists its container too)."""
    def mine(c):
        return any(m.get("Destination") == RESULTS_IN
                   and os.path.realpath(m.get("Source", "")).startswith(_MINE[0] + os.sep)
                   for m in c.attrs.get("Mounts", []))
    found = client.containers.list(all=True, filters={"label": f"{LABEL_KEY}={LABEL_VALUE}"})
    return [c for c in found if mine(c)]


@pytest.mark.parametrize("framework,backend", [("horovod", "gloo"), ("horovod", "mpi")])
def test_bench_runs_its_ranks_in_the_image(image, tmp_path, framework, backend):
    client, img = image
    cp = bench_cli("--image", IMAGE, "--np", "2", "--framework", framework, "--backend", backend,
                   "--max-steps", "15", "--results-dir", str(tmp_path))
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-2000:]
    assert f"running in the image {IMAGE}" in cp.stdout
    [r] = results.read_records(next(tmp_path.glob("*/results.jsonl")))[0]
    assert r["status"] == "ok" and r["world"]["np"] == 2
    assert r["manifest"]["image"]["id"] == img.id                 # ran in that image
    assert r["manifest"]["kit_path"] == "/opt/lab-src/lab"        # with the checkout's code
    assert r["manifest"]["image"]["labels"][LABEL_PREFIX + "torch_version"]
    assert bench_containers(client) == []


def test_a_run_folder_with_local_and_image_runs_keeps_them_apart_and_is_the_callers(image, tmp_path):
    """One run id, first as local processes, then in the image: the report gives each
    its own rows (labelled with its place and torch); every file the image's ranks made
    belongs to the user who ran bench (root here: the ranks ran as the image's user)."""
    common = ["--np", "1", "--framework", "ddp", "--max-steps", "10", "--results-dir", str(tmp_path),
              "--run-id", "mixed"]
    for where in (["--local"], ["--image", IMAGE]):
        cp = bench_cli(*where, *common)
        assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-2000:]
    run = tmp_path / "mixed"
    recs = results.read_records(run / results.RESULTS_FILE)[0]
    assert [r["world"]["place"] for r in recs] == ["local", "image"]
    not_mine = [str(p) for p in [run, *run.rglob("*")] if p.lstat().st_uid != os.getuid()]
    assert not_mine == []
    from lab.report import lab_report
    text = lab_report.render(recs, [], str(run))
    rows = [ln.split("|")[1].strip() for ln in text.split("## Results within one server")[1]
            .split("\n## ")[0].splitlines() if ln.startswith("| ")][1:]
    torches = [r["manifest"]["torch"] for r in recs]
    if torches[0] != torches[1]:
        assert rows == [f"local, torch {torches[0]}: ddp / gloo", f"image, torch {torches[1]}: ddp / gloo"]
    else:
        assert rows == ["local: ddp / gloo", "image: ddp / gloo"]


def test_frozen_runs_the_images_own_copy(image, tmp_path):
    client, _ = image
    cp = bench_cli("--image", IMAGE, "--frozen", "--np", "1", "--framework", "ddp",
                   "--max-steps", "12", "--results-dir", str(tmp_path))
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-2000:]
    [r] = results.read_records(next(tmp_path.glob("*/results.jsonl")))[0]
    assert r["manifest"]["kit_path"].startswith("/opt/lab/lib/")   # the image's site-packages
    assert bench_containers(client) == []


def test_a_dying_rank_in_the_image_is_recorded_and_its_container_removed(image, tmp_path):
    client, _ = image
    t0 = time.monotonic()
    cp = bench_cli("--image", IMAGE, "--np", "2", "--framework", "ddp", "--max-steps", "400",
                   "--fault", "1:10", "--results-dir", str(tmp_path))
    took = time.monotonic() - t0
    recs = results.read_records(next(tmp_path.glob("*/results.jsonl")))[0]
    assert cp.returncode == 1, cp.stdout[-3000:]
    assert [r["status"] for r in recs] == ["failed"] and recs[0]["error"]["rank"] == 1
    assert took < 120, f"the failed job took {took:.0f} s to end"
    assert bench_containers(client) == []


@pytest.mark.parametrize("framework,backend", [("ddp", "gloo"), ("horovod", "gloo"), ("horovod", "mpi")])
def test_a_killed_rank_in_the_image_is_relaunched_from_its_checkpoint(image, tmp_path, framework, backend):
    """--max-restarts in the image: rank 1 SIGKILLs itself at step 25, a fresh container
    (a fresh launcher: torchrun, horovodrun or mpirun) resumes from step-20.pt in the
    run's folder it mounts, and the job is one ok record. The loss equal to an
    uninterrupted run's is tests/test_restarts.py's: the same checkout's code runs here
    (a second run would only repeat it)."""
    client, _ = image
    cp = bench_cli("--image", IMAGE, "--np", "2", "--framework", framework, "--backend", backend,
                   "--data", "synthetic", "--synthetic-size", "2560", "--max-steps", "40",
                   "--checkpoint-every", "10", "--max-restarts", "1", "--fault", "1:25:kill",
                   "--results-dir", str(tmp_path))
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-2000:]
    [r] = results.read_records(next(tmp_path.glob("*/results.jsonl")))[0]
    assert r["status"] == "ok" and r["manifest"]["kit_path"] == "/opt/lab-src/lab"
    (entry,) = r["restarts"]
    assert entry["resumed_from_step"] == 20 and entry["checkpoint"] == "step-00000020.pt"
    assert entry["error"]["rank"] == 1 and entry["error"]["signal"] == 9
    # 40 - 20 resumed - 5 (--warmup-steps): the relaunch's own steps, the ranks agreeing
    assert r["figures"]["timed_steps"] == 15 and len(set(r["figures"]["parameter_digests"])) == 1
    run = next(tmp_path.glob("*/"))
    assert [p for p in [run, *run.rglob("*")] if p.lstat().st_uid != os.getuid()] == []
    assert bench_containers(client) == []


def test_ctrl_c_removes_the_jobs_container(image, tmp_path):
    client, _ = image
    proc = subprocess.Popen(
        [sys.executable, "-m", "invoke", "bench", "--image", IMAGE, "--np", "2", "--framework",
         "ddp", "--max-steps", "5000", "--results-dir", str(tmp_path)], cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        for line in proc.stdout:
            if "== ddp over gloo, 2 process" in line:
                break
        for _ in range(60):
            if any(c.status == "running" for c in bench_containers(client)):
                break
            time.sleep(0.5)
        assert bench_containers(client), "the check below would see no container at all"
        time.sleep(3)
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out[-2000:]
    recs = results.read_records(next(tmp_path.glob("*/results.jsonl")))[0]
    assert [r["error"]["reason"] for r in recs] == ["interrupted by the user"]
    assert bench_containers(client) == []


def test_the_checkout_alone_is_lab_in_the_image_not_merged_with_the_images_copy(image, tmp_path):
    """lab is a regular package: with the checkout on the PYTHONPATH its one folder is
    the checkout's (a namespace package would merge the image's installed copy into
    lab.__path__, and a module deleted in the checkout would still import from there);
    frozen, it is the image's own."""
    from lab.host.places.image import ImageRunner
    client, img = image
    probe = ["python", "-c", "import json, lab; print(json.dumps(list(lab.__path__)))"]
    for frozen, expected in ((False, ["/opt/lab-src/lab"]), (True, None)):
        runner = ImageRunner(client, img, frozen=frozen, gpus=False, results_dir=str(tmp_path),
                             data_dir=None)
        rc, out = runner.output(probe, timeout_s=120)
        assert rc == 0, out
        paths = json.loads(out.strip().splitlines()[-1])
        if expected:
            assert paths == expected
        else:
            assert len(paths) == 1 and paths[0].startswith("/opt/lab/lib/")
    assert bench_containers(client) == []


def test_a_job_in_the_image_that_outlives_its_limit_is_stopped_and_said_so(image, tmp_path):
    from lab.host.places.image import ImageRunner
    client, img = image
    runner = ImageRunner(client, img, frozen=False, gpus=False, results_dir=str(tmp_path),
                         data_dir=None)
    t0 = time.monotonic()
    res = runner.run({"job": ["sleep", "60"]}, {}, 3, lambda line: None)
    assert res.returncode is None and res.why == "did not finish within 3 s and was stopped"
    assert time.monotonic() - t0 < 30
    assert bench_containers(client) == []


def test_clean_removes_what_a_killed_bench_left(image, tmp_path):
    """SIGKILL gives bench no chance to remove its job's container; `invoke clean` finds
    it by the kit's label and removes it."""
    client, _ = image
    proc = subprocess.Popen(
        [sys.executable, "-m", "invoke", "bench", "--image", IMAGE, "--np", "1", "--framework",
         "ddp", "--max-steps", "100000", "--epochs", "50", "--results-dir", str(tmp_path)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(240):
            if any(c.status == "running" for c in bench_containers(client)):
                break
            time.sleep(0.5)
        left = bench_containers(client)
        assert left, "bench started no container"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert bench_containers(client), "the container outlives the killed bench"
    # A compose cluster's node (the label `invoke up` gives its nodes) must survive: the
    # test cleans only job containers, as a user's own cluster may be up.
    from lab.common.docker_api import CLUSTER
    node = client.containers.create(IMAGE, ["true"], labels={CLUSTER: "node"},
                                    name=f"lab-test-clean-node-{os.getpid()}")
    try:
        cp = subprocess.run([sys.executable, "-m", "invoke", "clean", "--jobs-only"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
        assert cp.returncode == 0, cp.stdout + cp.stderr
        assert left[0].name in cp.stdout and node.name not in cp.stdout
        assert bench_containers(client) == []
        node.reload()                                    # still there (NotFound otherwise)
    finally:
        node.remove(force=True)


def test_an_image_that_is_not_built_is_one_sentence(image, tmp_path):
    cp = bench_cli("--image", "dl-lab-kit:no-such-tag", "--np", "1", "--results-dir", str(tmp_path))
    assert cp.returncode == 2 and "Traceback" not in cp.stderr + cp.stdout
    assert "no image dl-lab-kit:no-such-tag is built" in cp.stderr


def test_auto_falls_back_to_local_processes_without_an_engine(tmp_path):
    cp = bench_cli("--np", "1", "--framework", "ddp", "--max-steps", "12", "--results-dir",
                   str(tmp_path), env=dict(os.environ, DOCKER_HOST="unix:///nonexistent.sock"))
    assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-2000:]
    assert "running as local processes: no Docker engine is reachable" in cp.stdout
    [r] = results.read_records(next(tmp_path.glob("*/results.jsonl")))[0]
    assert r["manifest"]["image"] is None


# The GPU images, built in CI on a local CUDA devel base (docker/make-cuda-base-image.sh).
# No GPU here: these check what the images are made of, and that their CUDA build of
# torch runs the lab's jobs on the CPU.
GPU_IMAGES = {"NCCL": f"{IMAGE_REPO}:gpu-nccl", "MPI": f"{IMAGE_REPO}:gpu-mpi"}

GPU_STACK = r"""
import glob, json, subprocess, torch, horovod.torch as hvd
libs = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
print(json.dumps({
    "torch_cuda": torch.version.cuda,
    "torch_nccl": ".".join(map(str, torch.cuda.nccl.version())),
    "hvd_nccl": hvd.nccl_built(), "hvd_cuda": hvd.cuda_built(), "hvd_mpi": hvd.mpi_built(),
    "hvd_gloo": hvd.gloo_built(),
    "ncclso": sorted({l.split("=>")[-1].strip() for l in libs.splitlines() if "libnccl.so" in l}),
    "system_nccl": glob.glob("/usr/lib/*/libnccl*") + glob.glob("/usr/local/cuda/lib*/libnccl*"),
}))
"""


@pytest.fixture(scope="module", params=sorted(GPU_IMAGES))
def gpu_image(request):
    client, why = _client()
    if client is None:
        pytest.skip(why)
    tag = GPU_IMAGES[request.param]
    wait_for_pending_image(tag)
    try:
        img = client.images.get(tag)
    except Exception:
        pytest.skip(f"{tag} is not built (invoke build --gpu-ops {request.param})")
    yield request.param, client, img
    leaked = client.containers.list(all=True, filters={"label": TEST_LABEL})
    for c in leaked:
        c.remove(force=True)
    assert not leaked


def test_gpu_image_is_the_stack_it_was_asked_for(gpu_image, tmp_path):
    ops, client, img = gpu_image
    labels = img.labels
    assert labels[LABEL_PREFIX + "flavor"] == "gpu"
    assert labels[LABEL_PREFIX + "horovod_gpu_operations"] == ops
    assert labels[LABEL_PREFIX + "cuda_version"] == "13.0"
    # Built on a base that is nvidia/cuda as far as the build can tell (NVIDIA's NCCL_VERSION,
    # a system NCCL, a banner-printing entry point: tests/test_cuda_base.py), and the lab
    # image runs its commands without that entry point: their output is theirs alone.
    env = dict(e.split("=", 1) for e in img.attrs["Config"]["Env"])
    assert env.get("NCCL_VERSION") and env["NCCL_VERSION"] != labels[LABEL_PREFIX + "nccl_version"]
    assert not img.attrs["Config"]["Entrypoint"]
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "stack.py").write_text(GPU_STACK)
    rc, logs, _ = run_in_image((client, img), "ompi_info --parsable --all | "
                               "grep -c _built_with_cuda_support:value:true; "
                               "python /results/stack.py", tmp_path)
    assert rc == 0, logs
    lines = logs.strip().splitlines()
    assert int(lines[0]) >= 1, "Open MPI is not CUDA-aware"
    s = json.loads(lines[-1])
    assert s["torch_cuda"].startswith("13.0")
    assert s["torch_nccl"] == labels[LABEL_PREFIX + "nccl_version"]   # the matrix's NCCL
    assert s["hvd_mpi"] and s["hvd_gloo"] and s["hvd_cuda"]
    if ops == "NCCL":
        v = s["hvd_nccl"]
        assert f"{v // 10000}.{v // 100 % 100}.{v % 100}" == s["torch_nccl"]   # one NCCL
    else:
        assert not s["hvd_nccl"]
    # every libnccl the loader knows is the wheel's (libnccl.so.2 and the link beside it)
    assert s["ncclso"] and all("/site-packages/nvidia/nccl/lib/" in p for p in s["ncclso"]), s
    assert s["system_nccl"] == [], "the base's NCCL is still in the image"


def test_gpu_image_runs_the_lab_on_a_cpu(gpu_image, tmp_path):
    ops, client, img = gpu_image
    tag = GPU_IMAGES[ops]
    cp = bench_cli("--image", tag, "--np", "2", "--framework", "horovod", "--backend", "gloo",
                   "--max-steps", "15", "--results-dir", str(tmp_path))
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-2000:]
    [r] = results.read_records(next(tmp_path.glob("*/results.jsonl")))[0]
    assert r["status"] == "ok" and r["manifest"]["image"]["id"] == img.id
    assert r["manifest"]["cuda"].startswith("13.0")      # torch's CUDA build, on a CPU
    assert bench_containers(client) == []


def doctor_json(tag, np=2):
    cp = subprocess.run([sys.executable, "-m", "invoke", "doctor", "--image", tag, "--np", str(np),
                         "--json"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert cp.returncode in (0, 1), cp.stdout[-2000:] + cp.stderr[-2000:]
    doc = json.loads(cp.stdout)
    return cp.returncode, {(c["where"], c["name"]): c for c in doc["checks"]}


def test_doctor_checks_the_stack_inside_the_cpu_image(image):
    client, _ = image
    rc, checks = doctor_json(IMAGE)
    assert rc == 0, [c for c in checks.values() if c["status"] == "FAIL"]
    hello = checks[("image", "mpi_hello")]
    assert hello["status"] == "PASS" and hello["value"]["ranks"] == [0, 1]
    hvd = checks[("image", "horovod")]
    assert hvd["status"] == "PASS" and hvd["value"]["controllers"] == ["MPI", "Gloo"]
    assert "PyTorch" in hvd["value"]["frameworks"]
    sweep = checks[("image", "collectives")]
    assert sweep["status"] == "PASS" and sweep["value"]["backend"] == "gloo"
    assert all(r["algbw_gbs"] > 0 for rows in sweep["value"]["ops"].values() for r in rows)
    assert checks[("image", "shm")]["value"]["bytes"] >= 2**30       # bench's 2 GB, not 64 MB
    assert checks[("image", "mpi_cuda_build")]["value"] is False     # Debian's Open MPI
    assert checks[("image", "mpi_hello")]["value"]["cuda_support_query"] is False
    assert bench_containers(client) == []


def test_gpu_images_start_on_drivers_of_minor_version_compatibility(gpu_image):
    """The container toolkit would refuse drivers below nvidia/cuda's NVIDIA_REQUIRE_CUDA
    that run the image (12.x from 525.60.13): the image turns that check off, and
    doctor's driver check says PASS, WARN or FAIL from the matrix instead."""
    from envcheck import probes
    _, _, img = gpu_image
    env = dict(e.split("=", 1) for e in img.attrs["Config"]["Env"])
    assert env.get("NVIDIA_DISABLE_REQUIRE") == "true"
    assert probes.driver_supports("535.104.05", "12.6")[0] == "WARN"
    assert probes.driver_supports("520.61.05", "12.6")[0] == "FAIL"


def test_doctor_sees_the_gpu_images_cuda_aware_mpi_and_one_nccl(gpu_image):
    ops, client, img = gpu_image
    rc, checks = doctor_json(GPU_IMAGES[ops])
    assert checks[("image", "mpi_cuda_build")]["value"] is True
    assert checks[("image", "mpi_hello")]["status"] == "PASS"
    # Open MPI 4.1's MPIX_Query_cuda_support() says yes on a machine with no GPU and no
    # driver: the build's constant, which is why doctor does not call it a run-time test.
    assert checks[("image", "mpi_hello")]["value"]["cuda_support_query"] is True
    hvd = checks[("image", "horovod")]["value"]
    assert hvd["gpu_operations"] == ops
    nccl = checks[("image", "nccl")]
    assert nccl["status"] == "PASS" and nccl["value"]["torch"] == img.labels[LABEL_PREFIX + "nccl_version"]
    if ops == "NCCL":
        assert nccl["value"]["horovod"] == nccl["value"]["torch"]
    # No GPU here: a CUDA torch that sees none is said to run on the CPU.
    assert checks[("both", "finding: a CUDA torch sees the GPUs")]["status"] == "WARN"
    assert bench_containers(client) == []


# No private key in any layer of any built image: a file deleted in a later step still
# ships in the layer that made it (`docker save` holds every layer), so each layer is
# read, file by file. The scan looks at names (ssh host keys) and at contents (any PEM or
# OpenSSH private key block).
import io  # noqa: E402
import re  # noqa: E402
import tarfile  # noqa: E402

# A key, not the marker alone (ssh-keygen and libssh2 hold the marker as a string): the
# BEGIN line, optional PEM headers, then at least two lines of base64 (RFC 7468's form).
PRIVATE_KEY = re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----\r?\n"
                         rb"(?:[A-Za-z-]+: [^\n]*\n)*\r?\n?(?:[A-Za-z0-9+/=]{16,}\r?\n){2,}")
# Keys known by their name: SSH host keys, and MUNGE's (random bytes, no PEM block).
HOST_KEY_NAME = re.compile(r"(^|/)etc/(ssh/ssh_host_[a-z0-9]+_key|munge/munge\.key)$")


class _Rejoined(io.RawIOBase):
    """A stream whose first bytes were already read: gives them back, then the rest."""

    def __init__(self, head, rest):
        self.head, self.rest = head, rest

    def readable(self):
        return True

    def readinto(self, b):
        if self.head:
            n = min(len(b), len(self.head))
            b[:n], self.head = self.head[:n], self.head[n:]
            return n
        data = self.rest.read(len(b))
        b[:len(data)] = data
        return len(data)


def _holds_private_key(name: str, size: int, read) -> bool:
    """Whether a layer's file is a private key: an SSH host key by its name, or any
    file up to 1 MiB whose bytes hold a PEM/OpenSSH private key block."""
    if HOST_KEY_NAME.search(name):
        return True
    if size > 1 << 20:
        return False
    data = read()
    return b"PRIVATE KEY-----" in data and PRIVATE_KEY.search(data) is not None


def layer_dirs(client, tags) -> list[str] | None:
    """Each layer's own directory of these images, where the engine keeps it: overlay2
    stores every layer's files (and its whiteouts) apart, in the image's UpperDir and
    LowerDir (moby: daemon/graphdriver/overlay2, GraphDriver.Data of `docker image
    inspect`). None for another storage driver, or directories this process cannot read."""
    dirs: list[str] = []
    for tag in tags:
        driver = client.images.get(tag).attrs.get("GraphDriver") or {}
        if driver.get("Name") != "overlay2":
            return None
        data = driver.get("Data") or {}
        for d in [data.get("UpperDir"), *(data.get("LowerDir") or "").split(":")]:
            if d and d not in dirs:
                if not os.access(d, os.R_OK | os.X_OK):
                    return None
                dirs.append(d)
    return dirs


def private_keys_in_dirs(dirs) -> list[tuple[str, str]]:
    """(layer directory, path) of every private key in these layer directories."""
    import stat
    found = []
    for root in dirs:
        for here, _, files in os.walk(root):
            for f in files:
                path = os.path.join(here, f)
                st = os.lstat(path)
                if not stat.S_ISREG(st.st_mode):
                    continue
                rel = os.path.relpath(path, root)

                def read(path=path):
                    with open(path, "rb") as fh:
                        return fh.read()
                if _holds_private_key(rel, st.st_size, read):
                    found.append((root, rel))
    return found


def private_keys_in_layers(stream):
    """(layer, path) of every private key in a `docker save` stream: legacy
    (<id>/layer.tar) and OCI (blobs/sha256/<digest>) layouts alike, since every layer
    is an uncompressed tar inside the outer one."""
    found = []
    with tarfile.open(fileobj=stream, mode="r|") as outer:
        for member in outer:
            if not member.isfile() or member.size < 1024:
                continue
            f = outer.extractfile(member)
            head = f.read(512)
            if head[257:262] != b"ustar":
                continue                      # a config or manifest, not a layer
            with tarfile.open(fileobj=io.BufferedReader(_Rejoined(head, f)), mode="r|") as layer:
                for entry in layer:
                    if entry.isfile() and _holds_private_key(
                            entry.name, entry.size, lambda e=entry: layer.extractfile(e).read()):
                        found.append((member.name, entry.name))
    return found


def test_the_layer_scan_finds_a_key_that_a_later_layer_deleted(tmp_path):
    """The scan itself, on a save-shaped stream built here: a key in one layer and its
    whiteout in the next is still found; a public key and an ordinary file are not."""
    def layer(files):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            for name, data in files.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
        return buf.getvalue()
    # A key-shaped block made here from random bytes: no key, not even a fake one, is
    # stored in the repository.
    import base64
    body = base64.encodebytes(os.urandom(96))
    begin, end = b"-----BEGIN OPENSSH " + b"PRIVATE KEY-----\n", b"-----END OPENSSH " + b"PRIVATE KEY-----\n"
    key = begin + body + end
    layers = {"a/layer.tar": layer({"etc/ssh/ssh_host_ed25519_key": b"x" * 10,
                                    "etc/ssh/ssh_host_ed25519_key.pub": b"ssh-ed25519 AAAA",
                                    "root/notes.txt": b"hello"}),
              "blobs/sha256/b": layer({"etc/ssh/.wh.ssh_host_ed25519_key": b"",
                                       "etc/munge/munge.key": b"\x8f" * 128,
                                       "opt/app/secret.pem": key,
                                       # a program that only names the format
                                       "usr/bin/ssh-keygen": b"\0" + begin + b"\0%s\0"}),
              "manifest.json": b"[]" * 600}
    save = io.BytesIO()
    with tarfile.open(fileobj=save, mode="w") as t:
        for name, data in layers.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    save.seek(0)
    assert sorted(private_keys_in_layers(save)) == [
        ("a/layer.tar", "etc/ssh/ssh_host_ed25519_key"), ("blobs/sha256/b", "etc/munge/munge.key"),
        ("blobs/sha256/b", "opt/app/secret.pem")]
    # The same layers as the engine's overlay2 directories hold them.
    dirs = []
    for name, data in layers.items():
        if name.endswith("manifest.json"):
            continue
        root = tmp_path / name.replace("/", "_")
        with tarfile.open(fileobj=io.BytesIO(data)) as t:
            t.extractall(root, filter="data")
        dirs.append(str(root))
    assert sorted(private_keys_in_dirs(dirs)) == [
        (dirs[0], "etc/ssh/ssh_host_ed25519_key"), (dirs[1], "etc/munge/munge.key"),
        (dirs[1], "opt/app/secret.pem")]


def test_no_built_image_holds_a_private_key_in_any_layer():
    client, why = _client()
    if client is None:
        pytest.skip(why)
    tags = [t for t in [IMAGE, *GPU_IMAGES.values()] if client.images.list(name=t)]
    if not tags:
        pytest.skip("no lab image is built (invoke build)")
    # Every layer's files where the engine keeps them (each layer once), else one
    # `docker save` of them all (10 GB here: 2.4 minutes of streaming).
    dirs = layer_dirs(client, tags)
    if dirs is not None:
        found = private_keys_in_dirs(dirs)
    else:
        proc = subprocess.Popen(["docker", "save", *tags], stdout=subprocess.PIPE)
        try:
            found = private_keys_in_layers(proc.stdout)
        finally:
            proc.stdout.close()
            proc.kill()
            proc.wait()
    assert not found, f"private keys in the layers of {tags}: {found}"


def test_gpu_runtime_probe_tries_a_real_gpu_container(image):
    """This engine has no nvidia-container-runtime-hook, so moby registers no "gpu"
    capability and refuses the device request with its own words; the probe says so
    and what to install, and leaves no container behind. (The GPU count is given: this
    machine has none, and the probe's answer depends only on the engine.)"""
    from envcheck import host
    from envcheck.probes import FAIL, PASS, Result
    client, _ = image
    from lab.common.docker_api import MANAGED_BY

    def doctors():      # the probe's containers (the other worker's tests run theirs meanwhile)
        return {c.id for c in client.containers.list(all=True, sparse=True,
                                                     filters={"label": f"{MANAGED_BY}=doctor"})}
    before = doctors()
    r = host.probe_gpu_runtime(Result("gpus", PASS, {"count": 1}, ""),
                               Result("lab_images", PASS, {IMAGE: {}}, ""))
    assert r.status == FAIL and r.value == {"tried": IMAGE}
    assert 'could not select device driver "" with capabilities: [[gpu]]' in r.fix
    assert "nvidia-container-runtime-hook" in r.fix
    assert doctors() == before
