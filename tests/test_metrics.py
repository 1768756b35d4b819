"""The arithmetic of the figures."""
import numpy as np
import pytest

from lab.common import metrics


@pytest.mark.parametrize("q", [0, 5, 50, 95, 100])
def test_percentile_matches_numpy(q):
    values = [0.3, 0.1, 0.7, 0.2, 0.9, 0.4, 0.35]
    assert metrics.percentile(values, q) == pytest.approx(np.percentile(values, q))


def test_step_stats():
    s = metrics.step_stats([0.010, 0.012, 0.011, 0.050])
    assert s["steps"] == 4
    assert s["mean_s"] == pytest.approx(0.02075)
    assert s["p50_s"] == pytest.approx(0.0115)
    assert s["p95_s"] == pytest.approx(np.percentile([0.010, 0.012, 0.011, 0.050], 95))


def test_step_stats_without_steps_says_what_to_do():
    with pytest.raises(ValueError, match="warmup"):
        metrics.step_stats([])


def test_throughput_is_bounded_by_the_slowest_rank():
    # 2 ranks x 64 images x 100 steps; the slow rank took 4 s.
    assert metrics.global_throughput(64, 2, [3.0, 4.0], 100) == pytest.approx(3200.0)


def test_speedup_and_efficiency():
    s = metrics.speedup(1226.99, 530.97)  # the source report's MPI figures, 4 GPUs vs 1
    assert s == pytest.approx(2.31, abs=0.005)
    assert metrics.efficiency(s, 4) == pytest.approx(0.578, abs=0.001)
    with pytest.raises(ValueError):
        metrics.speedup(1.0, 0.0)


def test_each_ceiling_process_gets_its_own_gpu_and_thread_count():
    from lab.worker.ceiling import child_env
    base = {"PATH": "/bin"}
    envs = [child_env(i, 2, "cuda", base) for i in range(4)]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "1", "2", "3"]
    assert all(e["OMP_NUM_THREADS"] == "2" and e["PATH"] == "/bin" for e in envs)
    masked = {"CUDA_VISIBLE_DEVICES": "5,7"}
    assert [child_env(i, 1, "cuda", masked)["CUDA_VISIBLE_DEVICES"] for i in range(2)] == ["5", "7"]
    assert "CUDA_VISIBLE_DEVICES" not in child_env(0, 1, "cpu", base)
