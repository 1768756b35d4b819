"""The parallel strategies (lab.worker.strategies): the pure parts (the model as a list
of layers, the cut into stages, the measure of held bytes), checks from inside two real
ranks (tests/strategy_probe.py under torch.distributed.run), and real 2-process runs
through bench with the records checked."""
import json
import subprocess
import sys

import pytest
import torch

from lab import models as specs
from lab.common.config import ConfigError, RunConfig
from lab.host.errors import BenchError
from lab.host.request.checks import settings_from_flags
from lab.host.run import bench
from lab.host.settings import BenchSettings
from lab.worker import models
from lab.worker.strategies import memory
from tests.conftest import REPO, TORCHVISION_MISSING

needs_torchvision = pytest.mark.skipif(TORCHVISION_MISSING is not None,
                                       reason=f"torchvision: {TORCHVISION_MISSING}")


# ---------------------------------------------------------------- pure parts

def test_mnist_layers_compute_the_models_forward():
    torch.manual_seed(0)
    model = models.build("mnist", 1, 28, 10)[0].eval()
    layers = models.sequential_layers("mnist", model)
    assert sum(map(models.has_parameters, layers)) == specs.get("mnist").most_stages
    x = torch.randn(5, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(torch.nn.Sequential(*layers).eval()(x), model(x))


@needs_torchvision
def test_resnet_layers_compute_the_models_forward():
    torch.manual_seed(0)
    model = models.build("resnet50", 1, 28, 10)[0].eval()
    layers = models.sequential_layers("resnet50", model)
    assert sum(map(models.has_parameters, layers)) == specs.get("resnet50").most_stages
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(torch.nn.Sequential(*layers).eval()(x), model(x))
    # every parameter of the model is in exactly one layer
    ids = [id(p) for layer in layers for p in layer.parameters()]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))


def test_cut_points_are_contiguous_nonempty_and_even():
    assert models.cut_points([1, 1, 1, 1], 2) == [(0, 2), (2, 4)]
    assert models.cut_points([10, 1, 1, 1, 1], 2) == [(0, 1), (1, 5)]
    assert models.cut_points([1, 1, 1, 1, 100], 2) == [(0, 4), (4, 5)]  # last layer alone
    assert models.cut_points([5, 0, 0], 3) == [(0, 1), (1, 2), (2, 3)]
    assert models.cut_points([3, 1, 2], 1) == [(0, 3)]
    with pytest.raises(ValueError):
        models.cut_points([1, 1], 3)


def test_layer_costs_count_convolutions_and_linear_layers():
    torch.manual_seed(0)
    model = models.build("mnist", 1, 28, 10)[0]
    costs = models.layer_costs(models.sequential_layers("mnist", model), torch.zeros(1, 1, 28, 28))
    # conv1: 10 x 24 x 24 outputs x (1 x 5 x 5); conv2: 20 x 8 x 8 x (10 x 5 x 5);
    # fc1: 50 x 320; fc2: 10 x 50; the rest costs nothing.
    assert costs[0] == 10 * 24 * 24 * 25 and costs[3] == 20 * 8 * 8 * 250
    assert costs[8] == 50 * 320 and costs[11] == 10 * 50
    assert sum(costs) == costs[0] + costs[3] + costs[8] + costs[11]


def test_holdings_measure_storages_once():
    lin = torch.nn.Linear(100, 10)     # 1,010 float32 values
    opt = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
    assert memory.holdings(lin.parameters(), opt) == {"parameters": 4040, "gradients": 0,
                                                      "optimizer_state": 0, "total": 4040}
    lin(torch.randn(3, 100)).sum().backward()
    opt.step()   # momentum buffers appear
    h = memory.holdings(lin.parameters(), opt)
    assert h == {"parameters": 4040, "gradients": 4040, "optimizer_state": 4040, "total": 12120}
    # a view of a parameter is the parameter's storage: not counted again
    assert memory.storage_bytes([lin.weight, lin.weight[:5], lin.weight.t()]) == 4000


