"""One model spec: each model is one folder under lab/models, registered once; the LSTM on
sequential MNIST is the proof that a model is one place. Real ranks learn with it."""
import json
import subprocess
import sys

import pytest
import torch
from conftest import REPO, TORCHVISION_MISSING, requires_horovod

from lab import models as specs
from lab.common import results
from lab.common.config import DATASETS, RunConfig
from lab.models.lstm import net as lstm_net
from lab.worker import models

needs_torchvision = pytest.mark.skipif(TORCHVISION_MISSING is not None, reason=f"torchvision: {TORCHVISION_MISSING}")


@pytest.mark.parametrize("name", specs.names())
def test_each_model_is_its_folder_and_its_layers_compute_its_forward(name):
    spec = specs.get(name)
    assert (REPO / "lab" / "models" / name / "net.py").is_file()
    channels, size, classes = spec.input("digits")
    torch.manual_seed(0)
    model, _ = models.build(name, channels, size, classes)
    model.eval()
    layers = models.sequential_layers(name, model)
    x = torch.randn(2, channels, size, size)
    with torch.no_grad():
        torch.testing.assert_close(torch.nn.Sequential(*layers).eval()(x), model(x))
    ids = [id(p) for layer in layers for p in layer.parameters()]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    # the spec's most pipeline stages: the layers with parameters (a stage starts at one)
    cuttable = [models.has_parameters(layer) for layer in layers]
    assert sum(cuttable) == spec.most_stages
    costs = models.layer_costs(layers, x[:1])
    for stages in range(1, spec.most_stages + 1):     # every count a pipeline may ask for
        bounds = models.cut_points(costs, stages, cuttable)
        assert len(bounds) == stages and bounds[0][0] == 0 and bounds[-1][1] == len(layers)
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))          # contiguous
        assert all(any(models.has_parameters(layer) for layer in layers[a:b]) for a, b in bounds)
    assert set(models.fsdp_units(name, model)) <= set(model.modules())


@needs_torchvision
def test_the_kits_resnet50_is_torchvisions_network():
    """Where torchvision is missing, ResNet-50 is built from torch.nn: torchvision's state
    dict loads into it unchanged (every name and shape) and gives the same outputs."""
    import torchvision

    from lab.models.resnet50.net import ResNet50
    ours, theirs = ResNet50(10), torchvision.models.resnet50(weights=None, num_classes=10)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    ours.load_state_dict(theirs.state_dict(), strict=True)
    ours.eval(), theirs.eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x))
    # the same initialization: per tensor, the same spread
    fresh = ResNet50(10)
    for (name, a), b in zip(fresh.state_dict().items(), theirs.state_dict().values()):
        if a.is_floating_point() and a.numel() > 1000:
            assert abs(a.std().item() - b.std().item()) < 0.1 * b.std().item() + 1e-6, name


@needs_torchvision
def test_the_kits_vgg16_is_torchvisions_network():
    """Where torchvision is missing, VGG-16 is built from torch.nn: torchvision's state
    dict loads into it unchanged (every name, shape and their order) and gives the same
    outputs (dropout off); 138,357,544 parameters at 1,000 classes (torchvision's
    VGG16_Weights.IMAGENET1K_V1 meta, num_params), 32 tensors (the cost model's count)."""
    import torchvision

    from lab.models.vgg16.net import VGG16
    from lab.report.cost_model import MODEL_TENSORS
    ours, theirs = VGG16(1000), torchvision.models.vgg16(weights=None, num_classes=1000)
    assert sum(p.numel() for p in ours.parameters()) == 138_357_544
    assert [(n, p.shape) for n, p in ours.named_parameters()] == \
        [(n, p.shape) for n, p in theirs.named_parameters()]
    assert len(list(ours.parameters())) == MODEL_TENSORS["vgg16"]
    # the same initialization: per tensor, the same spread
    for (name, a), b in zip(ours.state_dict().items(), theirs.state_dict().values()):
        if a.numel() > 1000:
            assert abs(a.std().item() - b.std().item()) < 0.1 * b.std().item() + 1e-6, name
    ours.load_state_dict(theirs.state_dict(), strict=True)
    ours.eval(), theirs.eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x))


@pytest.mark.parametrize("name, cls", [("resnet50", "ResNet50"), ("vgg16", "VGG16")])
def test_without_torchvision_a_model_is_built_from_torch_nn(monkeypatch, name, cls):
    import builtins
    import importlib
    real = builtins.__import__

    def no_torchvision(name, *a, **k):
        if name == "torchvision" or name.startswith("torchvision."):
            raise ImportError("No module named 'torchvision'")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_torchvision)
    twin = getattr(importlib.import_module(f"lab.models.{name}.net"), cls)
    channels, size, classes = specs.get(name).input("digits")
    model, _ = models.build(name, channels, size, classes)
    assert type(model) is twin
    first = model.conv1 if name == "resnet50" else model.features[0]
    assert first.in_channels == 1
    with torch.no_grad():
        assert model.eval()(torch.zeros(1, channels, size, size)).shape == (1, classes)


