"""--precision (lab.worker.precision, RunConfig.check_precision): what each precision
chooses (autocast's dtype, the gradient scaler), the refusals before any rank starts, the
Horovod order of fp16's scaler, and real 2-rank bf16 runs on the CPU through DDP,
Horovod, FSDP and DeepSpeed whose records say bf16 and whose forward ran in bfloat16."""
import subprocess
import sys

import pytest
import torch

from lab.common import options
from lab.common.config import ConfigError, RunConfig
from lab.host.errors import BenchError
from lab.host.request.checks import settings_from_flags
from lab.host.run import bench
from lab.host.settings import BenchSettings
from lab.worker import precision
from tests.conftest import requires_horovod
from tests.test_strategy_deepspeed import needs_deepspeed

CPU = torch.device("cpu")


# ---------------------------------------------------------------- what each precision chooses

@pytest.mark.parametrize("name,dtype,plain,sharded", [
    ("fp32", None, None, None), ("tf32", None, None, None),
    ("bf16", torch.bfloat16, None, None), ("fp16", torch.float16, "grad", "sharded")])
def test_autocast_dtype_and_scaler_per_precision(name, dtype, plain, sharded):
    assert precision.autocast_dtype(name) is dtype
    assert precision.scaler_kind(name, sharded=False) == plain
    assert precision.scaler_kind(name, sharded=True) == sharded
    scaler = precision.scaler(name, CPU, sharded=True)
    if sharded is None:
        assert scaler is None
    else:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
        assert isinstance(scaler, ShardedGradScaler)
        assert type(precision.scaler(name, CPU)) is torch.amp.GradScaler


def test_autocast_covers_the_forward_at_the_precisions_dtype():
    layer = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    with precision.autocast("bf16", CPU):
        assert layer(x).dtype == torch.bfloat16
    for name in ("fp32", "tf32"):
        with precision.autocast(name, CPU):
            assert layer(x).dtype == torch.float32
    # nn.DataParallel's threads: autocast entered inside the forward
    wrapped = precision.AutocastForward(layer, "bf16", CPU)
    assert wrapped(x).dtype == torch.bfloat16


def test_channels_last_only_for_the_cnns_on_gpus_below_fp32():
    cuda = torch.device("cuda")
    assert precision.channels_last("bf16", cuda, "resnet50")
    assert precision.channels_last("tf32", cuda, "mnist")
    assert not precision.channels_last("fp32", cuda, "mnist")
    assert not precision.channels_last("bf16", cuda, "lstm")
    assert not precision.channels_last("bf16", CPU, "mnist")
    # not where every parameter must be contiguous: Horovod's collectives, FSDP's shards
    assert not precision.channels_last("bf16", cuda, "resnet50", framework="horovod")
    assert not precision.channels_last("bf16", cuda, "resnet50", strategy="fsdp")
    assert precision.channels_last("bf16", cuda, "resnet50", strategy="zero1")
    conv = torch.nn.Conv2d(8, 16, 3).to(memory_format=torch.channels_last)
    assert not conv.weight.is_contiguous()          # what those two refuse
    x = torch.zeros(2, 3, 4, 4)
    assert precision.to_layout(x, True).is_contiguous(memory_format=torch.channels_last)
    assert precision.to_layout(torch.zeros(2, 3), True).shape == (2, 3)


class HorovodLike(torch.optim.SGD):
    """What the step asks of Horovod's DistributedOptimizer, its calls written down."""

    def __init__(self, params, calls):
        super().__init__(params, lr=0.1)
        self.calls = calls
        self.skipping = False

    def synchronize(self):
        self.calls.append("synchronize")

    def skip_synchronize(self):
        import contextlib
        outer = self

        @contextlib.contextmanager
        def skip():
            outer.skipping = True
            yield
            outer.skipping = False
        return skip()

    def step(self, closure=None):
        self.calls.append("step (skipping synchronize)" if self.skipping else "step")
        return super().step(closure)


