"""`bench --hosts` / `--hostfile`, the pure parts: hostfiles in mpirun's format, slots
against --np, the stacks of the hosts compared, and the ssh commands of a DDP launch.
The launch itself runs for real from node1 of the simulated cluster
(tests/test_cluster.py::test_bench_on_a_list_of_hosts_runs_from_the_first_over_ssh)."""
import shlex
import socket
import types

import pytest

from lab.host import places
from lab.host.places import this_machine
from lab.host.places.hosts import (
    check_first_host,
    check_hosts,
    check_slots,
    ddp_commands,
    host_list,
    parse_hostfile,
    remote,
    rendezvous_port,
    stack_mismatches,
)
from lab.host.places.launch import Host, HostsError


def test_hostfiles_in_mpiruns_format():
    text = "# two servers\nnode1 slots=4\n\nnode2 slots=2 max_slots=8  # the small one\nnode3\n"
    assert parse_hostfile(text) == [Host("node1", 4), Host("node2", 2), Host("node3", 1)]


@pytest.mark.parametrize("text,words", [
    ("node1 slots=four\n", "line 1 of the hostfile: slots must be a whole number"),
    ("node1 cpus=4\n", "'cpus=4' is not understood"),
    ("node1\nnode1\n", "listed twice"),
    ("# nothing\n", "names no host"),
])
def test_bad_hostfiles_are_one_sentence(text, words):
    with pytest.raises(HostsError, match=words):
        parse_hostfile(text)


def test_a_hostfile_that_cannot_be_read_is_one_sentence(tmp_path):
    binary = tmp_path / "hosts.bin"
    binary.write_bytes(b"\xff\xfenode1 slots=2\n")
    for path, why in ((binary, "not text"), (tmp_path / "none", "No such file")):
        with pytest.raises(HostsError, match=rf"--hostfile {path} cannot be read \({why}.*node1 slots=4"):
            host_list(types.SimpleNamespace(hosts="", hostfile=str(path)))


def test_slots_must_add_up_to_np():
    check_slots([Host("a", 2), Host("b", 2)], [4])
    with pytest.raises(HostsError, match=r"offer 4 slot\(s\) \(a:2,b:2\) and --np is 2: give --np 4"):
        check_slots([Host("a", 2), Host("b", 2)], [4, 2])


def test_the_stacks_are_compared_naming_the_host():
    ref = {"kit": "0.1.0", "python": "3.11.2", "torch": "2.13.0", "horovod": {"version": "0.28.1"},
           "mpi_version": "mpirun (Open MPI) 4.1.4"}
    other = {**ref, "horovod": {"version": "0.27.0"}, "mpi_version": None}
    assert stack_mismatches({"h1": ref, "h2": dict(ref)}) == []
    assert stack_mismatches({"h1": ref, "h2": other}) == [
        "host h2 has Horovod 0.27.0 and h1 has 0.28.1",
        "host h2 has MPI missing and h1 has mpirun (Open MPI) 4.1.4"]


def test_ddp_runs_one_torchrun_per_host_over_ssh_with_rank_0_on_the_first():
    cmds = ddp_commands([Host("a", 2), Host("b", 1)], ["--max-steps", "5"], "/opt/v/bin/python",
                        {"OMP_NUM_THREADS": "1", "PYTHONPATH": "/src dir"}, port=29612)
    assert list(cmds) == ["a", "b"]
    ssh, remote_line = cmds["b"][:-1], cmds["b"][-1]
    assert ssh == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "b"]
    words = shlex.split(remote_line)
    assert words[:6] == ["cd", "/tmp", "&&", "exec", "env", "OMP_NUM_THREADS=1"]
    assert "PYTHONPATH=/src dir" in words
    assert words[words.index("/opt/v/bin/python"):] == [
        "/opt/v/bin/python", "-m", "torch.distributed.run", "--nproc-per-node=1", "--nnodes=2",
        "--node-rank=1", "--master-addr=a", "--master-port=29612", "-m", "lab.worker.train",
        "--max-steps", "5"]
    assert "--nproc-per-node=2" in shlex.split(cmds["a"][-1])
    assert remote("h", ["true"]) == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "h",
                                     "cd /tmp && exec true"]


def test_the_rendezvous_is_named_as_the_hosts_reach_it():
    check_hosts([Host("localhost", 2)])                        # one host: fine
    with pytest.raises(HostsError, match="localhost means a different machine on each host"):
        check_hosts([Host("localhost", 1), Host("b", 1)])
    ports = {rendezvous_port(f"run{i}/000-ddp") for i in range(50)}
    assert min(ports) >= 29500 and max(ports) < 30000 and len(ports) > 40
    assert rendezvous_port("r/a") == rendezvous_port("r/a")


@pytest.fixture
def machine(monkeypatch):
    """This machine as `box` (box.lab, 10.0.0.5), an ssh alias `me` for it and a server
    `far` (10.0.0.9), nothing resolved or asked of ssh for real."""
    monkeypatch.setattr(this_machine, "this_machine", lambda: {"box", "box.lab", "10.0.0.5", "localhost"})
    monkeypatch.setattr(this_machine, "ssh_hostname", lambda h: {"me": "box.lab"}.get(h, h))
    monkeypatch.setattr(this_machine, "addresses", lambda n: {"box.lab": {"10.0.0.5"}, "far": {"10.0.0.9"},
                                                              "loop": {"127.0.1.1"}}.get(n, set()))


@pytest.mark.parametrize("first", ["box", "BOX.lab", "10.0.0.5", "me", "loop", "localhost"])
def test_the_first_host_may_be_this_machine_by_any_of_its_names(machine, first):
    check_first_host([Host(first, 1), Host("far", 1)])


@pytest.mark.parametrize("first", ["far", "10.0.0.9", "elsewhere"])
def test_a_first_host_that_is_not_this_machine_is_refused_in_one_sentence(machine, first):
    """Rank 0 would write the record on the first host, and bench reads it here."""
    with pytest.raises(HostsError, match=f"^rank 0 runs on the first host, {first}, .* this "
                                         f"machine is not {first}: run bench on {first}") as e:
        check_first_host([Host(first, 1), Host("box", 1)])
    assert "\n" not in str(e.value)


def test_hosts_naming_another_machine_first_are_refused_before_any_rank(tmp_path, monkeypatch):
    """For real: this machine's own names and addresses, no fakes; nothing is started
    (no ssh to the host, no run folder)."""
    from lab.common import proc
    from lab.host.places.base import RunnerError
    from lab.host.request.checks import settings_from_flags
    started = []
    real_start = proc.start
    monkeypatch.setattr(proc, "start", lambda argv, **kw: (started.append(argv), real_start(argv, **kw))[1])
    s, lists = settings_from_flags({"np": "2", "hosts": "not-this-machine.invalid:2",
                                    "results_dir": str(tmp_path)}, {"where": "auto"})
    with pytest.raises(RunnerError, match="this machine is not not-this-machine.invalid"):
        places.for_request(s, sweep=lists)
    assert all(argv[:2] == ["ssh", "-G"] for argv in started), started     # only ssh's config read
    assert list(tmp_path.iterdir()) == []
    here = socket.gethostname()
    s, lists = settings_from_flags({"np": "2", "hosts": f"{here}:1,not-this-machine.invalid:1",
                                    "results_dir": str(tmp_path)}, {"where": "auto"})
    assert places.for_request(s, sweep=lists)[0].nodes == 2