def test_vgg16_takes_the_digits_padded_to_32_with_their_background():
    """Five 2x2 poolings take 28x28 to nothing: the digits reach VGG-16 centred in 32x32,
    the border the images' blank pixel; the other models keep 28x28."""
    from lab.worker import data
    assert specs.get("vgg16").input("digits") == (1, 32, 10)
    assert specs.get("vgg16").input("synthetic") == (3, 224, 1000)
    assert specs.get("resnet50").input("digits") == (1, 28, 10)
    small = RunConfig(model="resnet50", data="digits")
    big = RunConfig(model="vgg16", data="digits")
    a, b = data.load(small), data.load(big)
    assert (a.size, b.size) == (28, 32) and b.train.images.shape[1:] == (1, 32, 32)
    torch.testing.assert_close(b.train.images[:, :, 2:30, 2:30], a.train.images)
    torch.testing.assert_close(b.test.labels, a.test.labels)
    blank = a.train.images.min()                    # a blank pixel, normalised
    assert torch.all(b.train.images[:, :, :2] == blank) and torch.all(b.train.images[:, :, :, 30:] == blank)


def test_the_registry_is_what_the_flags_offer():
    assert RunConfig.__dataclass_fields__["model"].default in specs.names()
    assert set(specs.names()) == {"mnist", "resnet50", "lstm", "vgg16"}
    for name in specs.names():
        for data in DATASETS:
            c, s, k = specs.get(name).input(data)
            assert c >= 1 and s >= 1 and k >= 2
    with pytest.raises(KeyError, match="choose one of mnist"):
        specs.get("gpt2")


def test_the_lstm_reads_rows_as_steps_and_counts_its_gates():
    model, loss = models.build("lstm", 1, 28, 10)
    layers = models.sequential_layers("lstm", model)
    x = torch.zeros(1, 1, 28, 28)
    assert layers[0](x).shape == (1, 28, 28)                 # 28 steps of 28 pixels
    costs = models.layer_costs(layers, x)
    hidden = model.lstm1.lstm.hidden_size
    assert costs[1] == 28 * 4 * hidden * (28 + hidden)        # every step, 4 gates
    assert costs[2] == 28 * 4 * hidden * (hidden + hidden)


def test_the_ceiling_measures_the_runs_own_input():
    """ResNet-50 on the digits: the ceiling times 1x28x28 images of 10 classes (the run's
    input), not ImageNet's 3x224x224 of 1000."""
    cp = subprocess.run([sys.executable, "-m", "lab.worker.ceiling", "--model", "resnet50", "--data",
                         "digits", "--batch-size", "2", "--steps", "1", "--warmup", "0",
                         "--min-seconds", "0"], cwd=REPO,
                        capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stderr[-2000:]
    out = json.loads(cp.stdout)
    assert out["input"] == [1, 28, 28] and out["classes"] == 10
    from lab.host.run.ceiling import command
    from lab.host.settings import BenchSettings
    argv = command(BenchSettings(np=[1], model="resnet50", data="digits"), 1, "python")
    assert argv[argv.index("--data") + 1] == "digits" and argv[argv.index("--model") + 1] == "resnet50"


@requires_horovod
def test_an_lstm_learns_with_horovod_and_ddp_and_reports(tmp_path):
    """The issue's sweep, one repeat: np 1 and 2 over Horovod and DDP on the real digits;
    every run learns (chance is 10%), and the report has its rows."""
    cp = subprocess.run([sys.executable, "-m", "invoke", "bench", "--local", "--np", "1,2", "--model", "lstm",
                         "--framework", "horovod,ddp", "--data", "digits", "--epochs", "3",
                         "--results-dir", str(tmp_path), "--run-id", "lstm"],
                        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-2000:]
    recs = results.read_records(tmp_path / "lstm" / results.RESULTS_FILE)[0]
    assert sorted((r["config"]["framework"], r["world"]["np"]) for r in recs) == [
        ("ddp", 1), ("ddp", 2), ("horovod", 1), ("horovod", 2)]
    for r in recs:
        assert r["status"] == "ok" and r["config"]["model"] == "lstm"
        assert r["figures"]["test_accuracy"] > 0.5, r["figures"]
    rep = subprocess.run([sys.executable, "-m", "invoke", "report", str(tmp_path / "lstm")], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr
    text = (tmp_path / "lstm" / "report.md").read_text()
    for r in recs:        # every run's accuracy is in the report's tables
        assert f"{r['figures']['test_accuracy']:.2%}" in text


def test_the_lstm_runs_under_cpu_bf16_autocast_on_any_cpu():
    """oneDNN's bf16 LSTM needs AVX512-BF16 or AMX; elsewhere (this kit's AMD EPYC CI
    machine) nn.LSTM under CPU bf16 autocast raises. The kit's LSTM layer then computes
    in fp32, and a step trains."""
    torch.manual_seed(0)
    model = lstm_net.build(1, 28, 10)
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = torch.nn.functional.nll_loss(model(x), y)
    loss.backward()
    assert torch.isfinite(loss) and model.lstm1.lstm.weight_ih_l0.grad is not None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inner = model.lstm1(model.rows(x))
    assert inner.dtype == (torch.bfloat16 if lstm_net.cpu_has_bf16_lstm() else torch.float32)
