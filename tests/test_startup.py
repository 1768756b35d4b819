"""A run's start-up: split into the host's phases and the ranks', recorded in every
record and printed by --profile-startup; the host never imports torch (the stack probe
answered from its cache); a rank imports no compiler it does not use."""
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lab.common import results
from lab.host.places import stack_cache
from lab.host.run.startup import HOST_PHASES, HostClock

REPO = Path(__file__).resolve().parent.parent
RANK_PHASES = ("launcher", "imports", "rendezvous", "data", "setup", "warmup")


def test_the_host_clock_splits_the_time_to_the_launch_into_consecutive_phases(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    monkeypatch.setattr("lab.host.run.startup.process_started_at", lambda: 99.5)
    clock = HostClock()
    assert clock.phases(101.0) is None             # never begun: bench as a library
    clock.begin()
    for phase, t in (("plan", 100.2), ("probe", 101.0), ("checks", 101.1)):
        now[0] = t
        clock.mark(phase)
    phases = clock.phases(101.5)
    assert list(phases) == list(HOST_PHASES)
    assert phases == pytest.approx({"interpreter": 0.5, "plan": 0.2, "runner": 0.0, "probe": 0.8,
                                    "checks": 0.1, "prepare": 0.4})
    assert sum(phases.values()) == pytest.approx(101.5 - 99.5)
    clock.restart(at=102.0)                        # a sweep's next launch starts from here
    now[0] = 102.3
    clock.mark("checks")
    assert clock.phases(102.5) == pytest.approx({"interpreter": 0, "plan": 0, "runner": 0, "probe": 0,
                                                 "checks": 0.3, "prepare": 0.2})


def test_the_stack_probe_is_cached_while_what_it_depends_on_is_unchanged(tmp_path, monkeypatch):
    monkeypatch.setenv(stack_cache.CACHE_ENV, str(tmp_path / "cache"))
    dep = tmp_path / "site-packages"
    dep.mkdir()
    calls = []

    def probe():
        calls.append(1)
        return {"torch": "2.x", "cores": 99, "depends_on": [str(dep)]}
    key = stack_cache.local_key(sys.executable)
    assert stack_cache.cached(key, probe)["torch"] == "2.x" and len(calls) == 1
    again = stack_cache.cached(key, probe)
    assert len(calls) == 1 and again["torch"] == "2.x"
    assert again["cores"] != 99                    # measured now, not cached
    (dep / "new-package").mkdir()                  # an installation changes the folder
    stack_cache.cached(key, probe)
    assert len(calls) == 2
    stack_cache.cached(key, probe)
    assert len(calls) == 2
    # Another interpreter, or other variables, is another key.
    assert stack_cache.local_key("/usr/bin/python3") != key
    assert stack_cache.local_key(sys.executable, {"PYTHONPATH": "/elsewhere"}) != key
    monkeypatch.setenv(stack_cache.CACHE_ENV, "off")
    stack_cache.cached(key, probe)
    assert len(calls) == 3


def test_the_real_probe_says_what_it_depends_on():
    cp = subprocess.run([sys.executable, "-m", "lab.worker.capabilities"], capture_output=True,
                        text=True, timeout=300, cwd=REPO)
    stack = json.loads(cp.stdout.strip().splitlines()[-1])
    deps = stack["depends_on"]
    assert os.path.realpath(sys.executable) in deps
    assert any(p.endswith(os.path.join("site-packages", "torch")) for p in deps), deps
    assert str(REPO) not in deps                   # editing the checkout is no new stack


# What `invoke bench` imports and runs on the host, as its task does: the plan, a real
# one-step run of local ranks (which import torch in their own processes), the table.
HOST_RUN = textwrap.dedent("""
    import sys
    from lab.host.run.bench import Terminated, terminate_as_interrupt
    from lab.host.request.plan import make_plan
    from lab.common.display import Display
    from lab.host.errors import BenchError
    from lab.host.run.sweep import run_request
    from lab.report.bench_output import render, startup_table
    import tasks
    plan = make_plan({"np": "1", "framework": "ddp", "max_steps": 1, "warmup_steps": 0,
                      "local": True, "results_dir": sys.argv[1]}, {"np": "2", "where": "auto"})
    outcome = run_request(plan, echo=lambda line: None)
    assert outcome.failed == 0, outcome.records
    render(outcome.records, outcome.run_dir)
    startup_table(outcome.records)
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "horovod", "torchvision",
                                                                 "deepspeed", "numpy"))
    print("HEAVY", " ".join(heavy))
""")


@pytest.mark.slow
def test_the_host_side_of_a_run_never_imports_torch(tmp_path):
    env = dict(os.environ, LAB_STACK_CACHE=str(tmp_path / "cache"))
    for _ in range(2):      # the stack probed, then answered from the cache
        cp = subprocess.run([sys.executable, "-c", HOST_RUN, str(tmp_path / "results")], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=300)
        assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-2000:]
        assert "HEAVY \n" in cp.stdout, cp.stdout[-500:]
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1


