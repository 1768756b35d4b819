"""The simulated cluster (compose.yaml), for real: `invoke up` brings up node
containers from the CPU image with Debian's docker-compose (or the Compose plugin),
`invoke bench --nodes 2` runs Horovod over Gloo and MPI and DDP across them, a link is
shaped, a node is killed mid-job, and `invoke down` leaves nothing behind. The pure
parts (host slots, link specs, tc commands, the override file) are tested first."""
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lab.common import docker_api, results
from lab.host.places.compose import cluster
from tests.conftest import CLUSTER_RESULTS

REPO = Path(__file__).resolve().parent.parent
IMAGE = "dl-lab-kit:cpu"


def test_host_slots_spread_ranks_evenly():
    assert [(h.name, h.slots) for h in cluster.node_hosts(4, 2)] == [("node1", 2), ("node2", 2)]
    assert [(h.name, h.slots) for h in cluster.node_hosts(2, 2)] == [("node1", 1), ("node2", 1)]
    with pytest.raises(cluster.ClusterError, match="multiple of 2"):
        cluster.node_hosts(3, 2)


@pytest.mark.parametrize("spec,rate,delay", [("10gbit", "10gbit", None), ("1gbit/1ms", "1gbit", "1ms"),
                                             ("100MBIT/250us", "100mbit", "250us")])
def test_link_specs(spec, rate, delay):
    assert cluster.parse_link(spec) == (rate, delay)


@pytest.mark.parametrize("spec", ["fast", "1gb", "1gbit/soon", "/1ms"])
def test_bad_link_specs_are_one_sentence(spec):
    with pytest.raises(cluster.ClusterError, match="RATE|delay takes"):
        cluster.parse_link(spec)


def test_tc_commands():
    [tbf] = cluster.tc_commands("1gbit")
    assert tbf[:7] == ["tc", "qdisc", "replace", "dev", "eth0", "root", "tbf"]
    assert tbf[tbf.index("rate") + 1] == "1gbit" and int(tbf[tbf.index("burst") + 1]) >= 1500
    [netem] = cluster.tc_commands("1gbit/2ms")
    assert "netem" in netem and netem[netem.index("delay") + 1] == "2ms"


def test_compose_file_is_the_compose_specification():
    text = (REPO / "compose.yaml").read_text()
    assert not re.search(r"^version:", text, re.MULTILINE)
    assert "ports:" not in text                         # SSH only inside the cluster network
    assert "internal: true" in text
    assert "node1:" in text and "node2:" in text and "<<: *node" in text
    extra = cluster.override_yaml(4)
    services = json.loads(extra)["services"]            # JSON, which is YAML too
    assert list(services) == ["node3", "node4"]
    assert services["node4"] == {"extends": {"file": "compose.yaml", "service": "node1"},
                                 "hostname": "node4"}


def test_the_results_folder_the_nodes_mount_is_the_one_given(tmp_path):
    """compose.yaml mounts LAB_RESULTS (what `invoke up --results-dir` and the tests set)
    at /results, not the checkout's results/."""
    try:
        prog = cluster.compose_program()
    except cluster.ClusterError as e:
        pytest.skip(str(e))
    cp = subprocess.run([*prog, "-f", str(REPO / "compose.yaml"), "config"], cwd=REPO, capture_output=True,
                        text=True, env={**os.environ, "LAB_RESULTS": str(tmp_path / "mine")})
    assert cp.returncode == 0, cp.stderr
    assert str(tmp_path / "mine") in cp.stdout and str(REPO / "results") not in cp.stdout


def test_compose_config_validates_with_the_installed_compose(tmp_path):
    try:
        prog = cluster.compose_program()
    except cluster.ClusterError as e:
        pytest.skip(str(e))
    for files in (["compose.yaml"], ["compose.yaml", "compose.gpu.yaml"]):
        args = [a for f in files for a in ("-f", str(REPO / f))]
        cp = subprocess.run([*prog, *args, "config", "-q"], cwd=REPO, capture_output=True, text=True)
        assert cp.returncode == 0, (files, cp.stderr)


# ---------------------------------------------------------------- for real

def _engine_and_image():
    try:
        import docker
        c = docker.from_env(timeout=30)
        c.ping()
        c.images.get(IMAGE)
        cluster.compose_program()
        return None
    except Exception as e:
        return f"needs a Docker engine, {IMAGE} and compose ({type(e).__name__}: {e})"


def invoke(*args, timeout=600, env=None):
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def bench(*args, timeout=600, env=None):
    """`invoke bench` into the folder the test cluster mounts (conftest's LAB_RESULTS, a
    temporary one), unless the test gives its own --results-dir."""
    extra = () if "--results-dir" in args else ("--results-dir", str(CLUSTER_RESULTS))
    return invoke("bench", *args, *extra, timeout=timeout, env=env)


def test_bench_without_the_cluster_is_one_sentence(tmp_path):
    if _engine_and_image():
        pytest.skip(_engine_and_image())
    import docker
    if cluster.nodes(docker.from_env()):
        pytest.skip("a cluster is up")
    cp = bench("--nodes", "2", "--np", "2", "--framework", "horovod")
    assert cp.returncode == 2 and "invoke up --nodes 2" in cp.stderr and "Traceback" not in cp.stderr


@pytest.fixture(scope="module")
def up():
    why = _engine_and_image()
    if why:
        pytest.skip(why)
    import docker
    client = docker.from_env(timeout=60)
    # With Slurm's daemons too: every test below runs on such a cluster (and the plain
    # compose test further down on one without).
    cp = invoke("up", "--nodes", "2", "--scheduler", "slurm", "--results-dir", str(CLUSTER_RESULTS))
    try:
        assert cp.returncode == 0, cp.stdout + cp.stderr
        assert "node1, node2 answer on SSH" in cp.stdout
        assert "slurm ready: sinfo shows node1, node2 idle" in cp.stdout
        yield client
    finally:
        down = invoke("down")
        left = cluster.leftovers(client)
        assert down.returncode == 0, down.stdout + down.stderr
        assert left == {"containers": [], "networks": [], "volumes": []}, left


# A rank or launcher running the worker; anchored at the start of the command line so
# that `timeout ... pgrep -f PATTERN` (exec_out's wrapper) does not match itself.
TRAINING = ["pgrep", "-f", r"^[^ ]*python[^ ]* .*lab\.worker\.train"]


def records_of(out: str):
    m = re.search(r"records: (\S+results\.jsonl)", out)
    assert m, out[-2000:]
    return results.read_records(m.group(1))[0]


# The README's commands: Horovod over Gloo with 4 ranks (node1:2,node2:2), DDP with 2.
@pytest.mark.parametrize("framework,backend,np", [("horovod", "gloo", 4), ("horovod", "mpi", 2),
                                                  ("ddp", "gloo", 2)])
def test_bench_runs_across_two_nodes(up, framework, backend, np):
    cp = bench("--nodes", "2", "--np", str(np), "--framework", framework, "--backend", backend,
                "--max-steps", "15")
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-2000:]
    [r] = records_of(cp.stdout)
    assert r["status"] == "ok" and sorted(set(r["world"]["hosts"])) == ["node1", "node2"]
    assert r["world"]["nodes"] == 2 and r["world"]["devices_per_node"] == np // 2
    assert r["manifest"]["image"]["labels"]["org.dl-lab-kit.flavor"] == "cpu"


def test_bench_runs_horovod_over_ccl_on_one_node_and_on_two(up):
    """`--np 1,2` on the cluster: one node (np 1 and 2), and 2 ranks over both nodes."""
    cp = bench("--nodes", "1,2", "--np", "1,2", "--framework", "horovod", "--backend", "ccl",
               "--max-steps", "15")
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-2000:]
    rs = [r for r in records_of(cp.stdout) if r["status"] == "ok"]
    assert sorted((r["world"]["nodes"], r["world"]["np"]) for r in rs) == [(1, 1), (1, 2), (2, 2)]
    # oneCCL, not MPI's operations, carried the all-reduce, across the nodes too
    assert all(r["world"]["controller"] == "ccl" and r["world"]["allreduce_ops"]["ops"] == ["CCL_ALLREDUCE"]
               for r in rs)
    [two] = [r for r in rs if r["world"]["nodes"] == 2]
    assert sorted(set(two["world"]["hosts"])) == ["node1", "node2"]


