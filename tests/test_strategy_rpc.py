"""`rpc-pipeline` (lab.worker.strategies.rpc): real 2-process runs on the CPU over
torch.distributed.rpc. Run as a script under torch.distributed.run, this file is also
the worker of the equivalence check (see _pipeline_check)."""
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _rpc_missing():
    cp = subprocess.run([sys.executable, "-c", "import torch.distributed.rpc as r; "
                         "raise SystemExit(0 if r.is_available() else 3)"],
                        capture_output=True, text=True)
    if cp.returncode == 3:
        return "this torch build has no torch.distributed.rpc (rpc.is_available() is False)"
    if cp.returncode != 0:
        return "torch does not import: " + (cp.stderr.strip().splitlines() or [""])[-1]
    return None


RPC_MISSING = _rpc_missing()
requires_rpc = pytest.mark.skipif(RPC_MISSING is not None, reason=RPC_MISSING or "")

# MnistNet's parameters: conv1 10x1x5x5+10, conv2 20x10x5x5+20, fc1 320x50+50, fc2 50x10+10.
MNIST_PARAM_BYTES = 4 * (260 + 5020 + 16050 + 510)


def test_without_rpc_the_strategy_says_so(monkeypatch):
    """A torch without torch.distributed.rpc: a ConfigError of one sentence, at once."""
    import types

    import torch.distributed.rpc as rpc

    from lab.common.config import ConfigError, RunConfig
    from lab.worker.strategies.rpc import RpcPipeline
    monkeypatch.setattr(rpc, "is_available", lambda: False)
    cfg = RunConfig(framework="ddp", strategy="rpc-pipeline")
    d = types.SimpleNamespace(rank=0, size=2)
    with pytest.raises(ConfigError, match="no torch.distributed.rpc"):
        RpcPipeline(cfg, d, None)


@requires_rpc
def test_pipeline_matches_whole_model_and_holdings_add_up(tmp_path):
    """Two processes, stage k in rank k: the pipeline's outputs on a batch equal the
    whole model's in one process (same seed, eval mode); two training steps (loss, then
    the momentum update by the DistributedOptimizer in both processes) equal two SGD
    steps on the whole batch; each rank's holdings are its stage's and add up to the
    whole model."""
    out = tmp_path / "check.json"
    env = dict(os.environ, RPC_CHECK_OUT=str(out), OMP_NUM_THREADS="1")
    cp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                         "--nproc-per-node=2", str(Path(__file__).resolve())],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["out_shape"] == [32, 10]
    assert r["max_diff_before"] < 1e-5
    for mine, ref in zip(r["losses"], r["ref_losses"]):
        assert mine == pytest.approx(ref, rel=1e-5, abs=1e-6)
    assert r["ref_losses"][1] != pytest.approx(r["ref_losses"][0])   # the step did something
    assert r["max_diff_after"] < 1e-4
    held = r["held"]
    assert len(held) == 2 and all(h["parameters"] > 0 for h in held)
    assert sum(h["parameters"] for h in held) == MNIST_PARAM_BYTES
    # Momentum buffers: one per parameter, where the parameter lives.
    for h in held:
        assert h["optimizer_state"] == h["parameters"]
        assert h["gradients"] == h["parameters"]   # the autograd context's, in a step
        assert h["total"] == h["parameters"] + h["gradients"] + h["optimizer_state"]
    # Each rank's parameters are its stage's: the cut's (stage_layers) in both.
    assert [h["parameters"] for h in held] == r["stage_param_bytes"]


