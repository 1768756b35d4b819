"""What bench refuses before launching anything, and why. The `stack` dicts are what
lab.worker.capabilities reports; the GPU ones stand in for a GPU machine, which this
machine is not."""
import subprocess
import sys

import pytest

from lab.host.errors import BenchError
from lab.host.places.launch import resolve_framework
from lab.host.request.checks import check_request, parse_np
from lab.host.settings import BenchSettings

CPU_STACK = {"torch": "2.13.0", "cuda_available": False, "gpus": 0,
             "ddp_backends": {"gloo": True, "mpi": False, "nccl": True},
             "horovod": {"gloo": True, "mpi": True, "nccl": False}, "torchvision": "0.28.0"}


def test_parse_np():
    assert parse_np("2") == [2]
    assert parse_np("1, 2,4,2") == [1, 2, 4]
    assert parse_np(3) == [3]
    for bad, msg in (("0", "at least 1"), ("two", "whole numbers"), ("1,,2", "whole numbers")):
        with pytest.raises(BenchError, match=msg):
            parse_np(bad)


def test_auto_falls_back_to_ddp_and_says_so():
    stack = {k: v for k, v in CPU_STACK.items() if k != "horovod"}
    fw, note = resolve_framework("auto", stack)
    assert fw == "ddp" and "Horovod is not installed" in note
    assert resolve_framework("auto", CPU_STACK) == ("horovod", None)


@pytest.mark.parametrize("settings,stack_change,message", [
    (dict(backend="nccl"), {}, "add --device cuda"),
    (dict(backend="nccl", device="cuda"), {}, "torch sees no GPU"),
    (dict(backend="nccl", device="cuda", np=[4], framework="ddp"),
     {"cuda_available": True, "gpus": 2}, "puts 4 ranks on this host"),
    (dict(backend="nccl", device="cuda", np=[4], nodes=2, framework="ddp"),
     {"cuda_available": True, "gpus": 1}, "puts 2 ranks on each of the 2 nodes"),
    (dict(framework="horovod", backend="nccl", device="cuda"),
     {"cuda_available": True, "gpus": 2}, "built without nccl"),
    (dict(framework="ddp", backend="mpi"), {}, "no MPI back end"),
    (dict(framework="none", np=[2]), {}, "runs one process"),
    (dict(backend="tcp"), {}, "choose one of gloo, mpi, nccl"),
    (dict(framework="horovod"), {"horovod": None}, "Horovod is not installed"),
    (dict(), {"torch": None, "torch_error": "ModuleNotFoundError: torch"}, "pip install -e"),
])
def test_refusals_name_the_fix(settings, stack_change, message):
    stack = dict(CPU_STACK, **stack_change)
    stack = {k: v for k, v in stack.items() if v is not None}
    with pytest.raises(BenchError, match=message):
        check_request(BenchSettings(**{"np": [1], **settings}), stack)