@pytest.mark.parametrize("framework,backend", [("ddp", "gloo"), ("horovod", "gloo"), ("horovod", "mpi")])
def test_a_killed_rank_on_node2_is_relaunched_from_the_checkpoint_every_node_mounts(up, framework, backend):
    """--max-restarts across the nodes: rank 1 (node2) SIGKILLs itself at step 25, the job
    is launched again on both nodes (torchrun on each, or horovodrun/mpirun from node1 over
    SSH) and resumes from step-20.pt, which rank 0 (node1) wrote into the run's folder that
    both mount (the loss equal to an uninterrupted run's: tests/test_restarts.py, the same
    code); nothing of the job is left running on either node."""
    cp = bench("--nodes", "2", "--np", "2", "--framework", framework, "--backend", backend,
               "--data", "synthetic", "--synthetic-size", "2560", "--max-steps", "40",
               "--checkpoint-every", "10", "--max-restarts", "1", "--fault", "1:25:kill")
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-2000:]
    [r] = records_of(cp.stdout)
    assert r["status"] == "ok" and sorted(set(r["world"]["hosts"])) == ["node1", "node2"]
    (entry,) = r["restarts"]
    assert entry["resumed_from_step"] == 20 and entry["checkpoint"] == "step-00000020.pt"
    assert entry["error"]["rank"] == 1 and entry["error"]["host"] == "node2"
    assert r["figures"]["timed_steps"] == 15 and len(set(r["figures"]["parameter_digests"])) == 1
    for node in cluster.nodes(up).values():
        rc, left = cluster.exec_out(node, TRAINING, user="root")
        assert rc == 1, left


def test_a_sweep_over_nodes_runs_each_run_where_it_was_asked(up):
    """--nodes 1,2 --np 1,2: the 1-node runs on the cluster's node1 (not in a container
    of their own), np 2 over 2 nodes runs, np 1 over 2 nodes alone is skipped with its
    reason; the cluster is waited for once; the run's folder is the caller's."""
    run_id = f"nodes-sweep-{os.getpid()}"
    cp = bench("--nodes", "1,2", "--np", "1,2", "--framework", "ddp", "--max-steps", "10",
               "--run-id", run_id)
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-2000:]
    recs = results.read_records(CLUSTER_RESULTS / run_id / results.RESULTS_FILE)[0]
    by = {(r["world"]["nodes"], r["world"]["np"]): r for r in recs}
    assert sorted(by) == [(1, 1), (1, 2), (2, 1), (2, 2)], [r["status"] for r in recs]
    assert by[(2, 1)]["status"] == "skipped"
    assert by[(2, 1)]["error"]["reason"].startswith("--np 1 does not spread evenly over 2 nodes")
    assert by[(2, 2)]["status"] == "ok" and sorted(by[(2, 2)]["world"]["hosts"]) == ["node1", "node2"]
    for np in (1, 2):
        r = by[(1, np)]
        assert r["status"] == "ok" and r["world"]["hosts"] == ["node1"] * np, r["world"]
        assert r["world"]["place"] == "cluster"
    assert cp.stdout.count("cluster ready") == 1, cp.stdout
    # what the ranks (the image's user, over ssh) made is the caller's again
    run = CLUSTER_RESULTS / run_id
    assert [str(p) for p in [run, *run.rglob("*")] if p.lstat().st_uid != os.getuid()] == []


# The README's "When a run hangs" command on the cluster, for each framework.
@pytest.mark.parametrize("framework,backend", [("ddp", "gloo"), ("horovod", "gloo"), ("horovod", "mpi")])
def test_a_rank_that_hangs_on_a_node_is_named_with_its_step_and_stack(up, framework, backend):
    """Rank 1 (node2) stops calling collectives at step 20: bench's stall watch reads the
    ranks' heartbeats from the mounted results folder, stops the job within a minute of
    the stall and records rank 1 on node2, its step and the top frames its faulthandler
    watchdog wrote; nothing is left running on either node."""
    t0 = time.monotonic()
    cp = bench("--nodes", "2", "--np", "2", "--framework", framework, "--backend", backend,
                "--fault", "1:20:hang", "--stall-s", "20", "--max-steps", "40")
    elapsed = time.monotonic() - t0
    assert cp.returncode == 1, cp.stdout[-3000:] + cp.stderr[-2000:]
    [r] = records_of(cp.stdout)
    err = r["error"]
    assert r["status"] == "failed" and err["reason"].startswith("stalled: no rank advanced for 20 s"), err
    assert (err["rank"], err["host"]) == (1, "node2") and err["stalled"]["behind"] == [1]
    one = next(e for e in err["stalled"]["ranks"] if e["rank"] == 1)
    assert (one["phase"], one["step"], one["where"]) == ("step", 20, "before")
    assert one["stack"][0].endswith("in stop_calling_collectives"), one["stack"]
    assert elapsed < 20 + 120, f"took {elapsed:.0f} s"          # start-up on two nodes, 20 steps, 20 s
    for node in cluster.nodes(up).values():
        rc, left = cluster.exec_out(node, TRAINING, user="root")
        assert rc == 1, left


def test_slurm_runs_jobs_on_both_nodes_with_a_key_made_at_run_time(up):
    """Real slurmctld and slurmd (docker/cluster/slurm.sh): srun and sbatch as the lab
    user place one task on each node; MUNGE's key is the cluster's, not the image's."""
    client = up
    node1 = cluster.nodes(client)["node1"]
    rc, out = cluster.exec_out(node1, ["sinfo", "-h", "-o", "%P %a %D %t %N"])
    assert rc == 0 and out.split() == ["lab*", "up", "2", "idle", "node[1-2]"], out
    rc, out = cluster.exec_out(node1, ["srun", "-N2", "-n2", "hostname"], timeout=60)
    assert rc == 0 and sorted(out.split()) == ["node1", "node2"], out
    script = "#!/bin/bash\nsrun hostname\n"
    rc, out = cluster.exec_out(node1, ["bash", "-c", f"printf '{script}' > /tmp/job.sh && "
                                       "sbatch -N2 -n2 --wait -o /tmp/job.out /tmp/job.sh && "
                                       "cat /tmp/job.out"], timeout=90)
    assert rc == 0 and "Submitted batch job" in out, out
    assert sorted(out.split()[-2:]) == ["node1", "node2"], out
    rc, key_here = cluster.exec_out(node1, ["md5sum", "/etc/munge/munge.key"], user="root")
    assert rc == 0, key_here
    rc, key_volume = cluster.exec_out(node1, ["md5sum", "/cluster-ssh/munge.key"], user="root")
    assert key_here.split()[0] == key_volume.split()[0]
    # the image itself has none (docker/install-slurm.sh removes the one munge's install made)
    image = node1.image.tags[0]
    out = client.containers.run(image, ["bash", "-c", "ls /etc/munge"], user="root", remove=True,
                                entrypoint=[], labels={docker_api.MANAGED_BY: "test"})
    assert b"munge.key" not in out


