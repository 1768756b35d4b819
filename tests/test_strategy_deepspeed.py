"""The deepspeed strategy (lab.worker.strategies.deepspeed): real 2-process runs on the
CPU through bench (torch.distributed.run, Gloo, DeepSpeed's CPU accelerator), one per
ZeRO stage, the records checked: it learns, the replicas agree, and what each rank
holds shrinks where the stage says it should.

The MNIST network has 21,840 parameters: 87,360 bytes in fp32. ZeRO partitions its
flattened parameters (not whole tensors), so at 2 ranks each holds exactly half of
what it partitions."""
import importlib.metadata
import os
import subprocess
import sys

import pytest

from lab.common import versions
from lab.host.images import build as images
from lab.host.run import bench
from lab.host.settings import BenchSettings
from tests.conftest import REPO


def _deepspeed_state():
    """None when deepspeed imports (on the CPU accelerator, as the ranks will), else why not."""
    try:
        importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        return "DeepSpeed is not installed (pip install -e '.[deepspeed]', docker/setup-venv.sh)"
    cp = subprocess.run([sys.executable, "-c", "import deepspeed"], capture_output=True, text=True,
                        env={**os.environ, "DS_ACCELERATOR": "cpu"})
    if cp.returncode != 0:
        return "deepspeed does not import: " + (cp.stderr.strip().splitlines() or [""])[-1]
    return None


DEEPSPEED_MISSING = _deepspeed_state()
needs_deepspeed = pytest.mark.skipif(DEEPSPEED_MISSING is not None, reason=DEEPSPEED_MISSING or "")

MNIST_PARAM_BYTES = 21_840 * 4


def test_one_deepspeed_version_for_the_extra_and_the_images():
    """pyproject.toml's deepspeed extra pins the matrix's version, which every image
    gets as a build argument."""
    tomllib = pytest.importorskip("tomllib")   # Python 3.11 and later
    want = versions.read()["DEEPSPEED_VERSION"]
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extra["deepspeed"] == [f"deepspeed=={want}"]
    for flavor in images.FLAVORS:
        args = images.build_args(images.BuildSettings(flavor=flavor), versions.read())
        assert args["DEEPSPEED_VERSION"] == want


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One run per ZeRO stage, made when a test first asks for it."""
    stack = bench.probe_stack()
    done: dict[tuple, dict] = {}

    def run(stage: int, strategy: str = "deepspeed") -> dict:
        key = (strategy, stage)
        if key not in done:
            out = tmp_path_factory.mktemp(f"{strategy}{stage}")
            lines: list[str] = []
            outcome = bench.run(BenchSettings(
                np=[2], framework="ddp", backend="gloo", strategy=strategy, zero_stage=stage,
                data="digits", epochs=2, batch_size=32, warmup_steps=3,
                results_dir=str(out), timeout_s=180), echo=lines.append, stack=stack)
            assert outcome.failed == 0 and len(outcome.records) == 1, "\n".join(lines)
            done[key] = outcome.records[0]
        return done[key]
    return run


def check_learns_and_agrees(r, stage):
    f = r["figures"]
    assert r["status"] == "ok" and r["config"]["strategy"] == "deepspeed"
    assert r["config"]["zero_stage"] == stage == f["zero_stage"]
    assert f["deepspeed_version"] == importlib.metadata.version("deepspeed")
    losses = [ep["train_loss"] for ep in r["epochs"]]
    assert losses[-1] < losses[0], losses
    # each rank its own shard of 32: the global batch is 64
    assert f["batch_semantics"] == "32 per process (64 in all)"
    assert f["lr_used"] == pytest.approx(r["config"]["lr"] * 2)
    assert all(len(set(ep["shard_sizes"])) == 1 for ep in r["epochs"])
    # the two ranks end with the same model, bit for bit (ZeRO-3: gathered whole)
    digests = f["parameter_digests"]
    assert len(digests) == 2 and digests[0] is not None and digests[0] == digests[1]
    assert len(f["held_bytes"]) == 2 and f["held_bytes"][0] == f["held_bytes"][1]
    return f["held_bytes"][0]


@needs_deepspeed
@pytest.mark.slow
def test_stage0_is_data_parallel_with_whole_state_on_each_rank(runs):
    r = runs(0)
    held = check_learns_and_agrees(r, 0)
    # the whole model, and SGD's momentum for all of it; no master copy
    assert held["parameters"] == MNIST_PARAM_BYTES
    assert held["optimizer_state"] == MNIST_PARAM_BYTES
    assert held["gradients"] == 0   # engine.step sets them to None
    split = r["figures"]["optimizer_state_split"]
    assert split == [{"master_weights": 0, "wrapped_optimizer_state": MNIST_PARAM_BYTES}] * 2
    assert r["figures"]["reduce_bucket_bytes"] == [0, 0]
    # the same training as torch's DDP: same data, seed, averaged gradients and SGD step
    ddp = runs(0, strategy="ddp")
    assert [ep["train_loss"] for ep in r["epochs"]] == pytest.approx(
        [ep["train_loss"] for ep in ddp["epochs"]], rel=1e-3)


@needs_deepspeed
@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2])
def test_stages_1_and_2_split_the_optimizer_state(runs, stage):
    zero0 = runs(0)["figures"]["held_bytes"][0]
    r = runs(stage)
    held = check_learns_and_agrees(r, stage)
    assert held["parameters"] == zero0["parameters"]   # whole on every rank
    for part in r["figures"]["optimizer_state_split"]:
        # SGD's momentum: for this rank's half only
        assert part["wrapped_optimizer_state"] == pytest.approx(zero0["optimizer_state"] / 2, rel=0.02)
        # ZeRO's fp32 master copy of this rank's half of the parameters
        assert part["master_weights"] == pytest.approx(zero0["parameters"] / 2, rel=0.02)
    # both counted as optimizer state: at 2 ranks as much as stage 0's momentum alone
    assert held["optimizer_state"] == sum(r["figures"]["optimizer_state_split"][0].values())


@needs_deepspeed
@pytest.mark.slow
def test_stage3_partitions_the_parameters(runs):
    zero0 = runs(0)["figures"]["held_bytes"][0]
    r = runs(3)
    held = check_learns_and_agrees(r, 3)
    assert held["parameters"] == pytest.approx(zero0["parameters"] / 2, rel=0.02)
    # ZeRO-3 keeps this rank's gradient partition between steps
    assert held["gradients"] == pytest.approx(zero0["parameters"] / 2, rel=0.02)
    for part in r["figures"]["optimizer_state_split"]:
        assert part["wrapped_optimizer_state"] == pytest.approx(zero0["optimizer_state"] / 2, rel=0.02)
        assert part["master_weights"] == pytest.approx(zero0["parameters"] / 2, rel=0.02)
    # the lock-step evaluation (every rank runs as many forward passes) ran through
    assert 0 < r["figures"]["test_accuracy"] <= 1
    # a reduce bucket as large as the model, left out of the holdings
    assert r["figures"]["reduce_bucket_bytes"] == [MNIST_PARAM_BYTES] * 2
