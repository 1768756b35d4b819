"""--compile (lab.worker.compiled): the option's row, the strategies that refuse it in one
sentence before any rank starts, the report's rows that never pool eager and compiled
runs, and real runs of the MNIST CNN on the digits, eager and compiled at 1 and 2 ranks
(DDP) and at 2 ranks (Horovod), whose records hold the compiler's seconds apart from the
timed steps."""
import dataclasses
import subprocess
import sys

import pytest

from lab.common import options
from lab.common.config import NO_COMPILE, ConfigError, RunConfig, parse_args
from lab.host.run import bench
from lab.host.settings import BenchSettings
from lab.report import records, summary
from tests.conftest import requires_horovod

# ---------------------------------------------------------------- the option and its refusals


def test_compile_is_a_key_and_a_setup_field_and_reaches_the_ranks():
    o = options.BY_NAME["compile"]
    assert o.kind is bool and o.value is False and o.key and o.setup and not o.sweeps
    assert options.run_key({"compile": True}, 1, 2, 0) != options.run_key({}, 1, 2, 0)
    cfg = RunConfig(compile=True)
    assert "--compile" in cfg.to_args() and parse_args(cfg.to_args()).compile is True
    assert parse_args(RunConfig().to_args()).compile is False
    with pytest.raises(SystemExit):         # argparse: a bool field takes True or False only
        parse_args(["--compile", "yes"])


@pytest.mark.parametrize("strategy", sorted(NO_COMPILE))
def test_a_strategy_that_cannot_compile_refuses_in_one_sentence(strategy):
    cfg = RunConfig(strategy=strategy, compile=True, device="cuda" if strategy == "dataparallel" else "cpu",
                    framework={"dataparallel": "none"}.get(strategy, "ddp"))
    dataclasses.replace(cfg, compile=False).check()     # the strategy alone runs
    with pytest.raises(ConfigError, match=f"the {strategy} strategy cannot run --compile") as e:
        cfg.check()
    assert "\n" not in str(e.value) and str(e.value).endswith("or use --strategy ddp")