def test_slurm_on_an_image_without_it_is_one_sentence():
    """An image built before the kit installed Slurm (the base image stands in): refused
    before compose starts anything."""
    why = _engine_and_image()
    if why:
        pytest.skip(why)
    import docker
    client = docker.from_env()
    base = "lab-base/debian:bookworm"

    def touchable():
        """The containers this `invoke up` could start or recreate: the tests' compose
        project's, and any of the base image (the probe for sinfo runs one). Not the whole
        engine's: the other worker's tests start and remove containers meanwhile."""
        listed = client.containers.list(all=True, sparse=True)   # no inspect: none can vanish
        return {c.id: c.attrs["State"] for c in listed
                if (c.attrs.get("Labels") or {}).get("com.docker.compose.project")
                == os.environ["COMPOSE_PROJECT_NAME"] or c.attrs.get("Image") == base}
    before = touchable()
    cp = subprocess.run([sys.executable, "-m", "invoke", "up", "--scheduler", "slurm", "--image",
                         base], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert cp.returncode == 2 and "Traceback" not in cp.stderr, cp.stderr
    assert "has no Slurm" in cp.stderr and "invoke build" in cp.stderr
    # nothing started, nothing recreated, no probe left (the module's cluster, if up, untouched)
    assert touchable() == before


def test_idle_nodes_from_sinfo():
    assert cluster.idle_nodes("node1 idle\nnode2 idle*\nnode3 alloc\nnode1 idle\n") == ["node1"]
    with pytest.raises(cluster.ClusterError, match="--scheduler is one of none, slurm"):
        cluster.up(2, scheduler="pbs")


def test_a_results_folder_the_nodes_cannot_write_is_refused(up, tmp_path):
    """The nodes write to the folder compose.yaml mounts: another --results-dir would
    split a sweep's records over two places, so it is refused before launch."""
    cp = bench("--nodes", "2", "--np", "2", "--framework", "horovod", "--backend", "gloo",
                "--results-dir", str(tmp_path))
    assert cp.returncode == 2, cp.stdout[-2000:] + cp.stderr
    assert "the ranks here write their records to" in cp.stderr and "(the folder they mount)" in cp.stderr
    assert "Traceback" not in cp.stderr
    assert not list(tmp_path.iterdir())


def test_the_lab_refuses_a_running_cluster_that_writes_elsewhere_before_any_part(up, tmp_path):
    """invoke lab --results-dir X with a cluster up that mounts another folder: every
    cross-server run would be skipped, so nothing runs and the sentence says what to do;
    the cluster's own folder is accepted."""
    from lab.host.suites import course
    plan = course.make(str(tmp_path), True, course.Machine(0, ("gloo",), "", False))
    with pytest.raises(course.CourseError, match=r"the running cluster's nodes write into .*"
                                                 r"`invoke down`.*--results-dir"):
        course.run(plan, echo=lambda line: None)
    assert not list(tmp_path.iterdir())
    here = course.make(str(CLUSTER_RESULTS), True, course.Machine(0, ("gloo",), "", False))
    course.check_cluster_folder(here)


def test_doctor_times_the_collectives_across_the_nodes_against_the_shaped_link(up):
    """One rank on each node over Gloo with the links shaped to 200 Mbit/s: every
    collective's bus bandwidth is a share of that rate, and none passes it by more
    than the token bucket's burst allows (unshaped, the nodes' veth pair carries well
    over 1 GB/s, so a shaping that did not apply fails here)."""
    from lab.host.suites import doctor
    row = doctor.across_nodes(doctor.check_across(2, "200mbit"), "200mbit", echo=lambda line: None)
    assert row["status"] == "PASS", row["fix"]
    v = row["value"]
    assert v["ranks"] == 2 and v["link"] == {"name": "shaped link, 200mbit", "gbs": 0.025}
    big = {op: rows[-1] for op, rows in v["ops"].items()}
    assert set(big) == {"allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall"}
    assert all(0 < r["busbw_gbs"] <= 0.025 * 1.25 for r in big.values()), big
    from envcheck.report import collectives_line
    assert "of shaped link, 200mbit, 0.025 GB/s" in collectives_line(v)
    # and the links are unshaped afterwards
    rc, out = cluster.exec_out(cluster.nodes(up)["node1"], ["tc", "qdisc", "show", "dev", "eth0"],
                               user="root")
    assert "tbf" not in out, out
    # --frozen: the image's own copy of the kit on the nodes, not the checkout's
    assert "PYTHONPATH" in doctor.check_across(2, "").env({})
    assert "PYTHONPATH" not in doctor.check_across(2, "", frozen=True).env({})


def test_the_compute_ceiling_is_measured_on_every_node(up, short_ceiling):
    """bench --nodes 2 --ceiling: the ceiling's processes run on node1 and node2, before and
    after the run, and the table's line names both. bench's own code in this process (the
    ranks and the ceiling's processes on the nodes, for real), so that each measurement
    times 5 steps, as tests/test_runs.py's do: how long a ceiling is timed (200 steps and
    10 s at least, twice) is its own rule (tests/test_gpu_records.py), not what this checks."""
    from lab.host.run import bench as lab_bench
    from lab.host.settings import BenchSettings
    from lab.report.bench_output import render
    lines: list[str] = []
    outcome = lab_bench.run(BenchSettings(nodes=2, np=[2], framework="ddp", max_steps=15, ceiling=True,
                                          where="auto", timeout_s=600,
                                          results_dir=str(CLUSTER_RESULTS)), echo=lines.append)
    assert outcome.failed == 0, "\n".join(lines[-30:])
    [r] = outcome.records
    assert r["status"] == "ok" and sorted(set(r["world"]["hosts"])) == ["node1", "node2"]
    c = r["figures"]["ceiling"]
    assert c["processes"] == 2 and c["hosts"] == ["node1", "node2"] and c["before"] > 0 and c["after"] > 0
    assert "in 2 independent process(es) over node1, node2" in render(outcome.records, outcome.run_dir)


def test_the_nodes_publish_no_port_and_trust_only_the_clusters_key(up):
    client = up
    nodes = cluster.nodes(client)
    assert set(nodes) == {"node1", "node2"}
    for c in nodes.values():
        assert not c.attrs["NetworkSettings"]["Ports"] or all(
            v is None for v in c.attrs["NetworkSettings"]["Ports"].values())
    rc, out = cluster.exec_out(nodes["node1"], ["ssh", "-o", "BatchMode=yes", "node2", "hostname"])
    assert rc == 0 and out.strip() == "node2"
    # An unknown key is refused: a fresh key pair made here does not get in.
    rc, out = cluster.exec_out(nodes["node1"], ["bash", "-c",
        "ssh-keygen -q -t ed25519 -N '' -f /tmp/other && "
        "ssh -o BatchMode=yes -o IdentitiesOnly=yes -i /tmp/other node2 true"])
    assert rc != 0 and "Permission denied" in out


def test_link_shaping_is_applied_and_recorded(up):
    client = up
    nodes = cluster.nodes(client)
    cluster.shape(nodes, "100mbit", echo=lambda s: None)
    try:
        rc, out = cluster.exec_out(nodes["node2"], ["tc", "qdisc", "show", "dev", "eth0"], user="root")
        assert "tbf" in out and "100Mbit" in out, out
    finally:
        cluster.unshape(nodes)
    rc, out = cluster.exec_out(nodes["node2"], ["tc", "qdisc", "show", "dev", "eth0"], user="root")
    assert "tbf" not in out
    cp = bench("--nodes", "2", "--np", "2", "--framework", "horovod", "--backend", "gloo",
                "--max-steps", "15", "--link", "100mbit")
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-2000:]
    [r] = records_of(cp.stdout)
    assert r["config"]["link"] == "100mbit"