@requires_rpc
def test_rpc_pipeline_learns_digits(tmp_path):
    """The whole training loop, launched as `invoke bench --strategy rpc-pipeline` does
    (torch.distributed.run, 2 ranks): the loss falls over 3 epochs on digits, the record
    says what ran, and the held bytes of the two ranks add up to the model's parameters."""
    from lab.host.run import bench
    from lab.host.settings import BenchSettings
    # torch's RPC hangs now and then in this loop: the driver waits in a forward's future
    # for a reply that never comes (seen in 1 of 10 runs of this test on a loaded 2-core
    # machine; upstream's nearest reports are pytorch/pytorch#58239 and #38513, and RPC is
    # in maintenance mode). The stall watch ends such a run and names it, which is the kit's
    # part; the test then says so in a warning and runs once more. Any other failure, or a
    # second hang, fails it.
    for attempt in (1, 2):
        lines = []
        outcome = bench.run(BenchSettings(np=[2], strategy="rpc-pipeline", framework="ddp",
                                          backend="gloo", data="digits", model="mnist",
                                          batch_size=32, epochs=3, warmup_steps=3,
                                          results_dir=str(tmp_path / f"run{attempt}"), timeout_s=240),
                            echo=lines.append, stack=bench.probe_stack())
        hung = [r["error"]["reason"] for r in outcome.records
                if r["status"] == "failed" and r["error"]["reason"].startswith("stalled:")]
        if not hung or attempt == 2:
            break
        warnings.warn(f"torch RPC hung in run {attempt}, named by the stall watch: {hung[0][:300]}")
    assert outcome.failed == 0 and len(outcome.records) == 1, "\n".join(lines)[-3000:]
    r = outcome.records[0]
    assert r["status"] == "ok" and r["config"]["strategy"] == "rpc-pipeline"
    # At the default learning rate (0.01, unscaled: one pipeline) MnistNet learns digits
    # slowly: about 2.30, 2.27, 2.18 over three epochs, accuracy 16% then 47%.
    losses = [ep["train_loss"] for ep in r["epochs"]]
    assert losses[0] > losses[1] > losses[2] and losses[2] < losses[0] - 0.05, losses
    accuracies = [ep["test_accuracy"] for ep in r["epochs"]]
    assert accuracies[-1] > max(0.25, accuracies[0]), accuracies
    f = r["figures"]
    assert f["batch_semantics"] == "32 in all, 4 micro-batches of 8"
    assert f["micro_batches"] == 4 and len(f["stage_layers"]) == 2
    assert f["stage_layers"][0][0] == 0 and f["stage_layers"][0][1] == f["stage_layers"][1][0]
    assert f["lr_used"] == pytest.approx(r["config"]["lr"])   # one pipeline: no scaling
    assert f["parameter_digests"] == [None, None]              # stages, not replicas
    # 1,497 training digits / batch 32 = 46 steps an epoch, 3 epochs, 3 warm-up steps.
    assert f["timed_steps"] == 3 * 46 - 3
    held = f["held_bytes"]
    assert sum(h["parameters"] for h in held) == MNIST_PARAM_BYTES
    assert all(h["optimizer_state"] == h["parameters"] for h in held)


def _pipeline_check() -> None:
    """One rank of the equivalence check (started by torch.distributed.run)."""
    import copy

    import torch

    from lab.common.config import RunConfig
    from lab.worker import dist, models, strategies
    from lab.worker.strategies import memory

    torch.set_num_threads(1)
    cfg = RunConfig(framework="ddp", backend="gloo", strategy="rpc-pipeline", model="mnist",
                    batch_size=32, micro_batches=4)
    cfg.check()
    d = dist.create(cfg)
    torch.manual_seed(cfg.seed)
    model, loss_fn = models.build("mnist", 1, 28, 10)
    whole = copy.deepcopy(model).eval()
    s = strategies.create(cfg, d, torch.device("cpu"))
    s.build(model, loss_fn)
    del model
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (32,), generator=g)
    steps = 2
    report = {}
    if d.rank == 0:
        s.train_mode(False)   # no dropout: the two runs must compute the same thing
        out = torch.cat(s.forward(x))
        with torch.no_grad():
            ref = whole(x)
        report["out_shape"] = list(out.shape)
        report["max_diff_before"] = float((out - ref).abs().max())
        report["losses"] = [float(s.step(x, y)) for _ in range(steps)]
        opt = torch.optim.SGD(whole.parameters(), lr=cfg.lr, momentum=cfg.momentum)
        report["ref_losses"] = []
        for _ in range(steps):
            opt.zero_grad()
            loss = loss_fn(whole(x), y)
            loss.backward()
            opt.step()
            report["ref_losses"].append(float(loss.detach()))
        out = torch.cat(s.forward(x))
        with torch.no_grad():
            ref = whole(x)
        report["max_diff_after"] = float((out - ref).abs().max())
        report["stage_param_bytes"] = [
            memory.storage_bytes(p for layer in stage for p in layer.parameters())
            for stage in _stages_of(whole, s.bounds)]
    else:
        for _ in range(steps):
            assert s.step(x, y) is None
        assert s.evaluate(None, 100) == (0, 0)
    report["held"] = d.allgather_object(s.holdings())
    s.close()
    d.shutdown()
    if d.rank == 0:
        Path(os.environ["RPC_CHECK_OUT"]).write_text(json.dumps(report))


def _stages_of(model, bounds):
    from lab.worker import models
    layers = models.sequential_layers("mnist", model)
    return [layers[a:b] for a, b in bounds]


if __name__ == "__main__":
    _pipeline_check()
