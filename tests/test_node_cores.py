"""The simulated cluster's nodes with cores of their own during a run across them
(lab.host.places.compose.cores): the split, the cpuset text, the setting's refusal, and
the benchmark's table from records written by the kit's own writer. The nodes' cpusets
set for real are tested with the cluster (tests/test_cluster.py)."""
import pytest

from lab.benchmarks import node_cores_bench
from lab.common import results
from lab.host.places.base import RunnerError
from lab.host.places.compose import cores


@pytest.mark.parametrize("cpus,hosts,expected", [
    ([0, 1], ["node1", "node2"], {"node1": [0], "node2": [1]}),
    ([0, 1, 2, 3, 4], ["a", "b"], {"a": [0, 1], "b": [2, 3]}),     # equal servers: core 4 unused
    ([4, 2, 3, 8], ["a", "b"], {"a": [2, 3], "b": [4, 8]}),
    ([0], ["a", "b"], None),                # fewer cores than nodes: they share it
    ([0, 1, 2], ["node1"], None),           # one node has them all
])
def test_the_cores_are_split_into_equal_contiguous_shares(cpus, hosts, expected):
    got = cores.shares(cores.physical_cores(cpus, lambda c: None), hosts)
    assert got == expected
    if got:
        assert len({len(v) for v in got.values()}) == 1
        assert not set(got[hosts[0]]) & set(got[hosts[1]])


def test_a_cores_hyper_threads_stay_on_one_node():
    """Linux numbers a core's second thread after every core's first (sibling lists such
    as "0,2" on 2 cores x 2 threads): a contiguous split of the cpus would give each node
    one thread of every core; the split is of cores."""
    siblings = {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"}
    assert cores.physical_cores([0, 1, 2, 3], siblings.get) == [[0, 2], [1, 3]]
    assert cores.shares(cores.physical_cores([0, 1, 2, 3], siblings.get), ["node1", "node2"]) == {
        "node1": [0, 2], "node2": [1, 3]}
    # one core of two threads: nothing to split, the nodes share it
    assert cores.shares(cores.physical_cores([0, 1], {0: "0-1", 1: "0-1"}.get), ["node1", "node2"]) is None


def test_this_machines_topology_is_read():
    found = cores.physical_cores(cores.machine_cpus(), cores._siblings)
    assert sorted(c for core in found for c in core) == cores.machine_cpus()


@pytest.mark.parametrize("cpus,text", [([0], "0"), ([0, 1], "0-1"), ([0, 1, 2, 5, 7, 8], "0-2,5,7-8"),
                                       ([3, 1], "1,3")])
def test_a_cpuset_is_written_as_cpuset7_lists_it_and_read_back(cpus, text):
    assert cores.cpuset_text(cpus) == text
    assert cores.cpuset_list(text) == sorted(cpus)


def test_the_setting_is_own_unless_shared_and_anything_else_is_one_sentence(monkeypatch):
    monkeypatch.setattr(cores, "machine_cpus", lambda: [0, 1, 2, 3])
    monkeypatch.setattr(cores, "_siblings", lambda c: None)
    assert cores.planned(["node1", "node2"], {}) == {"node1": "0-1", "node2": "2-3"}
    assert cores.planned(["node1", "node2"], {cores.NODE_CORES_VAR: "Own"}) == {"node1": "0-1", "node2": "2-3"}
    assert cores.planned(["node1", "node2"], {cores.NODE_CORES_VAR: "shared"}) is None
    assert cores.planned(["node1"], {}) is None
    with pytest.raises(RunnerError, match="neither own nor shared") as e:
        cores.planned(["node1", "node2"], {cores.NODE_CORES_VAR: "pinned"})
    assert "\n" not in str(e.value)


class EngineWithoutCpuset:
    """Stands in for a Docker engine whose cgroup has no cpuset controller (rootless on an
    older systemd), which cannot exist here: moby's daemon/daemon_unix.go drops the cpuset
    and answers with this warning, not an error."""
    WARNING = "Your kernel does not support cpuset or the cgroup is not mounted. Cpuset discarded."

    def __init__(self):
        self.attrs = {"HostConfig": {"CpusetCpus": ""}}

    def update(self, cpuset_cpus):
        return {"Warnings": [self.WARNING]}

    def reload(self):
        pass


def test_a_cpuset_the_engine_discards_is_refused_not_recorded():
    with pytest.raises(RunnerError, match="did not give node1 the cpus 0 .*Cpuset discarded.*shared"):
        cores.give({"node1": EngineWithoutCpuset()}, {"node1": "0"})


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


def test_runs_with_and_without_cores_of_their_own_are_never_one_row():
    from lab.report import summary

    def run(node_cores):
        world = {"controller": "gloo", "hosts": ["node1", "node2"], "devices_per_node": 1, "place": "cluster",
                 **({"node_cores": node_cores} if node_cores else {})}
        return results.make_record("ok", run_id="r", config={"model": "mnist", "framework": "horovod",
                                                             "backend": "gloo"}, np=2, nodes=2,
                                   started_at=results.now_iso(), world=world,
                                   figures={"throughput_img_s": 5000.0, "step_time_mean_s": 0.006,
                                            "step_time_p50_s": 0.006, "timed_steps": 100,
                                            "test_accuracy": 0.9})
    shared, own = run(None), run({"node1": "0", "node2": "1"})
    assert len(summary.rows([shared, own])) == 2
    assert len(summary.rows([own, run({"node1": "0", "node2": "1"})])) == 1


def test_the_table_across_servers_says_whether_the_nodes_had_cores_of_their_own():
    from lab.report import tables

    def run(np, nodes, node_cores=None):
        world = {"controller": "gloo", "hosts": ["node1", "node2"][:nodes], "devices_per_node": np // nodes,
                 "place": "cluster", **({"node_cores": node_cores} if node_cores else {})}
        return results.make_record("ok", run_id="r", config={"model": "mnist", "framework": "horovod",
                                                             "backend": "gloo"}, np=np, nodes=nodes,
                                   started_at=results.now_iso(), world=world,
                                   figures={"throughput_img_s": 5000.0 * np, "step_time_mean_s": 0.006,
                                            "step_time_p50_s": 0.006, "timed_steps": 100, "test_accuracy": 0.9})
    own = [run(1, 1), run(2, 2, {"node1": "0", "node2": "1"})]
    marks = tables.result_marks(own, across=True)
    assert "Across the simulated cluster's nodes each node had cores of its own during the runs " \
           "(cpus node1 0, node2 1), as servers have." in marks
    assert not any("share the machine's cores" in m for m in marks)
    assert not any("cores of its own" in m for m in tables.result_marks(own, across=False))
    shared = [run(1, 1), run(2, 2)]
    assert any(m.startswith("The runs across the simulated cluster's nodes had the nodes share the machine's cores")
               for m in tables.result_marks(shared, across=True))
    both = own + [run(2, 2)]
    assert [m for m in tables.result_marks(both, across=True) if "cores" in m] == [
        "Rows marked (own cores) ran with each of the simulated cluster's nodes on cores of its own (cpus node1 0, "
        "node2 1), as servers have; rows marked (shared cores) had the nodes share the machine's cores, so where "
        "the scheduler put the ranks changed their time (docs/pages/cluster.md)."]
    labels = [r[0] for r in tables.result_rows(both, across=True)]
    assert sorted(labels) == ["horovod / gloo (own cores)", "horovod / gloo (shared cores)"]
    assert [r[0] for r in tables.result_rows(own, across=True)] == ["horovod / gloo"]      # not mixed: no mark