def test_a_run_across_the_nodes_gives_each_its_own_cores_and_then_all_of_them_back(up):
    """While a run spans the nodes each has its share of the machine's cores (its ranks
    see only those), the record says which, and afterwards every node has them all."""
    from lab.host.places.compose import cores
    from lab.host.places.compose.runner import ClusterRunner
    from lab.host.run.records import oversubscription
    mine = cores.machine_cpus()
    if len(cores.physical_cores(mine, cores._siblings)) < 2:
        pytest.skip("one core: the nodes can only share it")
    runner, said = ClusterRunner(2), []
    affinity = ["python", "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]

    def seen(host):
        return runner.output_on(host, affinity)[1].strip().splitlines()[-1]
    planned = runner.own_cores(said.append)
    try:
        got = {h: cores.cpuset_list(planned[h]) for h in ("node1", "node2")}
        assert got["node1"] and len(got["node1"]) == len(got["node2"]) and not set(got["node1"]) & set(got["node2"])
        assert set(got["node1"]) | set(got["node2"]) <= set(mine)
        for host in ("node1", "node2"):
            assert seen(host) == str(got[host]), host
        assert said == [f"cores of their own: node1 {planned['node1']}, node2 {planned['node2']}"]
        # oversubscription judged per node: 1 rank on its share is none; 2 ranks, where the share is one core
        assert oversubscription(runner.machines(2, {"cores": len(mine)}), 1)[0]["oversubscribed"] is False
        load, line = oversubscription(runner.machines(4, {"cores": len(mine)}), 1)
        assert load == {"cores": len(got["node1"]), "oversubscribed": len(got["node1"]) < 2}
    finally:
        runner.share_cores()
    for host in ("node1", "node2"):
        assert seen(host) == str(mine)
    cp = bench("--nodes", "2", "--np", "2", "--framework", "horovod", "--backend", "gloo", "--max-steps", "15")
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-2000:]
    [r] = records_of(cp.stdout)
    assert r["world"]["node_cores"] == planned and "cores of their own" in cp.stdout
    assert r["world"]["oversubscribed"] is False
    assert all(seen(h) == str(mine) for h in ("node1", "node2"))
    cp = bench("--nodes", "2", "--np", "2", "--framework", "horovod", "--backend", "gloo", "--max-steps", "15",
               env={cores.NODE_CORES_VAR: "shared"})
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-2000:]
    [r] = records_of(cp.stdout)
    assert "node_cores" not in r["world"] and "cores of their own" not in cp.stdout
    assert "the nodes share the machine's cores (LAB_NODE_CORES=shared)" in cp.stdout


def test_cores_the_engine_refuses_are_one_sentence_and_no_node_keeps_a_share(up, monkeypatch):
    """The engine refuses a cpu it does not have (moby: "Requested CPUs are not
    available"): node1, given its share first, gets all the cores back; and a node left on
    a share (a run killed before it gave them back) gets them all back at the next run."""
    from lab.host.places.base import RunnerError
    from lab.host.places.compose import cores
    from lab.host.places.compose.runner import ClusterRunner
    mine = cores.machine_cpus()
    runner = ClusterRunner(2)
    missing = str(max(mine) + 64)
    monkeypatch.setattr(cores, "planned", lambda hosts, *a, **k: {"node1": str(mine[0]), "node2": missing})
    with pytest.raises(RunnerError, match=f"giving node2 the cpus {missing} failed .*{cores.NODE_CORES_VAR}=shared"):
        runner.own_cores(lambda s: None)
    monkeypatch.undo()
    node1 = runner.found["node1"]
    node1.reload()
    assert node1.attrs["HostConfig"]["CpusetCpus"] in ("", cores.cpuset_text(mine))
    node1.update(cpuset_cpus=str(mine[0]))          # as a killed run leaves it
    assert runner.on_nodes(1).own_cores(lambda s: None) is None
    node1.reload()
    assert node1.attrs["HostConfig"]["CpusetCpus"] == cores.cpuset_text(mine)


def test_shaping_that_fails_on_a_later_node_leaves_no_node_shaped(up):
    """node2 cannot shape (its tc moved away): node1, shaped first, is unshaped again, so
    later runs without --link do not measure a throttled link."""
    nodes = cluster.nodes(up)
    tc = cluster.exec_out(nodes["node2"], ["bash", "-c", "command -v tc"], user="root")[1].strip()
    assert tc, "no tc on node2"
    cluster.exec_out(nodes["node2"], ["mv", tc, tc + ".off"], user="root")
    try:
        cp = bench("--nodes", "2", "--np", "2", "--framework", "horovod", "--max-steps", "15",
                    "--link", "100mbit")
        assert cp.returncode == 2 and "Traceback" not in cp.stderr
        assert "shaping node2's link failed" in cp.stderr
    finally:
        cluster.exec_out(nodes["node2"], ["mv", tc + ".off", tc], user="root")
    rc, out = cluster.exec_out(nodes["node1"], ["tc", "qdisc", "show", "dev", "eth0"], user="root")
    assert rc == 0 and "tbf" not in out, out


def test_a_delay_without_netem_is_one_sentence(up):
    rc, out = cluster.exec_out(cluster.nodes(up)["node1"], ["tc", "qdisc", "add", "dev", "lo", "root",
                                                             "netem", "delay", "1ms"], user="root")
    if rc == 0:
        cluster.exec_out(cluster.nodes(up)["node1"], ["tc", "qdisc", "del", "dev", "lo", "root"], user="root")
        pytest.skip("this kernel has netem: delays work here")
    cp = bench("--nodes", "2", "--np", "2", "--framework", "horovod", "--max-steps", "15",
                "--link", "100mbit/1ms")
    assert cp.returncode == 2 and "Traceback" not in cp.stderr
    assert "no netem" in cp.stderr and "rate alone" in cp.stderr


def test_over_a_shaped_link_each_step_is_split_and_the_report_splits_what_it_lost(up, tmp_path):
    """nodes 1,2 with --link 1gbit: one node runs unshaped as the baseline, two nodes over
    the shaped link; every rank splits its steps (the parts add up), the two-node run
    exposes communication, and the report splits what its step lost against one worker
    beside its measured speedup. Without doctor's sweep of the back end saved beside the
    records (its probes would cost this test more than its runs) the row is not predicted,
    and says why."""
    from lab.report import prediction
    run_id = f"link-parts-{os.getpid()}"
    cp = bench("--nodes", "1,2", "--np", "1,2", "--framework", "ddp", "--backend", "gloo",
               "--data", "digits", "--epochs", "1", "--max-steps", "12", "--warmup-steps", "2",
               "--link", "1gbit", "--run-id", run_id)
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-2000:]
    recs = results.read_records(CLUSTER_RESULTS / run_id / results.RESULTS_FILE)[0]
    ok = {(r["world"]["nodes"], r["world"]["np"]): r for r in recs if r["status"] == "ok"}
    assert set(ok) == {(1, 1), (1, 2), (2, 2)}, [r.get("error") for r in recs]
    assert ok[(1, 1)]["config"]["link"] == "" and ok[(2, 2)]["config"]["link"] == "1gbit"
    across = ok[(2, 2)]["figures"]["step_parts"]["ranks"]
    assert len(across) == 2 and all(x["sum_within_tolerance"] for x in across)
    assert all(x["parts_s"]["communication"] > 0 for x in across)
    split = {p["servers"]: p for p in prediction.measured(recs)}
    assert 2 in split and split[2]["gap"]["communication"] > 0 and split[2]["speedup"] is not None
    assert not any(p["servers"] == 2 for p in prediction.predictions(recs))
    [why] = [u["why"] for u in prediction.unpredicted(recs) if u["row"]["servers"] == 2]
    assert why.startswith("no collective sweep of its back end")


@pytest.mark.parametrize("framework,backend", [("ddp", "gloo"), ("horovod", "gloo"), ("horovod", "mpi")])
def test_the_slurm_launcher_runs_each_framework_as_a_batch_job(up, framework, backend):
    """bench --launcher slurm: the script in the run's folder, sbatch from node1, the job's
    output streamed, its id and final state in the record."""
    cp = bench("--nodes", "2", "--np", "2", "--framework", framework, "--backend", backend,
                "--max-steps", "10", "--launcher", "slurm")
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-2000:]
    [r] = records_of(cp.stdout)
    assert r["status"] == "ok" and sorted(r["world"]["hosts"]) == ["node1", "node2"]
    sched = r["world"]["scheduler"]
    assert "node_cores" not in r["world"]      # Slurm's nodes keep the cores slurmd counted
    assert sched["name"] == "slurm" and sched["job_id"].isdigit() and sched["nodelist"] == "node[1-2]"
    assert sched["state"] == "COMPLETED" and sched["exit_code"] == "0:0"
    assert f"submitted Slurm job {sched['job_id']}" in cp.stdout
    assert f"lab: Slurm job {sched['job_id']} on node1 node2" in cp.stdout      # streamed
    run = Path(re.search(r"records: (\S+)", cp.stdout).group(1)).parent
    [script] = run.glob("slurm/*/job.sbatch")
    assert "#SBATCH --nodes=2" in script.read_text()
    assert (script.parent / f"slurm-{sched['job_id']}.out").exists()