def test_cli_bad_input_is_one_line_without_traceback(tmp_path):
    for args, expected in ((["--np", "0"], "--np must be at least 1"),
                           (["--backend", "nccl"], "nccl back end runs on GPUs only"),
                           (["--epochs", "x"], "--epochs takes a whole number")):
        cp = subprocess.run([sys.executable, "-m", "invoke", "bench", *args,
                             "--results-dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
        assert cp.returncode == 2, cp.stderr
        assert expected in cp.stderr and "Traceback" not in cp.stderr
        assert len(cp.stderr.strip().splitlines()) == 1


def test_flags_win_over_invoke_yaml_and_the_run_defaults_are_runconfigs():
    from lab.common.config import RunConfig
    from lab.host.request.checks import settings_from_flags
    defaults = {"np": "2", "timeout_s": 3600, "where": "auto", "epochs": 3}
    s, lists = settings_from_flags({"np": "1,4", "backend": "gloo,mpi", "epochs": None,
                                    "local": True}, defaults)
    assert s.np == [1, 4] and s.epochs == 3 and s.timeout_s == 3600.0 and s.where == "local"
    assert lists["backend"] == ["gloo", "mpi"] and s.batch_size == RunConfig().batch_size
    s, _ = settings_from_flags({"image": "dl-lab-kit:cpu"}, defaults)
    assert s.np == [2] and s.where == "image" and s.image == "dl-lab-kit:cpu"
    with pytest.raises(BenchError, match="--timeout-s takes a number"):
        settings_from_flags({"timeout_s": "soon"}, defaults)


def test_up_and_doctor_refuse_a_count_that_is_not_a_number_in_one_line():
    for args in (["up", "--nodes", "abc"], ["doctor", "--np", "abc"]):
        cp = subprocess.run([sys.executable, "-m", "invoke", *args], capture_output=True,
                            text=True, timeout=120)
        assert cp.returncode == 2, cp.stderr
        assert "takes a whole number" in cp.stderr and "Traceback" not in cp.stderr


def test_a_run_without_a_timed_step_or_a_batch_is_refused_before_launch():
    from lab.common.config import ConfigError, RunConfig
    # The README's ResNet-50 example: synthetic data is cycled, so 20 steps run.
    cfg = RunConfig(model="resnet50", batch_size=16, max_steps=20)
    assert cfg.steps_per_epoch(cfg.train_size(), 2) == 20
    cfg.check_timing(cfg.train_size(), 2)
    with pytest.raises(ConfigError, match="--warmup-steps 5 leaves none to time"):
        RunConfig(max_steps=5).check_timing(RunConfig(max_steps=5).train_size(), 2)
    digits = RunConfig(data="digits", batch_size=100000)
    with pytest.raises(ConfigError, match="fewer than one batch of 100000"):
        digits.check_timing(digits.train_size(), 2)
    for bad in ("1", "1:2:3", "a:2", "1:2:explode"):
        with pytest.raises(ConfigError, match="--fault takes RANK:STEP"):
            RunConfig(fault=bad).check()
    assert RunConfig(fault="1:3:kill").fault_plan() == (1, 3, "kill")


@pytest.mark.parametrize("args,expected", [
    (["--timeout-s", "-1"], "--timeout-s is seconds per run, 0 for no limit"),
    (["--run-id", "../../../tmp/x"], "--run-id names a folder inside --results-dir"),
    (["--max-steps", "5"], "leaves none to time"),
    (["--data", "digits", "--batch-size", "100000"], "fewer than one batch"),
    (["--fault", "1"], "--fault takes RANK:STEP"),
    # each refused before any rank starts (issue 22's bad inputs)
    (["--np", "1", "--fault", "5:3"], "names rank 5, but 1 process(es) have ranks 0 to 0"),
    (["--np", "1", "--fault", "0:500", "--max-steps", "20"], "fails at step 500, but"),
    (["--np", "9", "--strategy", "pipeline"], "mnist can be cut into at most 4 pipeline stages"),
    (["--np", "4", "--strategy", "pipeline", "--model", "lstm"], "lstm can be cut into at most 3"),
])
def test_cli_refuses_what_would_fail_inside_the_ranks(tmp_path, args, expected):
    cp = subprocess.run([sys.executable, "-m", "invoke", "bench", "--local", "--framework", "ddp",
                         *args, "--results-dir", str(tmp_path)],
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 2, cp.stdout[-2000:] + cp.stderr
    assert expected in cp.stderr and "Traceback" not in cp.stderr
    assert "== ddp" not in cp.stdout            # no rank was started
    assert not list(tmp_path.glob("*/results.jsonl"))


def test_a_corrupt_mnist_file_is_found_before_launch(tmp_path, mnist_like):
    import shutil
    data = tmp_path / "data"
    shutil.copytree(mnist_like, data)
    bad = data / "train-labels-idx1-ubyte.gz"
    bad.write_bytes(bad.read_bytes()[:40])          # cut short, as an interrupted copy
    cp = subprocess.run([sys.executable, "-m", "invoke", "bench", "--local", "--framework", "ddp",
                         "--data", "mnist", "--data-dir", str(data), "--results-dir",
                         str(tmp_path / "res")], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 2, cp.stdout[-2000:] + cp.stderr
    assert "train-labels-idx1-ubyte.gz is not a usable MNIST file" in cp.stderr
    assert "== ddp" not in cp.stdout and len(cp.stderr.strip().splitlines()) == 1


def test_an_unusable_results_folder_is_one_sentence(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    for where in (afile, afile / "below"):
        cp = subprocess.run([sys.executable, "-m", "invoke", "bench", "--local", "--framework", "ddp",
                             "--results-dir", str(where)], capture_output=True, text=True, timeout=120)
        assert cp.returncode == 2, cp.stderr
        assert f"--results-dir {where}" in cp.stderr and "Traceback" not in cp.stderr
        assert f"{afile} is a file, not a folder" in cp.stderr and "left as it is" in cp.stderr
        assert len(cp.stderr.strip().splitlines()) == 1
        assert afile.read_text() == "not a folder" and list(tmp_path.iterdir()) == [afile]


def test_open_mpi_yields_on_cpu_runs_only_and_a_users_value_wins(monkeypatch):
    from lab.host.places.launch import YIELD_WHEN_IDLE, job_env
    monkeypatch.delenv(YIELD_WHEN_IDLE, raising=False)
    assert job_env(BenchSettings(np=[2], device="cpu"))[YIELD_WHEN_IDLE] == "1"
    assert YIELD_WHEN_IDLE not in job_env(BenchSettings(np=[2], device="cuda"))
    monkeypatch.setenv(YIELD_WHEN_IDLE, "0")
    assert job_env(BenchSettings(np=[2], device="cpu"))[YIELD_WHEN_IDLE] == "0"
    monkeypatch.setenv(YIELD_WHEN_IDLE, "1")
    assert job_env(BenchSettings(np=[2], device="cuda"))[YIELD_WHEN_IDLE] == "1"


def test_gpus_are_counted_per_node_on_the_cluster():
    """compose.gpu.yaml gives each node its own GPU: 2 ranks over 2 nodes need 1 each."""
    stack = dict(CPU_STACK, cuda_available=True, gpus=1,
                 horovod={"gloo": True, "mpi": True, "nccl": True})
    for framework, backend in (("ddp", "nccl"), ("horovod", "nccl")):
        s = BenchSettings(np=[2], nodes=2, device="cuda", framework=framework, backend=backend)
        assert check_request(s, stack)[0] == framework


def test_every_bench_flag_is_shown_under_its_own_name():
    """invoke gives each flag a one-letter form while letters last; with 27 flags
    --micro-batches was shown as `--=STRING`: bench has long flags only."""
    cp = subprocess.run([sys.executable, "-m", "invoke", "bench", "--help"], capture_output=True, text=True,
                        timeout=120)
    assert cp.returncode == 0 and "--micro-batches=STRING" in cp.stdout
    assert "--=" not in cp.stdout


def test_resnet50_runs_where_torchvision_does_not_import():
    """The ranks build ResNet-50 from torch.nn there (lab/models/resnet50/net.py): no refusal."""
    stack = {k: v for k, v in CPU_STACK.items() if k != "torchvision"}
    stack["torchvision_error"] = "RuntimeError: operator torchvision::nms does not exist"
    assert check_request(BenchSettings(np=[1], model="resnet50", framework="ddp"), stack)[0] == "ddp"


@pytest.mark.parametrize("package,refused", [("json", False), ("no_such_package_for_a_toy", True)])
def test_a_model_that_needs_a_package_is_refused_where_it_does_not_import(monkeypatch, package, refused):
    """ModelSpec.needs: the ranks' probe (lab.worker.capabilities, run here) imports what a
    registered model needs, and the host refuses the model in one sentence where it does
    not import. A toy model registered as a model folder would register it."""
    from lab import models
    from lab.common import config
    from lab.worker import capabilities
    toy = models.ModelSpec("toy", "a toy", synthetic=(1, 28, 10), most_stages=2, needs=(package,))
    monkeypatch.setitem(models._SPECS, "toy", toy)
    monkeypatch.setattr(config, "MODELS", models.names())
    stack = capabilities.collect()
    assert (f"{package}_error" in stack) == refused and (package in stack) != refused
    s = BenchSettings(np=[1], model="toy", framework="ddp")
    if refused:
        with pytest.raises(BenchError, match=rf"--model toy needs {package}, which does not import "
                                             rf"here \(ModuleNotFoundError: No module named"):
            check_request(s, stack)
    else:
        assert check_request(s, stack)[0] == "ddp"


@pytest.mark.parametrize("backends", ["nccl", "gloo,nccl"])
def test_gpu_counts_that_fit_run_and_the_rest_are_skipped_with_the_reason(tmp_path, monkeypatch, backends):
    """`invoke bench --np 1,2,4 --device cuda` on a stack of two GPUs: np 1 and 2 go to the
    launch (every repeat), np 4 is one skipped record with the reason; one combination
    (bench's path) and a sweep of two (the sweep's) alike. The launch is replaced: this
    machine has no GPU for real CUDA ranks."""
    from lab.common import results
    from lab.host.request.plan import make_plan
    from lab.host.run import bench, sweep
    two_gpus = dict(CPU_STACK, cuda_available=True, gpus=2)
    monkeypatch.setattr(bench, "probe_stack", lambda runner=None: two_gpus)
    monkeypatch.setattr(sweep, "probe_stack", lambda runner=None: two_gpus)
    launched = []
    monkeypatch.setattr(bench, "run_one", lambda s, cfg, np, *a, **k: launched.append((s.backend, np)) or 0)
    lines = []
    plan = make_plan({"np": "1,2,4", "device": "cuda", "framework": "ddp", "backend": backends,
                      "local": True, "data": "synthetic", "repeat": 2, "ceiling": False,
                      "results_dir": str(tmp_path), "run_id": "gpus"}, {})
    sweep.run_request(plan, echo=lines.append)
    per = backends.split(",")
    assert sorted(launched) == sorted((b, n) for b in per for n in (1, 2, 1, 2))
    recs = results.read_records(tmp_path / "gpus" / results.RESULTS_FILE)[0]
    skipped = [r for r in recs if r["status"] == "skipped"]
    assert sorted((r["config"]["backend"], r["world"]["np"]) for r in skipped) == [(b, 4) for b in per]
    assert all("--np 4 puts 4 ranks on this host, each needing a GPU of its own, and torch sees 2"
               in r["error"]["reason"] for r in skipped)
    assert sum("-- skipped ddp over" in x and "(np 4)" in x for x in lines) == len(per), lines


def test_a_request_none_of_whose_counts_fit_the_gpus_is_refused():
    stack = dict(CPU_STACK, cuda_available=True, gpus=1)
    with pytest.raises(BenchError, match="--np 4 puts 4 ranks on this host"):
        check_request(BenchSettings(np=[2, 4], device="cuda", framework="ddp"), stack)
    assert check_request(BenchSettings(np=[1, 2, 4], device="cuda", framework="ddp"), stack)[0] == "ddp"