def test_fp16_under_horovod_unscales_between_synchronize_and_the_step():
    """Horovod's AMP order: backward of the scaled loss, synchronize(), unscale_, the step
    under skip_synchronize(), update (lab.worker.strategies.base.Strategy.step). fp16
    autocast runs on the CPU in torch, so the order is checked here for real."""
    from lab.worker.strategies.base import Strategy

    calls = []
    s = Strategy(RunConfig(precision="fp16"), d=None, device=CPU)
    assert type(s.scaler) is torch.amp.GradScaler
    s.loss_fn = torch.nn.functional.cross_entropy
    s.model = torch.nn.Linear(4, 3)
    s.optimizer = HorovodLike(s.model.parameters(), calls)
    unscale = s.scaler.unscale_
    s.scaler.unscale_ = lambda opt: (calls.append("unscale_"), unscale(opt))[1]
    before = s.model.weight.detach().clone()
    s.step(torch.randn(8, 4), torch.randint(0, 3, (8,)))
    assert calls == ["synchronize", "unscale_", "step (skipping synchronize)"]
    assert s.forward_dtype == "float16"
    assert not torch.equal(before, s.model.weight)     # the scaled step did update


# ---------------------------------------------------------------- refused before any rank

@pytest.mark.parametrize("config,message", [
    (dict(precision="fp16"), "--precision fp16 is for GPUs: add --device cuda"),
    (dict(precision="tf32"), "--precision tf32 is for GPUs: add --device cuda"),
    (dict(precision="fp16", device="cuda", backend="nccl", strategy="pipeline"),
     "the pipeline strategy cannot run --precision fp16"),
    (dict(precision="bf16", strategy="model-parallel"), "the model-parallel strategy cannot run"),
    (dict(precision="bf16", strategy="rpc-pipeline"), "the rpc-pipeline strategy cannot run"),
    (dict(precision="fp8"), "unknown precision 'fp8'"),
])
def test_a_precision_that_cannot_be_honoured_is_one_sentence(config, message):
    with pytest.raises(ConfigError, match=message) as e:
        RunConfig(**config).check()
    text = str(e.value)
    assert "\n" not in text and text.count(": ") <= 2
    RunConfig(precision="fp16", device="cuda", backend="nccl", strategy="fsdp").check()


def test_precision_sweeps_and_is_part_of_the_key_and_the_setup():
    o = options.BY_NAME["precision"]
    assert o.sweeps and o.key and o.setup and o.value == "fp32"
    assert "precision" in options.KEY_FIELDS and "precision" in options.SETUP_FIELDS
    _, lists = settings_from_flags({"precision": "fp32,bf16"}, {"np": "2"})
    assert lists["precision"] == ["fp32", "bf16"]
    key = options.run_key({"precision": "bf16"}, 1, 2, 0)
    assert key != options.run_key({}, 1, 2, 0) == options.run_key({"precision": "fp32"}, 1, 2, 0)