@pytest.mark.slow
def test_every_record_has_its_start_up_split_and_profile_startup_prints_it(tmp_path):
    env = dict(os.environ, LAB_STACK_CACHE=str(tmp_path / "cache"))
    t0 = time.time()
    # two combinations: a sweep, whose runner and stack are made once, before the first
    cp = subprocess.run([sys.executable, "-m", "invoke", "bench", "--local", "--np", "1",
                         "--framework", "ddp", "--compression", "none,fp16", "--max-steps", "1",
                         "--warmup-steps", "0", "--results-dir", str(tmp_path), "--run-id", "s",
                         "--profile-startup"],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    wall = time.time() - t0
    assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-2000:]
    r, second = results.read_records(tmp_path / "s" / results.RESULTS_FILE)[0]
    later = second["figures"]["startup_host_s"]
    assert later["runner"] == later["probe"] == later["interpreter"] == 0, later
    f = r["figures"]
    host, ranks = f["startup_host_s"], f["startup_phases_s"]
    assert list(host) == list(HOST_PHASES) and list(ranks) == list(RANK_PHASES)
    assert all(v is not None and v >= 0 for v in [*host.values(), *ranks.values()])
    # Consecutive spans: together they are the whole start-up, which the command's own
    # time (measured from outside, so a little longer) holds.
    assert sum(ranks.values()) == pytest.approx(f["startup_s"], abs=0.01)
    assert sum(host.values()) + sum(ranks.values()) == pytest.approx(f["startup_total_s"], abs=0.02)
    assert f["startup_total_s"] <= wall
    assert host["interpreter"] > 0 and ranks["imports"] > 0
    # the stack probe (cold: an empty cache, so it imports torch in a child) is the probe
    # phase's, not the runner's: the sweep probes before bench runs (on a GPU host 9.8 s
    # of it was once shown as "runner", with "probe" 0)
    assert host["probe"] > 0.3 and host["probe"] > 3 * host["runner"], host
    assert "start-up, seconds by phase" in cp.stdout
    assert "interpreter" in cp.stdout and "rendezvous" in cp.stdout


def test_a_rank_imports_no_compiler_it_does_not_use(tmp_path):
    """The optimizer's step, its bookkeeping and DDP's forward, as a DDP rank runs them,
    without torch._dynamo (lab.worker.lean); a run that compiles still can."""
    code = textwrap.dedent("""
        import os, sys, datetime
        import torch, torch.distributed as dist
        from lab.worker import lean
        lean.skip_compiler_import()
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1")
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
        model = torch.nn.Linear(4, 2)
        with lean.ddp_without_compiler():
            ddp = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.5)
        before = model.weight.detach().clone()
        for _ in range(2):
            opt.zero_grad()
            ddp(torch.ones(3, 4)).sum().backward()
            opt.step()
        opt.state_dict()
        assert not torch.equal(before, model.weight), "the step changed nothing"
        assert torch.is_grad_enabled()
        print("COMPILER", "torch._dynamo" in sys.modules)
        dist.destroy_process_group()
        import torch._dynamo  # compiling still works after it
        f = torch.compile(lambda x: x * 2, backend="eager")
        assert torch.equal(f(torch.ones(2)), torch.full((2,), 2.0))
        print("COMPILED")
    """)
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cp = subprocess.run([sys.executable, "-c", code, str(port)], cwd=REPO, capture_output=True,
                        text=True, timeout=300)
    assert cp.returncode == 0, cp.stderr[-2000:]
    assert "COMPILER False" in cp.stdout and "COMPILED" in cp.stdout