def test_strategy_rules_are_one_sentence():
    with pytest.raises(ConfigError, match="--framework ddp"):
        RunConfig(strategy="zero1", framework="horovod").check()
    with pytest.raises(ConfigError, match="--device cuda"):
        RunConfig(strategy="dataparallel", framework="none").check()
    with pytest.raises(ConfigError, match="multiple of --micro-batches"):
        RunConfig(strategy="pipeline", batch_size=10, micro_batches=4).check()
    with pytest.raises(ConfigError, match="1f1b"):
        RunConfig(strategy="pipeline", schedule="1f1b", micro_batches=2).check_world(4)
    with pytest.raises(ConfigError, match="at most 4 pipeline stages"):   # conv1, conv2, fc1, fc2
        RunConfig(strategy="pipeline").check_world(5)
    with pytest.raises(ConfigError, match="--compression none"):
        RunConfig(strategy="fsdp", compression="fp16").check()
    assert RunConfig(strategy="pipeline").data_world(4) == 1
    assert RunConfig(strategy="zero1").data_world(4) == 4


def test_strategy_flags_sweep_and_resolve_the_framework():
    s, lists = settings_from_flags({"strategy": "ddp,zero1,pipeline"}, {"np": "2"})
    assert lists["strategy"] == ["ddp", "zero1", "pipeline"]
    with pytest.raises(BenchError, match="unknown --strategy 'zero9'"):
        settings_from_flags({"strategy": "zero9"}, {"np": "2"})
    from lab.host.places.launch import resolve_framework
    hvd = {"horovod": {}}
    assert resolve_framework("auto", hvd, "ddp")[0] == "horovod"
    assert resolve_framework("auto", hvd, "fsdp")[0] == "ddp"
    assert resolve_framework("auto", hvd, "dataparallel")[0] == "none"


def test_dataparallel_and_deepspeed_refused_before_launch(tmp_path):
    stack = bench.probe_stack()
    with pytest.raises(BenchError, match="--device cuda"):
        bench.run(BenchSettings(np=[2], strategy="dataparallel", results_dir=str(tmp_path)),
                  stack=stack, echo=lambda _: None)
    no_ds = {k: v for k, v in stack.items() if not k.startswith("deepspeed")}
    with pytest.raises(BenchError, match=r"pip install -e '.\[deepspeed\]'"):
        bench.run(BenchSettings(np=[2], strategy="deepspeed", results_dir=str(tmp_path)),
                  stack=no_ds, echo=lambda _: None)
    assert not (tmp_path / "results.jsonl").exists()


# ---------------------------------------------------------------- inside two ranks

def probe(check: str, tmp_path) -> list:
    out = tmp_path / f"{check}.json"
    cp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                         "--nproc-per-node=2", "-m", "tests.strategy_probe", check, str(out)],
                        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stderr[-3000:]
    return json.loads(out.read_text())


def test_fsdp_gradients_on_gloo_equal_one_process(tmp_path):
    parts = probe("fsdp-grads", tmp_path)
    for rank in parts:
        for name in ("mnist", "uneven"):
            # SUM then divide (what the strategy sets on Gloo): the one-process gradient.
            r = rank[f"{name}/sum"]
            assert r["max_abs_error"] < 1e-6 * max(1.0, r["max_abs_gradient"]), (name, r)
            print(f"FSDP2 on Gloo, {name}, its default AVG: max abs gradient error "
                  f"{rank[name + '/avg']['max_abs_error']:.3g} of {r['max_abs_gradient']:.3g}")


def test_pipeline_outputs_equal_one_process(tmp_path):
    parts = probe("pipeline-outputs", tmp_path)
    last = parts[1]
    assert "mnist/pipeline" in last and "mnist/model-parallel" in last
    if TORCHVISION_MISSING is None:
        assert "resnet50/pipeline" in last
    for name, r in last.items():
        assert r["max_abs_error"] < 1e-4, name
        assert len(r["stages"]) == 2


@needs_torchvision
def test_model_parallel_step_equals_one_process_step(tmp_path):
    parts = probe("model-parallel-step", tmp_path)
    assert sum(p["params"] for p in parts) == sum(
        p.numel() for p in models.build("resnet50", 1, 28, 10)[0].parameters())
    for p in parts:
        assert p["max_abs_gradient"] > 0                       # the step did move them
        assert p["param_max_abs_error"] < 1e-5
    assert parts[1]["loss"] == pytest.approx(parts[1]["ref_loss"], rel=1e-5)


# ---------------------------------------------------------------- real runs through bench

def run(stack, tmp_path, **kw):
    settings = dict(np=[2], data="digits", epochs=4, batch_size=16, warmup_steps=2,
                    results_dir=str(tmp_path), timeout_s=600, where="local")
    settings.update(kw)
    lines = []
    outcome = bench.run(BenchSettings(**settings), echo=lines.append, stack=stack)
    assert outcome.failed == 0, "\n".join(lines[-30:])
    return outcome.records