def test_fp16_on_the_cpu_is_refused_by_bench_and_the_cli(tmp_path):
    with pytest.raises(BenchError, match="--precision fp16 is for GPUs"):
        bench.run(BenchSettings(np=[2], precision="fp16", results_dir=str(tmp_path)),
                  stack=bench.probe_stack(), echo=lambda _: None)
    cp = subprocess.run([sys.executable, "-m", "invoke", "bench", "--np", "2", "--strategy", "pipeline",
                         "--precision", "bf16", "--results-dir", str(tmp_path)],
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 2, cp.stdout[-2000:] + cp.stderr
    assert "the pipeline strategy cannot run --precision bf16" in cp.stderr
    assert "Traceback" not in cp.stderr
    assert not list(tmp_path.rglob("results.jsonl"))


class Upcasting(torch.nn.Module):
    """Layers in autocast's dtype, an output in float32: as the MNIST CNN on a GPU, whose
    log_softmax CUDA's autocast runs in float32."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(4, 8), torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))).float()


def test_the_forward_dtype_is_what_the_layers_computed_in_not_the_output():
    """bf16 on the CPU with a model whose output is upcast: its layers ran in bfloat16,
    which the record says; the hooks that saw it are gone after the first step."""
    from lab.worker.strategies.base import Strategy
    s = Strategy(RunConfig(precision="bf16"), d=None, device=CPU)
    s.loss_fn = torch.nn.functional.cross_entropy
    s.model = Upcasting()
    s.optimizer = torch.optim.SGD(s.model.parameters(), lr=0.1)
    x = torch.randn(8, 4)
    with precision.autocast("bf16", CPU):
        assert s.model(x).dtype == torch.float32         # the output says float32
    s.step(x, torch.randint(0, 3, (8,)))
    assert s.forward_dtype == "bfloat16"
    assert all(not m._forward_hooks for m in s.model.modules())
    fp32 = Strategy(RunConfig(precision="fp32"), d=None, device=CPU)
    fp32.loss_fn, fp32.model = s.loss_fn, Upcasting()
    fp32.optimizer = torch.optim.SGD(fp32.model.parameters(), lr=0.1)
    fp32.step(x, torch.randint(0, 3, (8,)))
    assert fp32.forward_dtype == "float32"


def test_a_model_without_weighted_layers_records_its_outputs_dtype():
    with precision.layer_dtypes(torch.nn.ReLU()) as seen:
        out = torch.nn.ReLU()(torch.randn(2, dtype=torch.float16))
    assert not seen and precision.forward_dtype(seen, out) == "float16"


# ---------------------------------------------------------------- real bf16 runs on the CPU

@pytest.fixture(scope="module")
def stack():
    return bench.probe_stack()


def bf16_run(stack, tmp_path, **kw):
    settings = dict(np=[2], precision="bf16", data="digits", epochs=1, batch_size=8, max_steps=4,
                    warmup_steps=1, results_dir=str(tmp_path), timeout_s=300, where="local")
    settings.update(kw)
    lines = []
    outcome = bench.run(BenchSettings(**settings), echo=lines.append, stack=stack)
    assert outcome.failed == 0 and len(outcome.records) == 1, "\n".join(lines[-30:])
    (r,) = outcome.records
    assert r["status"] == "ok" and r["config"]["precision"] == "bf16"
    assert r["figures"]["forward_dtype"] == "bfloat16"
    assert all(torch.isfinite(torch.tensor(e["train_loss"])) for e in r["epochs"])
    return r


@pytest.mark.parametrize("framework,strategy", [
    ("ddp", "ddp"), pytest.param("horovod", "ddp", marks=requires_horovod), ("ddp", "fsdp")])
def test_bf16_trains_on_the_cpu(stack, tmp_path, framework, strategy):
    r = bf16_run(stack, tmp_path, framework=framework, strategy=strategy)
    d = r["figures"]["parameter_digests"]
    assert d[0] is not None and d[0] == d[1]      # the replicas agree
    # bench's table says which precision ran
    from lab.report import summary
    head, _, row = summary.render(summary.rows([r])).splitlines()[:3]
    cells = [c.strip() for c in row.split("|")]
    assert cells[[c.strip() for c in head.split("|")].index("precision")] == "bf16"


@needs_deepspeed
@pytest.mark.slow
def test_bf16_trains_on_the_cpu_through_deepspeed(stack, tmp_path):
    bf16_run(stack, tmp_path, framework="ddp", strategy="deepspeed")


def test_the_ceiling_is_measured_at_the_runs_precision():
    from lab.host.run.ceiling import command
    from lab.worker.ceiling import measure
    out = measure("mnist", batch_size=4, steps=2, warmup=0, min_seconds=0, precision_name="bf16")
    assert out["precision"] == "bf16" and out["forward_dtypes"] == ["bfloat16"]
    argv = command(BenchSettings(np=[1], precision="bf16"), 1, "python")
    assert argv[argv.index("--precision") + 1] == "bf16"


def test_the_report_never_pools_precisions_and_reads_old_records_as_fp32():
    from lab.report import records, summary

    def record(**config):
        return {"status": "ok", "config": {"model": "mnist", "framework": "ddp", "backend": "gloo",
                                           "compression": "none", **config}, "world": {"np": 2}}
    old, fp32, bf16 = record(), record(precision="fp32"), record(precision="bf16")
    assert records.setup_key(old) == records.setup_key(fp32) != records.setup_key(bf16)
    assert summary.config_key(old) == summary.config_key(fp32) != summary.config_key(bf16)
    assert records.setup_label(bf16, [fp32, bf16]).startswith("bf16")