def test_a_killed_rank_under_slurm_is_relaunched_as_a_new_batch_job(up):
    """--launcher slurm --max-restarts 1: rank 1 (node2) SIGKILLs itself at step 25, its
    batch job ends FAILED, bench submits the relaunch as a batch job of its own (its own
    script and output file), which resumes from step-20.pt in the run's folder and ends
    COMPLETED; one ok record with the restart, as on the other places."""
    cp = bench("--nodes", "2", "--np", "2", "--framework", "ddp", "--backend", "gloo",
               "--data", "synthetic", "--synthetic-size", "2560", "--max-steps", "40",
               "--checkpoint-every", "10", "--max-restarts", "1", "--fault", "1:25:kill",
               "--launcher", "slurm")
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-2000:]
    [r] = records_of(cp.stdout)
    assert r["status"] == "ok" and sorted(r["world"]["hosts"]) == ["node1", "node2"]
    (entry,) = r["restarts"]
    assert entry["resumed_from_step"] == 20 and entry["checkpoint"] == "step-00000020.pt"
    assert entry["error"]["rank"] == 1, entry
    assert r["figures"]["timed_steps"] == 15 and len(set(r["figures"]["parameter_digests"])) == 1
    sched = r["world"]["scheduler"]
    assert sched["state"] == "COMPLETED", sched
    jobs = re.findall(r"submitted Slurm job (\d+)", cp.stdout)
    assert len(jobs) == 2 and jobs[1] == sched["job_id"] != jobs[0], jobs
    run = Path(re.search(r"records: (\S+)", cp.stdout).group(1)).parent
    first, again = sorted(p.parent.name for p in run.glob("slurm/*/job.sbatch"))
    assert again == f"{first}-restart1" == entry["attempt"] + "-restart1", (first, again)
    assert (run / "slurm" / again / f"slurm-{sched['job_id']}.out").exists()


@pytest.mark.slow
def test_a_slurm_job_held_in_the_queue_past_the_bound_is_not_called_stalled(up):
    """Both nodes taken by another job for longer than any bound (--stall-s 20, and the
    import's, 40 s here through LAB_IMPORT_S, before a heartbeat): bench's job waits PENDING
    (Resources), then runs and is recorded ok; the stall watch's bound started when Slurm
    ran it."""
    node1 = cluster.nodes(up)["node1"]
    rc, blocker = cluster.exec_out(node1, ["sbatch", "--parsable", "--nodes=2", "--exclusive",
                                           "--job-name=lab-blocker", "--wrap", "sleep 60"])
    assert rc == 0, blocker
    try:
        t0 = time.monotonic()
        cp = bench("--nodes", "2", "--np", "2", "--framework", "ddp", "--max-steps", "10",
                   "--launcher", "slurm", "--stall-s", "20", timeout=900, env={"LAB_IMPORT_S": "40"})
        took = time.monotonic() - t0
    finally:
        cluster.exec_out(node1, ["scancel", blocker.strip()], user="root")
    assert cp.returncode == 0 and "stalled" not in cp.stdout, cp.stdout[-3000:] + cp.stderr[-2000:]
    [r] = records_of(cp.stdout)
    assert r["status"] == "ok" and r["world"]["scheduler"]["state"] == "COMPLETED"
    assert took > 55, f"the job did not wait for the other one ({took:.0f} s)"


def test_a_slurm_job_that_cannot_fit_is_cancelled_in_one_sentence(up):
    """Three ranks per node where each node has 2 CPUs: Slurm would keep it pending for
    ever (PartitionConfig); bench cancels it and says why."""
    cp = bench("--nodes", "2", "--np", "6", "--framework", "horovod", "--backend", "mpi",
                "--max-steps", "10", "--launcher", "slurm")
    assert cp.returncode == 1 and "Traceback" not in cp.stderr, cp.stdout[-2000:] + cp.stderr
    [r] = records_of(cp.stdout)
    assert r["status"] == "failed" and "cannot run job" in r["error"]["reason"]
    assert r["error"]["slurm"]["reason"] == "PartitionConfig"
    rc, out = cluster.exec_out(cluster.nodes(up)["node1"], ["squeue", "-h"])
    assert rc == 0 and out.strip() == "", out


def test_the_slurm_launcher_on_more_nodes_than_slurm_has_is_one_sentence(up, tmp_path):
    cp = bench("--nodes", "3", "--np", "3", "--framework", "ddp", "--launcher", "slurm")
    assert cp.returncode == 2 and "Traceback" not in cp.stderr, cp.stderr
    assert "no running node3" in cp.stderr or "no node node3" in cp.stderr
    assert "`invoke up --nodes 3 --scheduler slurm`" in cp.stderr, cp.stderr     # Slurm's place's own


def test_a_partition_slurm_does_not_have_is_refused_by_sbatch_in_one_sentence(up):
    cp = bench("--nodes", "2", "--np", "2", "--framework", "ddp", "--launcher", "slurm",
                "--partition", "nosuch", "--max-steps", "10")
    assert cp.returncode == 1 and "Traceback" not in cp.stderr, cp.stderr
    [r] = records_of(cp.stdout)
    assert r["error"]["reason"].startswith("sbatch refused the job: ")
    assert "Invalid partition name" in r["error"]["reason"] and r["error"]["slurm"]["job_id"] is None


def submitted_by_hand(up, script: str, run_id: str) -> tuple[int, str]:
    """A script of `invoke sbatch` submitted with plain `sbatch --wait` on node1 as a user
    would (with the checkout's code, which sbatch passes on from the environment), into a
    run folder made as a user makes it on shared storage: (its exit status, its output)."""
    import base64

    from lab.host.places.image import hand_over
    (CLUSTER_RESULTS / run_id).mkdir(parents=True)
    hand_over(str(CLUSTER_RESULTS / run_id), str(CLUSTER_RESULTS), everyone=True)
    encoded = base64.b64encode(script.encode()).decode()
    sub = f"/tmp/sub-{run_id}"
    return cluster.exec_out(cluster.nodes(up)["node1"], [
        "bash", "-c", f"mkdir -p {sub} && cd {sub} && echo {encoded} | base64 -d > job.sbatch && "
                      f"PYTHONPATH=/opt/lab-src sbatch --wait job.sbatch; rc=$?; cat lab-{run_id}-*.out; "
                      f"exit $rc"], timeout=300)


def test_the_script_invoke_sbatch_writes_runs_as_submitted_by_hand(up):
    """`invoke sbatch` for a cluster whose shared folders are /results and /data: the
    script, submitted with plain sbatch on node1, writes its record."""
    run_id = f"sbatch-{os.getpid()}-{int(time.time())}"
    cp = invoke("sbatch", "--nodes", "2", "--np", "2", "--framework", "horovod", "--backend", "mpi",
                "--max-steps", "10", "--results-dir", "/results", "--data-dir", "/data",
                "--run-id", run_id, "--timeout-s", "600")
    assert cp.returncode == 0, cp.stderr
    rc, out = submitted_by_hand(up, cp.stdout, run_id)
    assert rc == 0, out
    [r] = results.read_records(CLUSTER_RESULTS / run_id / results.RESULTS_FILE)[0]
    assert r["status"] == "ok" and sorted(r["world"]["hosts"]) == ["node1", "node2"]
    assert r["world"]["scheduler"]["job_id"].isdigit() and r["world"]["controller"] == "mpi"


