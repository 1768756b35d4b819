"""Launch command construction: pure functions, no processes."""
import pytest

from lab.host.places import launch
from lab.host.places.launch import Host


def test_parse_hosts():
    assert launch.parse_hosts("node1:2,node2:2") == [Host("node1", 2), Host("node2", 2)]
    assert launch.parse_hosts("a, b:3") == [Host("a", 1), Host("b", 3)]
    assert launch.format_hosts(launch.parse_hosts("a,b:3")) == "a:1,b:3"


@pytest.mark.parametrize("spec,message", [
    ("a,,b", "empty host"), (":2", "missing host name"), ("a:x", "whole number"),
    ("a:0", "at least 1 slot"), ("a:1,a:2", "listed twice"),
])
def test_parse_hosts_rejects(spec, message):
    with pytest.raises(launch.HostsError, match=message):
        launch.parse_hosts(spec)


def test_horovod_command():
    cmd = launch.horovod_command(4, launch.parse_hosts("n1:2,n2:2"), "mpi", ["--epochs", "1"],
                                 python="py")
    assert cmd == ["horovodrun", "-np", "4", "-H", "n1:2,n2:2", "--mpi",
                   "py", "-m", "lab.worker.train", "--epochs", "1"]


def test_horovod_command_needs_slots_and_a_controller():
    with pytest.raises(launch.HostsError, match="slots"):
        launch.horovod_command(3, launch.parse_hosts("n1:2"), "gloo", [])
    with pytest.raises(ValueError, match="controller"):
        launch.horovod_command(1, launch.local_hosts(1), "nccl", [])


def test_nccl_runs_over_the_gloo_controller():
    cmd = launch.command("horovod", "nccl", 2, [], python="py")
    assert cmd[:6] == ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo"]


def test_ddp_commands():
    assert launch.ddp_command(2, ["--x", "1"], python="py") == [
        "py", "-m", "torch.distributed.run", "--nproc-per-node=2", "--standalone",
        "-m", "lab.worker.train", "--x", "1"]
    multi = launch.ddp_command(2, [], nnodes=2, node_rank=1, rdzv_endpoint="node1:29400", python="py")
    assert "--nnodes=2" in multi and "--node-rank=1" in multi
    assert "--rdzv-endpoint=node1:29400" in multi and "--standalone" not in multi
    with pytest.raises(ValueError, match="rendezvous"):
        launch.ddp_command(2, [], nnodes=2)


def test_serial_run_is_one_process():
    assert launch.command("none", "gloo", 1, ["--a"], python="py") == ["py", "-m", "lab.worker.train", "--a"]
    with pytest.raises(launch.HostsError, match="--np 1"):
        launch.command("none", "gloo", 2, [])
