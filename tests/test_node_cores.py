"""The simulated cluster's nodes with cores of their own during a run across them
(lab.host.places.compose.cores): the split, the cpuset text, the setting's refusal, and
the benchmark's table from records written by the kit's own writer. The nodes' cpusets
set for real are tested with the cluster (tests/test_cluster.py)."""
import pytest

from lab.common import results
from lab.host import node_cores_bench
from lab.host.places.base import RunnerError
from lab.host.places.compose import cores


@pytest.mark.parametrize("cpus,hosts,expected", [
    ([0, 1], ["node1", "node2"], {"node1": [0], "node2": [1]}),
    ([0, 1, 2, 3, 4], ["a", "b", "c"], {"a": [0, 1], "b": [2, 3], "c": [4]}),
    ([4, 2, 3, 8], ["a", "b"], {"a": [2, 3], "b": [4, 8]}),
    ([0], ["a", "b"], None),                # fewer cores than nodes: they share it
    ([0, 1, 2], ["node1"], None),           # one node has them all
])
def test_the_cores_are_split_into_one_contiguous_share_per_node(cpus, hosts, expected):
    got = cores.shares(cpus, hosts)
    assert got == expected
    if got:
        assert sorted(c for share in got.values() for c in share) == sorted(cpus)


@pytest.mark.parametrize("cpus,text", [([0], "0"), ([0, 1], "0-1"), ([0, 1, 2, 5, 7, 8], "0-2,5,7-8"),
                                       ([3, 1], "1,3")])
def test_a_cpuset_is_written_as_cpuset7_lists_it_and_read_back(cpus, text):
    assert cores.cpuset_text(cpus) == text
    assert cores.cpuset_list(text) == sorted(cpus)


def test_the_setting_is_own_unless_shared_and_anything_else_is_one_sentence(monkeypatch):
    monkeypatch.setattr(cores, "machine_cpus", lambda: [0, 1, 2, 3])
    assert cores.planned(["node1", "node2"], {}) == {"node1": "0-1", "node2": "2-3"}
    assert cores.planned(["node1", "node2"], {cores.NODE_CORES_VAR: "Own"}) == {"node1": "0-1", "node2": "2-3"}
    assert cores.planned(["node1", "node2"], {cores.NODE_CORES_VAR: "shared"}) is None
    assert cores.planned(["node1"], {}) is None
    with pytest.raises(RunnerError, match="neither own nor shared") as e:
        cores.planned(["node1", "node2"], {cores.NODE_CORES_VAR: "pinned"})
    assert "\n" not in str(e.value)


def _record(run_id: str, backend: str, step_s: float) -> dict:
    return results.make_record("ok", run_id=run_id, config={"backend": backend}, np=2, nodes=2,
                               started_at=results.now_iso(), world={"controller": backend},
                               figures={"step_time_mean_s": step_s})


def test_the_benchmark_pairs_each_shared_run_with_its_own_cores_run(tmp_path):
    steps = {("shared", "mpi"): [5.9, 3.6, 5.5], ("own", "mpi"): [4.0, 3.6, 4.1],
             ("shared", "gloo"): [8.2, 7.2], ("own", "gloo"): [6.1, 6.2]}
    for (way, backend), values in steps.items():
        for i, ms in enumerate(values):
            results.append_record(tmp_path / f"{way}-{i}" / results.RESULTS_FILE,
                                  _record(f"{way}-{i}", backend, ms / 1000))
    results.append_record(tmp_path / "other-0" / results.RESULTS_FILE, _record("other-0", "mpi", 1.0))
    out = node_cores_bench.lines(node_cores_bench.runs(tmp_path))
    assert "mpi   shared runs 5.90 3.60 5.50 ms; 3.60-5.90, spread 1.64x" in out
    assert "mpi   own    runs 4.00 3.60 4.10 ms; 3.60-4.10, spread 1.14x" in out
    # pairs: 5.9/4.0, 3.6/3.6, 5.5/4.1 -> median 1.34
    assert "mpi   shared/own, median over 3 pair(s): 1.34" in out
    assert "gloo  shared/own, median over 2 pair(s): 1.25" in out