def test_the_script_invoke_sbatch_writes_retries_a_failed_step_from_its_checkpoint(up):
    """`invoke sbatch --checkpoint-every 10 --max-restarts 1`, with rank 1 SIGKILLing itself
    at step 25 (--fault, which invoke sbatch does not take, added to the ranks' command):
    the script's job step fails, is run again in the same allocation with --restart 1,
    resumes from step-20.pt and ends the job COMPLETED with an ok record."""
    run_id = f"sbatch-retry-{os.getpid()}-{int(time.time())}"
    cp = invoke("sbatch", "--nodes", "2", "--np", "2", "--framework", "ddp", "--backend", "gloo",
                "--data", "synthetic", "--max-steps", "40",
                "--checkpoint-every", "10", "--max-restarts", "1", "--results-dir", "/results",
                "--data-dir", "/data", "--run-id", run_id, "--timeout-s", "600")
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.count("--checkpoint-every 10 ") == 1, cp.stdout
    script = cp.stdout.replace("--checkpoint-every 10 ", "--checkpoint-every 10 --fault 1:25:kill ")
    rc, out = submitted_by_hand(up, script, run_id)
    assert rc == 0, out
    assert "retrying it (1 of at most 1) from the last checkpoint" in out, out
    assert "relaunch 1: resuming from step 20 (step-00000020.pt)" in out, out
    recs = results.read_records(CLUSTER_RESULTS / run_id / results.RESULTS_FILE)[0]
    r = recs[-1]
    assert r["status"] == "ok" and sorted(r["world"]["hosts"]) == ["node1", "node2"], [x["status"] for x in recs]
    assert r["figures"]["timed_steps"] == 15 and len(set(r["figures"]["parameter_digests"])) == 1


@pytest.mark.parametrize("launcher", ["direct", "slurm"])
def test_what_a_cluster_runner_runs_is_its_commands(up, launcher):
    """commands(launch) is what run() has the engine start: for the direct launcher the
    argv of each node's `docker exec` as the engine reports it (exec inspect's
    ProcessConfig), for Slurm the sbatch on node1, whose script is the one written for
    this launch and holds its worker arguments."""
    from lab.common.config import RunConfig
    from lab.host.places.base import Launch
    from lab.host.places.compose.runner import ClusterRunner
    from lab.host.places.slurm.runner import SlurmClusterRunner
    runner = ClusterRunner(2) if launcher == "direct" else SlurmClusterRunner(2)
    run_id = f"cmds-{launcher}-{os.getpid()}-{int(time.time())}"
    cfg = RunConfig(framework="ddp", max_steps=4, warmup_steps=1, results_dir=runner.results_in,
                    data_dir=runner.data_in, run_id=run_id, expected_np=2, attempt="a0")
    rdir = Path(runner.results_dir) / run_id
    rdir.mkdir(parents=True)
    runner.prepare(str(rdir))
    launch = Launch("ddp", "gloo", 2, tuple(cfg.to_args()), (), 300, run_id, "a0")
    commands = runner.commands(launch)
    lines: list[str] = []
    res = runner.run(commands, {}, 300, lines.append)
    assert res.returncode == 0, "\n".join(lines[-30:])
    assert runner.started == commands
    if launcher == "direct":
        assert set(commands) == {"node1", "node2"}
    else:
        script = Path(runner.results_dir) / Path(commands["node1"][-1]).relative_to(runner.results_in)
        import shlex
        text = script.read_text().replace(" \\\n    ", " ")       # the script's continuation lines
        assert shlex.join(cfg.to_args()) in text
    [r] = results.read_records(rdir / results.RESULTS_FILE)[0]
    assert r["status"] == "ok" and sorted(set(r["world"]["hosts"])) == ["node1", "node2"]


def bench_from_node1(node1, *args, timeout=600):
    """`invoke bench` run on node1 as the user lab, from the checkout's tasks there
    (compose.yaml mounts them at /opt/lab-src), as on a user's first server."""
    cmd = ["env", "PYTHONPATH=/opt/lab-src", "bash", "-c",
           "cd /opt/lab-src && invoke bench " + " ".join(args)]
    return cluster.exec_out(node1, cmd, timeout=timeout)


def test_bench_on_a_list_of_hosts_runs_from_the_first_over_ssh(up):
    """--hosts node1:1,node2:1 from node1 (the cluster's SSH keys stand for the user's
    own): DDP and Horovod record both hosts; a rank that fails ends the job on both
    hosts; a host that does not answer, slots that do not add up to --np, and a host
    whose Horovod is another version (changed on node2 for the test) are each one
    sentence before any rank starts."""
    from lab.host.places.image import hand_over
    nodes = cluster.nodes(up)
    node1, node2 = nodes["node1"], nodes["node2"]
    folder = CLUSTER_RESULTS / f"hosts-{os.getpid()}-{int(time.time())}"
    folder.mkdir(parents=True)
    hand_over(str(folder), str(CLUSTER_RESULTS), everyone=True)
    inside = f"/results/{folder.name}"
    common = ["--hosts", "node1:1,node2:1", "--np", "2", "--results-dir", inside, "--data-dir", "/data"]
    for i, framework in enumerate(["ddp", "horovod"]):
        rc, out = bench_from_node1(node1, *common, "--framework", framework, "--run-id", f"ok{i}",
                                   "--max-steps", "10")
        assert rc == 0, out[-3000:]
        [r] = results.read_records(folder / f"ok{i}" / results.RESULTS_FILE)[0]
        assert r["status"] == "ok" and r["world"]["hosts"] == ["node1", "node2"], r["world"]
    rc, out = bench_from_node1(node1, *common, "--framework", "ddp", "--run-id", "fault",
                               "--max-steps", "200", "--fault", "1:5")
    assert rc == 1, out[-3000:]
    [r] = results.read_records(folder / "fault" / results.RESULTS_FILE)[0]
    assert r["status"] == "failed" and (r["error"]["rank"], r["error"]["host"]) == (1, "node2")
    for node in (node1, node2):
        rc, left = cluster.exec_out(node, TRAINING, user="root")
        assert rc == 1, left                                  # nothing left running anywhere
    for args, words in [(["--hosts", "node1:1,node9:1", "--np", "2"], "host node9 does not answer over SSH"),
                        (["--hosts", "node1:1,node2:1", "--np", "4"], "offer 2 slot(s)"),
                        (["--hosts", "node1:1", "--hostfile", "/dev/null", "--np", "1"], "--hosts or --hostfile"),
                        # run from node1, a machine other than the first host
                        (["--hosts", "node2:1,node1:1", "--np", "2"], "this machine is not node2")]:
        rc, out = bench_from_node1(node1, *args, "--framework", "ddp", "--results-dir", inside,
                                   "--run-id", "refused")
        assert rc == 2 and words in out and "Traceback" not in out, out[-2000:]
    init = "$(python -c 'import horovod, os; print(os.path.dirname(horovod.__file__))')/__init__.py"
    rc, out = cluster.exec_out(node2, ["bash", "-c", f"cp {init} /tmp/hvd-init.bak && sed -i "
                                       f"'s/^__version__ = .*/__version__ = \"0.27.0\"/' {init}"],
                               user="root")
    assert rc == 0, out
    try:
        rc, out = bench_from_node1(node1, *common, "--framework", "horovod", "--run-id", "refused",
                                   "--max-steps", "10")
        assert rc == 2 and "Traceback" not in out, out[-2000:]
        assert "host node2 has Horovod 0.27.0 and node1 has 0.28.1" in out, out[-2000:]
    finally:
        cluster.exec_out(node2, ["bash", "-c", f"cp /tmp/hvd-init.bak {init}"], user="root")
    assert not (folder / "refused").exists()               # refused before anything was made


def test_a_hang_on_hosts_without_a_shared_folder_names_the_rank_over_the_stream(up):
    """--hosts node1:1,node2:1 with a results folder of each host's own (/tmp): rank 1's
    heartbeat file stays on node2, its marker lines come back over ssh, and the record
    bench writes on node1 names rank 1 on node2 at step 20 with its frames."""
    node1 = cluster.nodes(up)["node1"]
    run_id = f"hosts-hang-{os.getpid()}"
    rc, out = bench_from_node1(node1, "--hosts", "node1:1,node2:1", "--np", "2", "--framework", "ddp",
                               "--results-dir", "/tmp/lab-own", "--data-dir", "/data", "--run-id", run_id,
                               "--max-steps", "200", "--fault", "1:20:hang", "--stall-s", "20")
    assert rc == 1, out[-3000:]
    assert "@lab-" not in out
    rc, text = cluster.exec_out(node1, ["cat", f"/tmp/lab-own/{run_id}/{results.RESULTS_FILE}"])
    assert rc == 0, text
    [r] = [json.loads(line) for line in text.splitlines() if line.strip()]
    err = r["error"]
    assert err["reason"].startswith("stalled: no rank advanced for 20 s"), err["reason"]
    assert (err["rank"], err["host"]) == (1, "node2") and "never ran the worker" not in err["reason"]
    one = next(e for e in err["stalled"]["ranks"] if e["rank"] == 1)
    assert (one["phase"], one["step"]) == ("step", 20)
    assert one["stack"] and one["stack"][0].endswith("in stop_calling_collectives"), one["stack"]
    for node in cluster.nodes(up).values():
        rc, left = cluster.exec_out(node, TRAINING, user="root")
        assert rc == 1, left