def test_bench_refuses_a_compiled_pipeline_before_any_rank_starts(tmp_path):
    cp = subprocess.run([sys.executable, "-m", "invoke", "bench", "--np", "2", "--strategy", "pipeline",
                         "--compile", "--local", "--results-dir", str(tmp_path)],
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 2, cp.stdout[-2000:] + cp.stderr
    assert "the pipeline strategy cannot run --compile" in cp.stderr and "Traceback" not in cp.stderr
    assert not list(tmp_path.rglob("results.jsonl"))


# ---------------------------------------------------------------- the report's rows

def _record(np, compiled=None, compile_s=None, tput=100.0):
    config = {"model": "mnist", "framework": "ddp", "backend": "gloo", "compression": "none"}
    if compiled is not None:
        config["compile"] = compiled
    figures = {"throughput_img_s": tput, "step_time_mean_s": 0.01, "test_accuracy": 0.5}
    if compile_s is not None:
        figures["compile_s"] = compile_s
    return {"status": "ok", "config": config, "figures": figures,
            "world": {"np": np, "nodes": 1, "devices_per_node": np}}


def test_the_report_never_pools_eager_and_compiled_runs_and_reads_old_records_as_eager():
    old, eager, comp = _record(1), _record(1, False), _record(1, True, 12.5)
    assert records.setup_key(old) == records.setup_key(eager) != records.setup_key(comp)
    assert summary.config_key(old) == summary.config_key(eager) != summary.config_key(comp)
    assert records.setup_label(comp, [eager, comp]).startswith("compiled")
    rows = summary.rows([eager, _record(2, False, tput=150.0), comp, _record(2, True, 14.5, tput=300.0)])
    assert len(rows) == 4
    # each np 2 row's speedup is against the np 1 run of its own kind
    assert [r["speedup"] for r in rows] == [1.0, 1.5, 1.0, 3.0]
    head, _, *lines = summary.render(rows).splitlines()
    col = [c.strip() for c in head.split("|")].index("compile (s)")
    assert [[c.strip() for c in line.split("|")][col] for line in lines] == ["eager", "eager", "12.5", "14.5"]
    assert "compile (s)" not in summary.render(summary.rows([eager]))


# ---------------------------------------------------------------- real runs on the CPU

@pytest.fixture(scope="module")
def stack():
    return bench.probe_stack()


WARMUP, STEPS = 1, 6


def run(stack, tmp_path, **kw):
    settings = dict(np=[1, 2], data="digits", epochs=1, batch_size=16, max_steps=STEPS,
                    warmup_steps=WARMUP, results_dir=str(tmp_path), timeout_s=600, where="local",
                    framework="ddp")
    settings.update(kw)
    lines = []
    outcome = bench.run(BenchSettings(**settings), echo=lines.append, stack=stack)
    assert outcome.failed == 0, "\n".join(lines[-30:])
    assert all(r["status"] == "ok" for r in outcome.records)
    return outcome.records


def check_compiled(r):
    """The compiler's seconds recorded, its steps kept out of the timed ones."""
    f = r["figures"]
    assert r["config"]["compile"] is True and f["compile_s"] > 0
    assert len(f["compile_s_per_rank"]) == r["world"]["np"] and max(f["compile_s_per_rank"]) == f["compile_s"]
    compiled = [s["step"] for s in f["compile_steps"]]
    assert compiled, "no step compiled"
    # the compiler ran inside those steps (rank 0's seconds within their wall time) ...
    assert sum(s["step_s"] for s in f["compile_steps"]) >= f["compile_s_per_rank"][0] * 0.99
    # ... and none of them is timed: every step but the warm-up and those
    assert f["timed_steps"] == len(r["step_times_s"]) == STEPS - WARMUP - sum(s >= WARMUP for s in compiled)
    assert max(r["step_times_s"]) < min(s["step_s"] for s in f["compile_steps"])
    digests = f["parameter_digests"]
    assert len(set(digests)) == 1 and digests[0] is not None     # the replicas agree


@pytest.mark.slow
def test_the_mnist_cnn_compiled_against_eager_at_1_and_2_ranks(stack, tmp_path):
    eager = run(stack, tmp_path)
    # appended to the eager runs' folder: bench's outcome holds the folder's records
    both = run(stack, tmp_path, compile=True, run_id=eager[0]["run_id"])
    assert both[:2] == eager
    comp = both[2:]
    for r in eager:
        assert r["config"]["compile"] is False and "compile_s" not in r["figures"]
        assert r["figures"]["timed_steps"] == STEPS - WARMUP
    for r in comp:
        check_compiled(r)
    assert sorted(r["world"]["np"] for r in comp) == [1, 2]
    rows = summary.rows(eager + comp)
    assert [(r["np"], r["compiled"]) for r in rows] == [(1, False), (2, False), (1, True), (2, True)]
    assert all(r["speedup"] is not None for r in rows)


@pytest.mark.slow
def test_gradient_accumulator_hooks_fire_under_the_compiled_backward():
    """What Horovod's DistributedOptimizer relies on (horovod/torch/optimizer.py 0.28.1,
    _register_hooks: a hook on each parameter's AccumulateGrad node, found through
    p.expand_as(p).grad_fn), hooked before the compile as lab.worker.strategies does: every
    hook fires in a compiled step, after the compiler ran. (Horovod's synchronize() would
    all-reduce a gradient whose hook never fired too, so equal replicas alone do not show it.)
    The back end is aot_eager: AOTAutograd's compiled forward and backward as Inductor
    gets them, without Inductor's C++ build (a minute here), which leaves the autograd
    graph around the parameters as it is."""
    import torch

    from lab.worker import compiled, lean
    compiled.load()
    assert lean.skip_compiler_import() == 0     # a compiled run: torch's methods left as they are
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    fired, accs = [], []
    for p in model.parameters():
        acc = p.expand_as(p).grad_fn.next_functions[0][0]
        acc.register_hook(lambda *_, p=p: fired.append(p))
        accs.append(acc)
    before = compiled.seconds()
    step = torch.compile(model, backend="aot_eager")
    step(torch.randn(4, 8)).sum().backward()
    assert compiled.seconds() > before                   # it compiled
    assert {id(p) for p in fired} == {id(p) for p in model.parameters()}
    assert all(p.grad is not None for p in model.parameters())


@requires_horovod
@pytest.mark.slow
def test_horovods_hooks_average_the_compiled_modules_gradients(stack, tmp_path):
    """Two Horovod ranks, compiled: equal parameter digests after training show that the
    DistributedOptimizer's hooks on the parameters fired under the compiled backward."""
    (r,) = run(stack, tmp_path, np=[2], framework="horovod", compile=True)
    check_compiled(r)


def test_a_compiling_rank_is_in_a_phase_with_a_bound_of_its_own(tmp_path):
    """The compiler runs inside a step for tens of steps' time: its phase's bound is
    COMPILE_S (or a longer --stall-s), not ten times the steps so far."""
    from lab.common import heartbeat
    from lab.worker.heartbeat import Heartbeat
    assert heartbeat.bound_s(0.0, "compile", slowest_step_s=0.02) == heartbeat.COMPILE_S
    assert heartbeat.bound_s(0.0, "warm-up", slowest_step_s=0.02) < heartbeat.COMPILE_S
    assert heartbeat.bound_s(5000.0, "compile", slowest_step_s=0.02) == 5000.0
    hb = Heartbeat(tmp_path, "a", 0)
    try:
        hb.beat("warm-up", 1, "in")
        hb.compiling(True)
        assert (hb.state["phase"], hb.state["step"]) == ("compile", 1)
        assert heartbeat.describe(hb.state) == "compiling in step 1"
        hb.compiling(False)
        assert (hb.state["phase"], hb.state["where"]) == ("warm-up", "in")
    finally:
        hb.close()


@pytest.mark.slow
def test_zero1_and_fsdp_train_compiled(stack, tmp_path):
    """The sharded strategies that take --compile: ZeRO-1 (DDP with a sharded optimizer) and
    FSDP2, two ranks each, compiled."""
    first = run(stack, tmp_path, np=[2], strategy="zero1", compile=True)
    comp = run(stack, tmp_path, np=[2], strategy="fsdp", compile=True, run_id=first[0]["run_id"])
    assert [r["config"]["strategy"] for r in comp] == ["zero1", "fsdp"]
    for r in comp:
        check_compiled(r)