def test_the_manifest_is_measured_once_per_run_folder(tmp_path, monkeypatch):
    from lab.worker import manifest
    calls = []

    def measure(hosts):
        calls.append(hosts)
        return {"hosts": hosts, "cpu_model": "x", "torch": "2.x"}
    monkeypatch.setattr(manifest, "measure", measure)
    first = manifest.collect(["a"], tmp_path)
    second = manifest.collect(["a", "a"], tmp_path)
    assert len(calls) == 1 and second == {**first, "hosts": ["a", "a"]}
    manifest.collect(["a"], tmp_path / "another-run")
    assert len(calls) == 2
    assert manifest.collect(["a"]) and len(calls) == 3     # no folder: measured


RANK_SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    env = {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                      "MASTER_ADDR", "MASTER_PORT")}
    os.write(1, f"ENV {sorted(env.items())}\\n".encode())    # one write: the lines never mix
    if sys.argv[1] == "kill" and env["RANK"] == "1":
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    if sys.argv[1] == "kill":
        time.sleep(60)      # a peer left waiting: the launcher ends it
""")


def test_the_local_ddp_launcher_gives_each_rank_its_place_and_ends_a_job_on_the_first_failure():
    from lab.host.watch.launcher_output import StreamWatches
    ok = subprocess.run([sys.executable, "-m", "lab.host.launchers.local", "--nproc-per-node=2",
                         sys.executable, "-c", RANK_SCRIPT, "ok"], cwd=REPO, capture_output=True,
                        text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    envs = sorted(line for line in ok.stdout.splitlines() if line.startswith("ENV"))
    assert len(envs) == 2 and "('RANK', '0')" in envs[0] and "('RANK', '1')" in envs[1]
    assert all("('WORLD_SIZE', '2')" in e and "('MASTER_ADDR', '127.0.0.1')" in e for e in envs)
    t0 = time.monotonic()
    cp = subprocess.run([sys.executable, "-m", "lab.host.launchers.local", "--nproc-per-node=2",
                         sys.executable, "-c", RANK_SCRIPT, "kill"], cwd=REPO, capture_output=True,
                        text=True, timeout=60)
    assert cp.returncode == 1 and time.monotonic() - t0 < 30
    watch = StreamWatches(lambda line: None)
    for line in cp.stderr.splitlines():             # read as bench reads torchrun's report
        watch.line(line)
    watch.close()
    assert (watch.first.rank, watch.first.signal) == (1, 9), cp.stderr


def test_local_runs_start_no_launcher_that_imports_torch(tmp_path):
    from lab.host.places.base import Launch
    from lab.host.places.local import LocalRunner
    r = LocalRunner(str(tmp_path))
    (ddp,) = r.commands(Launch("ddp", "gloo", 2, ("--max-steps", "3"))).values()
    assert ddp[1:4] == ["-m", "lab.host.launchers.local", "--nproc-per-node=2"]
    r._stack = {"horovod": {"gloo": True, "mpi": False}}     # as probe_stack leaves it
    (hvd,) = r.commands(Launch("horovod", "gloo", 2, ())).values()
    assert hvd[1:4] == ["-m", "lab.host.launchers.horovod", "--built=gloo"] and "--gloo" in hvd
    code = ("import sys; import lab.host.launchers.local, lab.host.launchers.horovod; "
            "print('torch' in sys.modules); "
            "print(sorted(m for m in sys.modules if m.startswith(('lab', 'envcheck'))))")
    cp = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                        timeout=60)
    torch, kit = cp.stdout.splitlines()
    assert torch == "False", cp.stderr
    # nothing of the kit but the launchers themselves before the ranks start (not the
    # places' registry, which imports Docker's and the images' modules)
    assert kit == str(["lab", "lab.host", "lab.host.launchers", "lab.host.launchers.horovod",
                       "lab.host.launchers.local"]), kit