def test_a_silent_slurm_controller_ends_the_poll_in_one_sentence(up):
    """slurmctld killed while its job runs: with no time limit, bench's poll ends once
    scontrol has not answered for CONTROLLER_SILENCE_S (5 s here, 60 s in bench), and
    says so; the controller is then started again and the job cancelled."""
    from lab.common.config import RunConfig
    from lab.host.places.base import Launch
    from lab.host.places.slurm.runner import SlurmClusterRunner
    node1 = cluster.nodes(up)["node1"]
    runner = SlurmClusterRunner(2)
    runner.CONTROLLER_SILENCE_S = 5.0
    run_id = f"silent-{os.getpid()}-{int(time.time())}"
    cfg = RunConfig(framework="ddp", max_steps=100000, results_dir=runner.results_in,
                    data_dir=runner.data_in, run_id=run_id, expected_np=2, attempt="silent")
    rdir = Path(runner.results_dir) / run_id
    rdir.mkdir(parents=True)
    runner.prepare(str(rdir))
    commands = runner.commands(Launch("ddp", "gloo", 2, tuple(cfg.to_args()), (), 0, run_id, "silent"))
    lines: list[str] = []

    def echo(line):
        lines.append(line)
        if line.startswith("submitted Slurm job"):
            rc, out = cluster.exec_out(node1, ["pkill", "-KILL", "-x", "slurmctld"], user="root")
            assert rc == 0, out
    t0 = time.monotonic()
    try:
        res = runner.run(commands, {}, 0, echo)
        took = time.monotonic() - t0
    finally:
        rc, out = cluster.exec_out(node1, ["/usr/sbin/slurmctld"], user="root")
        for _ in range(30):
            if cluster.exec_out(node1, ["scontrol", "ping"])[0] == 0:
                break
            time.sleep(1)
        # A controller just started may not know the job yet (it recovers its state):
        # cancel until the queue no longer holds it (a loaded CI left ranks once).
        for _ in range(60):
            cluster.exec_out(node1, ["scancel", "--name", "lab-silent"], user="root")
            rc, queued = cluster.exec_out(node1, ["squeue", "-h", "--name", "lab-silent"])
            if rc == 0 and not queued.strip():
                break
            time.sleep(1)
    assert res.returncode is None and "Slurm's controller did not answer for 5 s" in res.why, res.why
    assert took < 90, took
    for node in cluster.nodes(up).values():               # the job was cancelled once it answered
        for _ in range(60):
            if cluster.exec_out(node, TRAINING, user="root")[0] == 1:
                break
            time.sleep(1)
        else:
            raise AssertionError(f"ranks left running on {node.name}")


def test_stopping_bench_cancels_its_slurm_job(up):
    """`kill` (SIGTERM) to bench while its job runs: the job is cancelled with scancel,
    no rank is left on either node, and the record says so with the job id."""
    import signal
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "bench", "--nodes", "2", "--np", "2",
                             "--framework", "horovod", "--backend", "gloo", "--launcher", "slurm",
                             "--max-steps", "100000", "--results-dir", str(CLUSTER_RESULTS)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "epoch 1/1" in line or "loss" in line or len(lines) > 400:
                break
            if re.search(r"lab: Slurm job \d+ on", line):
                break
        # the job's ranks running on both nodes (what the stop must leave none of)
        nodes = cluster.nodes(up).values()
        for _ in range(120):
            if all(cluster.exec_out(node, TRAINING, user="root")[0] == 0 for node in nodes):
                break
            time.sleep(0.5)
        else:
            raise AssertionError("the job's ranks never ran on both nodes")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(lines) + out
    assert proc.returncode == 143, out[-2000:]
    job = re.search(r"submitted Slurm job (\d+)", out).group(1)
    run = re.search(r"\(/results/(\S+?)/slurm/", out).group(1)
    [r] = results.read_records(CLUSTER_RESULTS / run / results.RESULTS_FILE)[0]
    assert r["status"] == "failed" and r["error"]["reason"] == "stopped by SIGTERM"
    assert r["error"]["slurm"]["job_id"] == job
    node1 = cluster.nodes(up)["node1"]
    for _ in range(30):
        rc, queue = cluster.exec_out(node1, ["squeue", "-h"])
        if rc == 0 and not queue.strip():
            break
        time.sleep(1)
    assert queue.strip() == "", queue
    for node in cluster.nodes(up).values():
        rc, left = cluster.exec_out(node, TRAINING, user="root")
        assert rc == 1, left


def test_a_slurm_job_that_loses_a_node_fails_naming_it(up):
    """node2 killed during a job: Slurm marks it down (SlurmdTimeout=10) and ends the
    job NODE_FAIL; the record names node2, within 60 s of the kill. node2 is started
    again afterwards and Slurm takes it back (ReturnToService=2)."""
    client = up
    node2 = cluster.nodes(client)["node2"]
    killed = {}

    def kill_when_training():
        for _ in range(240):
            rc, _ = cluster.exec_out(node2, TRAINING, user="root")
            if rc == 0:
                time.sleep(3)
                killed["at"] = time.monotonic()
                node2.kill()
                return
            time.sleep(0.5)

    killer = threading.Thread(target=kill_when_training, daemon=True)
    killer.start()
    try:
        cp = bench("--nodes", "2", "--np", "2", "--framework", "ddp", "--backend", "gloo",
                    "--max-steps", "100000", "--timeout-s", "300", "--launcher", "slurm")
        ended = time.monotonic()
        killer.join(timeout=5)
        assert cp.returncode == 1, cp.stdout[-2000:] + cp.stderr[-2000:]
        [r] = records_of(cp.stdout)
        assert r["status"] == "failed" and r["error"]["host"] == "node2", r["error"]
        assert r["error"]["slurm"]["state"] == "NODE_FAIL"
        assert r["error"]["slurm"]["failed_nodes"] == ["node2"]
        assert "NODE_FAIL: node node2" in r["error"]["reason"]
        assert ended - killed["at"] < 60, f"{ended - killed['at']:.0f} s from the kill to the record"
    finally:
        node2.start()
        found = cluster.wait_ssh(client, 2, echo=lambda s: None)
        cluster.wait_slurm(found, 2, echo=lambda s: None)


def test_a_node_that_dies_mid_job_ends_it_naming_the_node(up):
    """Last in this module: it kills node2. The run before it stays intact."""
    client = up
    first = bench("--nodes", "2", "--np", "2", "--framework", "horovod", "--backend", "gloo",
                   "--max-steps", "10")
    assert first.returncode == 0
    before = Path(re.search(r"records: (\S+)", first.stdout).group(1)).read_bytes()
    node2 = cluster.nodes(client)["node2"]

    def kill_when_training():
        for _ in range(240):
            rc, out = cluster.exec_out(node2, TRAINING, user="root")
            if rc == 0:
                time.sleep(3)
                node2.kill()
                return
            time.sleep(0.5)

    killer = threading.Thread(target=kill_when_training, daemon=True)
    killer.start()
    t0 = time.monotonic()
    cp = bench("--nodes", "2", "--np", "2", "--framework", "horovod", "--backend", "gloo",
                "--max-steps", "100000", "--timeout-s", "300")
    took = time.monotonic() - t0
    killer.join(timeout=5)
    assert cp.returncode == 1, cp.stdout[-2000:]
    [r] = records_of(cp.stdout)
    assert r["status"] == "failed" and r["error"]["host"] == "node2"
    assert "node node2 stopped during the run" in r["error"]["reason"]
    assert took < 120, f"the job took {took:.0f} s to end after node2 died"
    assert Path(re.search(r"records: (\S+)", first.stdout).group(1)).read_bytes() == before


