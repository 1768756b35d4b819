"""What a run's record says of its GPU memory and of Horovod's tuning. A GPU cannot
exist here: only torch.cuda's memory counters are replaced; Horovod's parsing of its
variables is compared with its source (Horovod 0.28.1 horovod/common/operations.cc,
BackgroundThreadLoop) rather than with a number made to pass."""
import pytest
import torch

from lab.common import horovod_tuning
from lab.common.config import RunConfig
from lab.worker import dist, train
from lab.worker.strategies import memory

MIB = 1024 * 1024


@pytest.mark.parametrize("env,fusion,cycle,set_by", [
    # nothing set: operations.cc SetTensorFusionThresholdBytes(128 * 1024 * 1024), SetCycleTimeMs(1)
    ({}, 128 * MIB, 1.0, set()),
    ({"HOROVOD_FUSION_THRESHOLD": "33554432"}, 32 * MIB, 1.0, {"fusion_threshold_bytes"}),
    ({"HOROVOD_CYCLE_TIME": "2.5"}, 128 * MIB, 2.5, {"cycle_time_ms"}),
    # strtol / strtof read the leading number: "64MB" is 64 bytes, "0.1ms" 0.1 ms, "x" 0
    ({"HOROVOD_FUSION_THRESHOLD": "64MB", "HOROVOD_CYCLE_TIME": "0.1ms"}, 64, 0.1,
     {"fusion_threshold_bytes", "cycle_time_ms"}),
    ({"HOROVOD_FUSION_THRESHOLD": "x"}, 0, 1.0, {"fusion_threshold_bytes"}),
    # HOROVOD_ENABLE_XLA_OPS makes the default cycle time 0; a set one still wins
    ({"HOROVOD_ENABLE_XLA_OPS": "1"}, 128 * MIB, 0.0, set()),
    ({"HOROVOD_ENABLE_XLA_OPS": "1", "HOROVOD_CYCLE_TIME": "3"}, 128 * MIB, 3.0, {"cycle_time_ms"}),
    ({"HOROVOD_ENABLE_XLA_OPS": "0"}, 128 * MIB, 1.0, set()),
])
def test_horovods_effective_fusion_threshold_and_cycle_time(env, fusion, cycle, set_by):
    got = horovod_tuning.effective(env)
    assert (got["fusion_threshold_bytes"], got["cycle_time_ms"]) == (fusion, cycle)
    assert set(got["set_by"]) == set_by and got["autotune"] is False
    assert horovod_tuning.effective({"HOROVOD_AUTOTUNE": "1"})["autotune"] is True


def _one_process_record(framework, monkeypatch, tmp_path, **env):
    for k in [k for k in __import__("os").environ if k.startswith("HOROVOD_")]:
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cfg = RunConfig(framework=framework, backend="gloo", device="cpu", epochs=1, max_steps=2,
                    warmup_steps=1, batch_size=8, synthetic_size=64, results_dir=str(tmp_path))
    return train.train(cfg, dist.Local(cfg), log=lambda *a, **k: None)


def test_a_horovod_runs_record_holds_its_fusion_threshold_and_cycle_time(monkeypatch, tmp_path):
    rec = _one_process_record("horovod", monkeypatch, tmp_path, HOROVOD_FUSION_THRESHOLD="16777216",
                              HOROVOD_CYCLE_TIME="5")
    h = rec["world"]["horovod"]
    assert (h["fusion_threshold_bytes"], h["cycle_time_ms"]) == (16 * MIB, 5.0)
    assert h["set_by"] == {"fusion_threshold_bytes": "HOROVOD_FUSION_THRESHOLD=16777216",
                           "cycle_time_ms": "HOROVOD_CYCLE_TIME=5"}
    # CPU: nothing reserved by a CUDA allocator, one entry per rank all the same
    assert rec["figures"]["peak_reserved_bytes"] == [None] == rec["figures"]["reserved_bytes"]
    assert "horovod" not in _one_process_record("none", monkeypatch, tmp_path)["world"]


def test_gpu_memory_records_reserved_beside_allocated(monkeypatch):
    """torch.cuda's counters (torch/cuda/memory.py: max_memory_reserved, memory_reserved)
    are what is read, for the rank's own device."""
    asked = []

    def counter(name, value):
        def read(device=None):
            asked.append((name, device))
            return value
        return read
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", counter("max_reserved", 3 * MIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", counter("reserved", 2 * MIB))
    gpu = torch.device("cuda", 1)
    assert memory.reserved(gpu) == {"peak": 3 * MIB, "end": 2 * MIB}
    assert asked == [("max_reserved", gpu), ("reserved", gpu)]
    assert memory.reserved(torch.device("cpu")) is None


def test_the_strategy_table_shows_reserved_beside_the_peak_on_gpus():
    import copy

    from lab.report import strategies
    from tests.test_report import STRATEGY_RECORDS
    gpu = copy.deepcopy(STRATEGY_RECORDS[0])
    gpu["figures"]["peak_reserved_bytes"] = [400e6, 420e6]
    cpu_row, gpu_row = strategies.strategy_rows([STRATEGY_RECORDS[0]]), strategies.strategy_rows([gpu])
    assert cpu_row[0][5] == "300 / 310"
    assert gpu_row[0][5] == "300 (400 reserved) / 310 (420 reserved)"


# ---------------------------------------------------------------- the ceiling's timing rule

class FakeClock:
    """Each step lasts the next of `durations` seconds (the clock moves only in steps)."""
    def __init__(self, durations):
        self.durations, self.now, self.calls = list(durations), 0.0, 0

    def __call__(self):
        return self.now

    def step(self):
        self.now += self.durations[self.calls % len(self.durations)]
        self.calls += 1


def test_the_ceiling_times_at_least_n_steps_and_at_least_t_seconds():
    from lab.worker.ceiling import summarize, time_steps
    gpu = FakeClock([0.05])                     # ResNet-50 on a GPU: 3 steps would be 0.15 s
    times = time_steps(gpu.step, min_steps=3, min_seconds=10.0, clock=gpu)
    assert len(times) == gpu.calls and sum(times) >= 10.0 and sum(times[:-1]) < 10.0
    cpu = FakeClock([4.0])                      # on a CPU the step count decides
    assert len(time_steps(cpu.step, min_steps=3, min_seconds=10.0, clock=cpu)) == 3
    capped = FakeClock([1e-6])
    assert len(time_steps(capped.step, min_steps=3, min_seconds=10.0, max_steps=50, clock=capped)) == 50
    # the median ignores a stolen step; the spread shows it
    s = summarize([0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 2.0], batch_size=64)
    assert s["step_time_median_s"] == 0.1 and s["images_per_s"] == pytest.approx(640.0)
    assert s["spread"] > 1.0 and summarize([0.1] * 5, 64)["spread"] == 0.0


def test_the_hosts_ceiling_command_states_the_rule():
    from lab.host.run.ceiling import command
    from lab.host.settings import BenchSettings
    from lab.worker.ceiling import MIN_SECONDS
    argv = command(BenchSettings(np=[1], model="resnet50"), 1, "python")
    assert argv[argv.index("--min-seconds") + 1] == str(MIN_SECONDS)
    assert argv[argv.index("--steps") + 1] == "3"          # the model's minimum (lab.models)
    assert argv[argv.index("--precision") + 1] == "fp32"   # the run's --precision
    argv = command(BenchSettings(np=[1], precision="bf16"), 1, "python")
    assert argv[argv.index("--precision") + 1] == "bf16"