@pytest.mark.parametrize("strategy,extra", [
    ("ddp", {"framework": "ddp"}), ("zero1", {}), ("fsdp", {}),
    ("pipeline", {"micro_batches": 4}), ("pipeline", {"micro_batches": 4, "schedule": "1f1b"}),
    # model-parallel is one micro-batch: a --schedule 1f1b of a sweep runs it with GPipe
    ("model-parallel", {"schedule": "1f1b"}),
])
def test_strategy_learns_on_digits(stack, tmp_path, strategy, extra):
    (r,) = run(stack, tmp_path, strategy=strategy, **extra)
    assert r["status"] == "ok" and r["config"]["strategy"] == strategy
    assert r["world"]["np"] == 2 and len(r["world"]["hosts"]) == 2
    losses = [e["train_loss"] for e in r["epochs"]]
    assert losses[-1] < 0.85 * losses[0], losses
    f = r["figures"]
    assert len(f["held_bytes"]) == 2 and all(h["parameters"] > 0 for h in f["held_bytes"])
    assert f["test_accuracy"] > 0.3   # 10 classes: chance is 0.1
    if strategy in ("pipeline", "model-parallel"):
        # each rank holds its stage: together the model, once
        assert sum(h["parameters"] for h in f["held_bytes"]) == 21840 * 4
        assert f["parameter_digests"] == [None, None]
        assert f["batch_semantics"].startswith("16 in all")
        want = "gpipe" if strategy == "model-parallel" else extra.get("schedule", "gpipe")
        assert f["schedule"] == want
        # the stages see the same batches: the data is not split
        assert f["throughput_img_s"] == pytest.approx(
            16 * f["timed_steps"] / sum(r["step_times_s"]), rel=0.5)
    else:
        d = f["parameter_digests"]
        assert d[0] is not None and d[0] == d[1], d   # the replicas agree
        assert f["batch_semantics"] == "16 per process (32 in all)"


@needs_torchvision
def test_sharded_strategies_hold_half_per_rank(stack, tmp_path):
    """ZeRO-1's optimizer state and FSDP's parameters and optimizer state on ResNet-50
    (MNIST-shaped digits), measured at np 2 against the whole model's, measured at np 1
    (ZeRO-1 at one rank holds all of it): each of 2 ranks holds about half."""
    small = dict(model="resnet50", epochs=1, batch_size=4, max_steps=3, warmup_steps=1)
    by = {}
    for strategy, nps in (("zero1", [1, 2]), ("fsdp", [2])):
        for r in run(stack, tmp_path / strategy, strategy=strategy, np=nps, **small):
            by[strategy, r["world"]["np"]] = r["figures"]["held_bytes"]
    whole = by["zero1", 1][0]
    assert whole["parameters"] == whole["optimizer_state"] > 90e6   # ResNet-50: 23.5M values
    for kind, strategy in (("optimizer_state", "zero1"), ("parameters", "fsdp"),
                           ("optimizer_state", "fsdp")):
        one = whole[kind]
        two = [h[kind] for h in by[strategy, 2]]
        for share in two:
            assert 0.35 < share / one < 0.65, (strategy, kind, two, one)
        assert sum(two) == pytest.approx(one, rel=0.02)
    # ZeRO-1 keeps whole parameters on every rank; FSDP a shard of them
    assert by["zero1", 2][0]["parameters"] == whole["parameters"]


@pytest.mark.slow
def test_vgg16_is_cut_into_stages_that_hold_it_once(stack, tmp_path):
    """VGG-16 (134M parameters on the digits, 537 MB of gradients) through a pipeline,
    which runs its own list of layers (net.layers: every convolution, pooling, the
    flatten, dropout) cut into 2 stages on 2 real ranks, at batch 4, 2 steps: the stages
    hold the model once between them. One launch (about a minute of CI): its other
    frameworks and strategies take it as any model (each run by hand here:
    docs/pages/running.md, Models); its FSDP units are checked in process
    (tests/test_models.py)."""
    whole = 4 * sum(p.numel() for p in models.build("vgg16", 1, 32, 10)[0].parameters())
    (pipe,) = run(stack, tmp_path, model="vgg16", strategy="pipeline", micro_batches=2, epochs=1,
                  batch_size=4, max_steps=2, warmup_steps=1)
    assert pipe["status"] == "ok" and pipe["config"]["model"] == "vgg16" and pipe["world"]["np"] == 2
    held = [h["parameters"] for h in pipe["figures"]["held_bytes"]]
    assert sum(held) == whole and all(h > 0 for h in held), held