def test_which_containers_belong_to_this_checkout(monkeypatch):
    here = {cluster.WORKING_DIR: str(REPO), cluster.PROJECT: cluster.project_name()}
    assert cluster.ours(here)
    assert not cluster.ours({**here, cluster.WORKING_DIR: "/elsewhere/kit"})
    assert not cluster.ours({})
    # the same checkout's other project (a user's `invoke up` beside the tests' cluster)
    assert not cluster.ours({**here, cluster.PROJECT: "another"})
    monkeypatch.delenv("COMPOSE_PROJECT_NAME")
    assert cluster.project_name("/tmp/My Kit.2") == "mykit2"


def test_the_tests_cluster_is_a_project_and_results_folder_of_its_own():
    """conftest names the tests' compose project and the folder it mounts: never the
    checkout's project (a user's `invoke up`) nor its results/."""
    assert os.environ["COMPOSE_PROJECT_NAME"] != re.sub(r"[^-_a-z0-9]", "", REPO.name.lower())
    assert cluster.mounted(cluster.RESULTS_VAR, "results") == CLUSTER_RESULTS
    assert not CLUSTER_RESULTS.resolve().is_relative_to(REPO.resolve())


def test_a_cluster_started_by_plain_compose_in_another_folder_is_the_one_bench_uses(tmp_path, monkeypatch):
    """As a new user would: the checkout copied into a folder named unlike the kit,
    `docker-compose up -d` there (not through invoke), then `invoke bench --nodes 2`
    from that folder; `docker-compose down -v` then leaves nothing of it. Meanwhile a
    cluster of the original checkout, if one is up, is neither used nor touched."""
    why = _engine_and_image()
    if why:
        pytest.skip(why)
    import shutil

    import docker
    client = docker.from_env(timeout=60)
    copy = tmp_path / "My Lab Copy"
    shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(
        ".git", ".venv", "results", "data", "__pycache__", ".cluster", ".pytest_cache", "tests"))
    prog = cluster.compose_program()
    before = set(cluster.nodes(client))
    env = {k: v for k, v in os.environ.items() if k not in ("COMPOSE_PROJECT_NAME", "LAB_RESULTS")}
    try:
        cp = subprocess.run([*prog, "up", "-d"], cwd=copy, capture_output=True, text=True,
                            timeout=300, env=env)
        assert cp.returncode == 0, cp.stderr
        assert set(cluster.nodes(client)) == before       # not this checkout's nodes
        cp = subprocess.run([sys.executable, "-m", "invoke", "bench", "--nodes", "2", "--np", "2",
                             "--framework", "horovod", "--backend", "gloo", "--max-steps", "15"],
                            cwd=copy, capture_output=True, text=True, timeout=600, env=env)
        assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-2000:]
        [r] = results.read_records(next((copy / "results").glob("*/results.jsonl")))[0]
        assert r["status"] == "ok" and sorted(r["world"]["hosts"]) == ["node1", "node2"]
        # brought up without Slurm's daemons: --launcher slurm is one sentence
        cp = subprocess.run([sys.executable, "-m", "invoke", "bench", "--nodes", "2", "--np", "2",
                             "--framework", "ddp", "--launcher", "slurm"],
                            cwd=copy, capture_output=True, text=True, timeout=300, env=env)
        assert cp.returncode == 2 and "Traceback" not in cp.stderr, cp.stderr
        assert "Slurm does not answer on node1" in cp.stderr and "--scheduler slurm" in cp.stderr
    finally:
        down = subprocess.run([*prog, "down", "-v"], cwd=copy, capture_output=True, text=True,
                              timeout=300, env=env)
    assert down.returncode == 0, down.stderr
    with monkeypatch.context() as m:                    # the copy's project: named after its folder
        m.delenv("COMPOSE_PROJECT_NAME")
        project = cluster.project_name(copy)
    assert project == "mylabcopy"
    flt = {"label": f"com.docker.compose.project={project}"}
    assert client.containers.list(all=True, filters=flt) == []
    assert client.networks.list(filters=flt) == [] and client.volumes.list(filters=flt) == []
    assert set(cluster.nodes(client)) == before


def test_cluster_commands_for_each_framework_and_back_end():
    from lab.host.places.compose.runner import cluster_commands
    cmds = cluster_commands("horovod", "nccl", 4, 2, ["--device", "cuda"])
    assert list(cmds) == ["node1"]
    assert cmds["node1"][:6] == ["horovodrun", "-np", "4", "-H", "node1:2,node2:2", "--gloo"]
    # with the nodes' stack probe, horovodrun's build checks are answered from it
    # (lab.host.launchers.horovod), the rest of the command unchanged
    lean = cluster_commands("horovod", "ccl", 2, 2, ["--max-steps", "3"],
                            stack={"horovod": {"gloo": True, "mpi": True}})["node1"]
    assert lean[:4] == ["python", "-m", "lab.host.launchers.horovod", "--built=gloo,mpi"]
    assert lean[4:] == cluster_commands("horovod", "ccl", 2, 2, ["--max-steps", "3"])["node1"][1:]
    assert cluster_commands("horovod", "gloo", 2, 2, [], stack={"horovod": None})["node1"][0] == "horovodrun"
    ddp = cluster_commands("ddp", "gloo", 4, 2, [])
    assert list(ddp) == ["node1", "node2"] and "--node-rank=1" in ddp["node2"]
    with pytest.raises(cluster.ClusterError, match="spread evenly"):
        cluster_commands("ddp", "gloo", 3, 2, [])


def test_each_ddp_launch_on_the_cluster_has_its_own_rendezvous():
    """Port and id from the run and attempt (as --hosts and Slurm): a launch left over on
    node1 never meets the next one at a fixed 29500 with the default id."""
    from lab.host.places.compose.runner import cluster_commands

    def rendezvous(run, attempt):
        cmds = cluster_commands("ddp", "gloo", 4, 2, ["--run-id", run, "--attempt", attempt],
                                f"{run}/{attempt}")
        found = [{a.split("=")[0]: a.split("=", 1)[1] for a in c if a.startswith("--rdzv-")}
                 for c in cmds.values()]
        assert found[0] == found[1]                   # every node meets at the same place
        return found[0]
    a, b = rendezvous("r1", "000-ddp-np4"), rendezvous("r1", "001-ddp-np4")
    assert a["--rdzv-id"] == "r1-000-ddp-np4" and a["--rdzv-id"] != b["--rdzv-id"]
    assert a["--rdzv-endpoint"].startswith("node1:") and a != rendezvous("r2", "000-ddp-np4")


def test_the_lab_refuses_a_cluster_that_is_partly_up(tmp_path, monkeypatch):
    """Only node1 of the checkout's cluster runs (here a container that Compose's labels
    and the kit's make this checkout's node1, in a project of its own): the lab would bring
    node2 up beside it and take both down after, so it refuses before any part runs."""
    why = _engine_and_image()
    if why:
        pytest.skip(why)
    import uuid

    import docker
    from lab.common.docker_api import CLUSTER
    from lab.host.suites import course
    project = f"labtest-partly-{uuid.uuid4().hex[:6]}"
    monkeypatch.setenv("COMPOSE_PROJECT_NAME", project)
    client = docker.from_env(timeout=60)
    node1 = client.containers.run(IMAGE, ["sleep", "120"], detach=True, hostname="node1",
                                  labels={CLUSTER: "node", cluster.WORKING_DIR: str(REPO),
                                          cluster.PROJECT: project})
    try:
        plan = course.make(str(tmp_path), True, course.Machine(0, ("gloo",), "", False))
        with pytest.raises(course.CourseError, match=r"the cluster is partly up \(node1 runs, node2 "
                                                     r"does not\): take it down with `invoke down`"):
            course.check_cluster_folder(plan)
        node1.stop(timeout=1)
        course.check_cluster_folder(plan)       # nothing running: the lab brings it up
    finally:
        node1.remove(force=True)
    assert not list(tmp_path.iterdir())

