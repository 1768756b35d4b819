"""`invoke acceptance`: its plan on faked 1-, 4- and 8-GPU hosts (the dry run and its
estimate), the image check before anything runs, the GPU count (NVML, nvidia-smi,
CUDA_VISIBLE_DEVICES), a run whose doctor fails or times out, the nccl-tests figures in
the archive, and the CPU equivalent. What cannot exist here is faked: NVML (a pynvml
module), nvidia-smi and all_reduce_perf (their real captured outputs, tests/fixtures),
and the Docker engine's image lookup (conftest's engine_with). The plan's commands are
the kit's own; what they do is tested where each command is."""
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from envcheck.gpu import probe_gpus
from lab.common import versions
from lab.host.places import image as container
from lab.host.suites import acceptance, acceptance_plan, estimate
from lab.host.suites import gpus as gpu_count
from tests.conftest import REPO, FakeImage

FIX = Path(__file__).parent / "fixtures"
IMAGES = {"nccl": "dl-lab-kit:gpu-nccl", "mpi": "dl-lab-kit:gpu-mpi"}
# The driver and GPUs of tests/fixtures/nvidia-smi-8x-h100.txt (8 H100, driver 550.90.07).
DRIVER = "550.90.07"


def _flags(step):
    a = step.argv
    return {a[i]: a[i + 1] for i in range(len(a) - 1) if a[i].startswith("--")}


def fake_nvml(monkeypatch, count, fail_init=False):
    """pynvml as nvidia-ml-py names its calls, for a host with `count` GPUs."""
    nvml = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def init():
        if fail_init:
            raise NVMLError("Driver Not Loaded")
    nvml.NVMLError = NVMLError
    nvml.nvmlInit, nvml.nvmlShutdown = init, lambda: None
    nvml.nvmlDeviceGetCount = lambda: count
    nvml.nvmlSystemGetDriverVersion = lambda: DRIVER
    # each GPU as nvidia-smi-8x-h100.txt shows them (compute capability 9.0 from NVIDIA's
    # table of compute capabilities: H100)
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetName = lambda h: "NVIDIA H100 80GB HBM3"
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=81559 * 2**20)
    nvml.nvmlDeviceGetCudaComputeCapability = lambda h: (9, 0)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)


@pytest.fixture
def gpu_host(monkeypatch, engine_with):
    """A host with N GPUs of compute capability 9.0 and an engine with the given images."""
    from lab.host.images import choice as image_choice

    def make(n, images=tuple(IMAGES.values()), capability="9.0"):
        fake_nvml(monkeypatch, n)
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        monkeypatch.setattr(image_choice, "host_gpu_driver", lambda: None)
        archs = versions.read()["CUDA_13_0_ARCHS"]
        engine_with({t: FakeImage(t, archs) for t in images}, [capability] * n)
    return make


def dry_run(tmp_path, full=False):
    lines = []
    assert acceptance.run(str(tmp_path), full=full, dry_run=True, echo=lines.append) is None
    assert list(tmp_path.iterdir()) == []           # a dry run writes nothing
    return "\n".join(lines)


def test_process_counts_are_powers_of_two_and_n_or_every_count_in_full():
    assert acceptance_plan.process_counts(1) == [1]
    assert acceptance_plan.process_counts(4) == [1, 2, 4]
    assert acceptance_plan.process_counts(6) == [1, 2, 4, 6]
    assert acceptance_plan.process_counts(8) == [1, 2, 4, 8]
    assert acceptance_plan.process_counts(6, full=True) == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("gpus", [1, 4, 8])
def test_the_dry_run_of_a_faked_host_prints_every_launch_its_image_and_at_most_45_minutes(
        gpus, gpu_host, tmp_path):
    gpu_host(gpus)
    text = dry_run(tmp_path)
    assert text.startswith(f"acceptance plan: GPU mode, {gpus} GPU(s) (NVML, driver {DRIVER})")
    plan = acceptance_plan.plan(gpus, "/x", images=IMAGES)
    shown = re.sub(r"\S+/acceptance-\d{8}-\d{6}", "/x", text)
    for step in plan.steps:
        assert "$ " + " ".join(step.argv) in shown
        assert not step.image or f"{step.name}: {step.what}\n    image: {step.image};" in shown
    per_step = [float(m) for m in re.findall(r"about ([\d.]+) min", text)]
    total = float(re.search(r"estimated total: ([\d.]+) min", text).group(1))
    assert len(per_step) == len(plan.steps) and total == pytest.approx(sum(per_step), abs=0.1 * len(per_step))
    assert 0 < total <= acceptance_plan.BUDGET_MIN == 45
    assert "missing, so it would not start" not in text
    full = float(re.search(r"estimated total: ([\d.]+) min", dry_run(tmp_path, full=True)).group(1))
    assert full > total


def test_full_runs_every_count_three_times_and_longer():
    short = {s.name: _flags(s) for s in acceptance_plan.plan(6, "/x", images=IMAGES).steps}
    full = {s.name: _flags(s) for s in acceptance_plan.plan(6, "/x", full=True, images=IMAGES).steps}
    assert short["resnet50-ddp-nccl"]["--np"] == "1,2,4,6" and short["resnet50-ddp-nccl"]["--repeat"] == "2"
    assert full["resnet50-ddp-nccl"]["--np"] == "1,2,3,4,5,6" and full["resnet50-ddp-nccl"]["--repeat"] == "3"
    assert int(full["resnet50-ddp-nccl"]["--max-steps"]) > int(short["resnet50-ddp-nccl"]["--max-steps"])
    assert full["nccl-tests"]["--counts"] == "1,2,3,4,5,6"


def test_each_row_runs_in_the_image_of_its_gpu_operations():
    """Horovod's MPI GPU operations only in the gpu-mpi image, every NCCL row in gpu-nccl;
    the image is passed to bench (--image), not left to its choice."""
    plan = acceptance_plan.plan(8, "/tmp/acc", images=IMAGES)
    names = [s.name for s in plan.steps]
    assert names[0] == "doctor" and names[1] == "nccl-tests" and names[-1] == "report"
    benches = {s.name: (s, _flags(s)) for s in plan.steps if "bench" in s.argv}
    for model in ("mnist", "resnet50"):
        for fw, be in (("horovod", "nccl"), ("horovod", "mpi"), ("ddp", "nccl")):
            s, f = benches[f"{model}-{fw}-{be}"]
            assert (f["--model"], f["--framework"], f["--backend"], f["--device"]) == (model, fw, be, "cuda")
            assert f["--image"] == s.image == IMAGES["mpi" if be == "mpi" else "nccl"]
            assert f["--np"] == "1,2,4,8" and f["--results-dir"] == "/tmp/acc/results"
    mpi_rows = [s for s, f in benches.values() if f["--image"] == IMAGES["mpi"]]
    assert [(_flags(s)["--framework"], _flags(s)["--backend"]) for s in mpi_rows] == [("horovod", "mpi")] * 2
    assert _flags(plan.steps[1])["--image"] == IMAGES["nccl"]
    assert benches["strategies"][1]["--strategy"] == "ddp,zero1,fsdp,deepspeed"


def test_missing_images_are_named_with_the_exact_build_command_and_nothing_runs(gpu_host, tmp_path):
    gpu_host(4, images=[IMAGES["nccl"]])
    text = dry_run(tmp_path)
    assert ("missing, so it would not start:\n  - dl-lab-kit:gpu-mpi is not built (`invoke build "
            "--flavor gpu --gpu-ops MPI`)") in text
    with pytest.raises(acceptance.AcceptanceError, match=r"ran nothing: dl-lab-kit:gpu-mpi is not built "
                       r"\(`invoke build --flavor gpu --gpu-ops MPI`\)$") as e:
        acceptance.run(str(tmp_path), echo=lambda line: None)
    assert "gpu-nccl" not in str(e.value) and list(tmp_path.iterdir()) == []


def _no_engine(monkeypatch):
    from lab.common import docker_api

    def unreachable(*a, **k):
        raise docker_api.DockerUnavailable("no Docker engine is reachable (ConnectionError)")
    monkeypatch.setattr(docker_api, "client", unreachable)


@pytest.mark.parametrize("how", ["no engine", "--local"])
def test_without_docker_or_with_local_the_same_plan_runs_as_local_processes(gpu_host, monkeypatch, tmp_path, how):
    gpu_host(2)
    if how == "no engine":
        _no_engine(monkeypatch)
    monkeypatch.setattr(acceptance, "host_has", lambda tool: tool == "horovod")
    lines = []
    assert acceptance.run(str(tmp_path), dry_run=True, echo=lines.append, local=how == "--local") is None
    text = "\n".join(lines)
    head = text.splitlines()[0]
    assert head.startswith(f"acceptance plan: GPU mode, 2 GPU(s) (NVML, driver {DRIVER})")
    assert head.endswith("local processes on this host's own stack (what docker/setup-venv.sh "
                         "installs), not the lab images")
    assert ("no Docker engine here (no Docker engine is reachable (ConnectionError))" in head) == (how == "no engine")
    assert "missing, so it would not start" not in text and "dl-lab-kit:gpu" not in text
    plan = acceptance_plan.plan(2, "/x", images=IMAGES)
    local = acceptance_plan.plan(2, "/x", local=True, has=lambda tool: tool == "horovod")
    # the same bench steps, each with --local where the image plan names its image
    assert [s.name for s in local.steps] == [s.name for s in plan.steps if s.name != "nccl-tests"]
    for mine, theirs in zip((s for s in local.steps if "bench" in s.argv), (s for s in plan.steps if "bench" in s.argv)):
        i = theirs.argv.index("--image")
        assert mine.argv == theirs.argv[:i] + ["--local"] + theirs.argv[i + 2:]
    assert any(m.startswith("nccl-tests: nccl-tests' all_reduce_perf is not installed on this host's "
                            "stack; docker/install-nccl-tests.sh") for m in local.missing)
    bare = acceptance_plan.plan(1, "/x", local=True, has=lambda tool: False)
    assert not any("horovod" in s.argv for s in bare.steps)
    assert any("mnist-horovod-nccl, mnist-horovod-mpi, resnet50-horovod-nccl, resnet50-horovod-mpi: "
               "Horovod is not installed on this host's stack; docker/install-horovod.sh builds it "
               "(about 2.5 min on 16 cores)" in m for m in bare.missing)


def test_the_estimate_has_both_ends_the_fast_one_measured_on_an_h100():
    p = acceptance_plan.plan(1, "/x", images=IMAGES)
    assert 0 < p.fast_s < p.estimate_s <= acceptance_plan.BUDGET_MIN * 60
    assert estimate.GPU["fast"].step_s["resnet50"][0] == pytest.approx(64 / 851)   # 851 img/s, strict fp32
    assert "min at an H100's measured speed" in acceptance_plan.render(p)


@pytest.mark.slow
def test_the_no_docker_plan_runs_end_to_end_here_with_real_ranks(monkeypatch, tmp_path):
    """No GPU, no engine: the CPU plan as local processes, cut to one short bench step
    and the report; real ranks, the archive and its SUMMARY saying where they ran."""
    fake_nvml(monkeypatch, 0)
    _no_engine(monkeypatch)
    real = acceptance.make_plan

    def small(out, full=False, environ=None, local=False):
        plan, missing, count = real(out, full, environ, local)
        plan.steps = [s for s in plan.steps if s.name in ("mnist-ddp-gloo", "report")]
        a = plan.steps[0].argv
        for flag, value in (("--repeat", "1"), ("--max-steps", "6"), ("--warmup-steps", "2")):
            a[a.index(flag) + 1] = value
        return plan, missing, count
    monkeypatch.setattr(acceptance, "make_plan", small)
    lines = []
    archive = acceptance.run(str(tmp_path), echo=lines.append)
    [folder] = [p for p in tmp_path.iterdir() if p.is_dir()]
    text = (folder / "SUMMARY.md").read_text()
    assert text.splitlines()[0].startswith("# dl-lab-kit acceptance: CPU mode (no GPU on this machine")
    assert "local processes on this host's own stack (what docker/setup-venv.sh installs)" in text.splitlines()[0]
    measured = text.split("## Not measured")[0]
    assert "mnist: ddp over gloo on CPUs, np 1,2: ok" in measured, "\n".join(lines[-40:])
    assert "invoke report over every run above: ok" in measured
    from lab.common import results
    recs = results.read_records(folder / "results" / "mnist-ddp-gloo" / results.RESULTS_FILE)[0]
    assert sorted((r["status"], r["world"]["np"]) for r in recs) == [("ok", 1), ("ok", 2)]
    assert Path(archive).is_file() and (folder / "results" / "report.md").is_file()


def test_the_build_command_named_makes_the_tag_named(gpu_host, tmp_path):
    """A V100 (7.0) needs the CUDA 12.6 entry: the command says --cuda 12.6, and the
    build task's settings from that command give the very tag acceptance looks for."""
    from lab.host.images.build import BuildSettings, tags
    gpu_host(1, images=[], capability="7.0")
    named = re.findall(r"  - (\S+) is not built \(`invoke build ([^`]+)`\)", dry_run(tmp_path))
    assert [t for t, _ in named] == ["dl-lab-kit:gpu-nccl-cu126", "dl-lab-kit:gpu-mpi-cu126"]
    for tag, command in named:
        opts = dict(zip(command.split()[::2], command.split()[1::2]))
        s = BuildSettings(flavor=opts["--flavor"], gpu_ops=opts["--gpu-ops"], cuda=opts["--cuda"])
        assert tags(s, "")[0] == tag


def test_dataparallel_is_one_process_over_all_the_gpus_the_container_gets(monkeypatch, tmp_path):
    plan = acceptance_plan.plan(8, "/x", images=IMAGES)
    [dp] = [s for s in plan.steps if s.name == "dataparallel"]
    assert _flags(dp)["--np"] == "8" and _flags(dp)["--strategy"] == "dataparallel"
    assert "over 8 GPU(s)" in dp.what
    # the container is given every GPU when CUDA_VISIBLE_DEVICES is unset, else the very
    # devices the count was capped to
    assert container.visible_gpus({}) is None
    assert len(container.visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2,3"})) == \
        gpu_count.visible_count(8, "0,1,2,3") == 4
    # and the step's process inherits CUDA_VISIBLE_DEVICES as it was (nothing narrows it)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    (tmp_path / "logs").mkdir()
    step = acceptance_plan.Step("env", "env", [sys.executable, "-c",
                                "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"])
    acceptance.run_step(step, str(tmp_path), echo=lambda line: None)
    assert step.outcome == "ok" and (tmp_path / "logs/env.log").read_text().splitlines()[-1] == "0,1,2,3"


@pytest.mark.parametrize("value, seen", [
    (None, 8), ("0,1", 2), ("3,1,0", 3), ("", 0), ("-1", 0), ("none", 0), ("0,1,9,2", 2),
    ("0,-1,2", 1), ("GPU-8a2ca8bc-2c4b-4f4b-9e45-3e4f0b8e0f11,GPU-1c3e5a7b-0d2f-4e6a-8c0e-2a4c6e8a0c2e", 2),
    ("MIG-0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b", 1)])
def test_the_gpu_count_is_nvmls_capped_by_cuda_visible_devices(monkeypatch, value, seen):
    fake_nvml(monkeypatch, 8)
    env = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    count = gpu_count.count_gpus(env)
    assert (count.host, count.visible, count.driver, count.source) == (8, seen, DRIVER, "NVML")
    assert count.mode().startswith("GPU mode" if seen else "CPU mode")
    if value is not None and seen == 0:
        assert "hides the 8 GPU(s)" in count.mode()


def test_a_gpu_whose_details_nvml_cannot_give_is_still_counted(monkeypatch):
    """Memory info NotSupported (some unified-memory GPUs) or a lost GPU's errors on the
    detail calls: the machine still has its GPUs (never CPU mode for want of a detail)."""
    fake_nvml(monkeypatch, 8)
    import pynvml

    def unsupported(h):
        raise pynvml.NVMLError("Not Supported")
    pynvml.nvmlDeviceGetMemoryInfo = unsupported
    pynvml.nvmlDeviceGetCudaComputeCapability = unsupported
    count = gpu_count.count_gpus({})
    assert (count.host, count.visible, count.source) == (8, 8, "NVML")
    dev = probe_gpus().value["devices"][0]
    assert dev["memory_bytes"] is None and dev["compute_capability"] is None
    assert dev["name"] == "NVIDIA H100 80GB HBM3" and "mig_uuids" not in dev     # no MIG here


def host_gpus() -> tuple[int, str, str]:
    count = gpu_count.count_gpus({})
    return count.host, count.driver, count.source


def test_without_nvml_the_count_is_nvidia_smis(monkeypatch):
    from envcheck import gpu as nvml_probe
    from envcheck import probes
    fake_nvml(monkeypatch, 8, fail_init=True)
    smi = (FIX / "nvidia-smi-8x-h100.txt").read_text()
    monkeypatch.setattr(nvml_probe, "run_command", lambda argv, timeout=10: smi)
    assert host_gpus() == (8, DRIVER, "nvidia-smi")
    monkeypatch.setitem(sys.modules, "pynvml", None)          # nvidia-ml-py not installed

    def missing(argv, timeout=10):
        raise probes.ProbeError("nvidia-smi not found on the PATH")
    assert host_gpus() == (8, DRIVER, "nvidia-smi")
    monkeypatch.setattr(nvml_probe, "run_command", missing)
    assert host_gpus() == (0, "", "none")


def _quick(monkeypatch, doctor_argv, doctor_timeout=30):
    """The real plan, each command swapped for a quick one (the real ones need GPUs and
    the images): doctor's as given, nccl-tests' printing a real all_reduce_perf output
    after the `$` line nccl_tests() prints, the others printing one line."""
    real = acceptance.make_plan

    def make_plan(out, full=False, environ=None, local=False):
        plan, missing, count = real(out, full, environ, local)
        for s in plan.steps:
            s.argv = [sys.executable, "-c", f"print({s.name!r} + ' ran')"]
            if s.name == "doctor":
                s.argv, s.timeout_s = doctor_argv, doctor_timeout
            if s.name == "nccl-tests":
                s.argv = [sys.executable, "-c", "import sys; print('$ all_reduce_perf -b 8 -e 4G -f 2 "
                          "-g 8'); sys.stdout.write(open(sys.argv[1]).read())", str(FIX / "nccl-tests-all-reduce-8x-gh200.txt")]
        return plan, missing, count
    monkeypatch.setattr(acceptance, "make_plan", make_plan)


@pytest.mark.parametrize("doctor, timeout, outcome", [
    ("import time; time.sleep(60)", 1, "timed out"),
    ("import sys; sys.exit(3)", 30, "exit 3")])
def test_doctor_failing_or_timing_out_leaves_a_gpu_host_in_gpu_mode(
        doctor, timeout, outcome, gpu_host, monkeypatch, tmp_path):
    gpu_host(8)
    _quick(monkeypatch, [sys.executable, "-c", doctor], timeout)
    lines = []
    archive = acceptance.run(str(tmp_path), echo=lines.append)
    [folder] = [p for p in tmp_path.iterdir() if p.is_dir()]
    text = (folder / "SUMMARY.md").read_text()
    assert text.startswith(f"# dl-lab-kit acceptance: GPU mode, 8 GPU(s) (NVML, driver {DRIVER})")
    assert f"invoke doctor (host, stack where the ranks run, findings): {outcome}" in \
        text.split("## Not measured")[1]
    assert "resnet50: Horovod, MPI GPU operations (CUDA-aware MPI), np 1,2,4,8: ok" in text
    assert Path(archive).is_file() and "  dataparallel| dataparallel ran" in lines


def test_nccl_tests_figures_go_to_the_archive_and_the_summary(gpu_host, monkeypatch, tmp_path):
    gpu_host(8)
    _quick(monkeypatch, [sys.executable, "-c", "print('{}')"])
    lines = []
    acceptance.run(str(tmp_path), echo=lines.append)
    [folder] = [p for p in tmp_path.iterdir() if p.is_dir()]
    [run] = json.loads((folder / "nccl-tests.json").read_text())
    assert run["gpus"] == 8 and run["argv"][-2:] == ["-g", "8"] and len(run["rows"]) == 25
    assert "all_reduce_perf -g 8: busbw 122.57 GB/s out-of-place, 123.11 in-place at 134217728 B; " \
           "#wrong 0 in all; # Avg bus bandwidth 19.7866" in (folder / "SUMMARY.md").read_text()
    # streamed as it came, and kept in the step's log
    assert "  nccl-tests| # Avg bus bandwidth    : 19.7866 " in lines
    assert "# Avg bus bandwidth    : 19.7866" in (folder / "logs/nccl-tests.log").read_text()


def test_the_nccl_tests_parser_on_real_outputs():
    """Two all_reduce_perf runs as the nccl-tests step prints them: its `$` line, then a
    real output (2 and 8 ranks on GH200 nodes, tests/fixtures/README.md)."""
    two = (FIX / "nccl-tests-all-reduce-2x-gh200.txt").read_text()
    eight = (FIX / "nccl-tests-all-reduce-8x-gh200.txt").read_text()
    wrong = eight.replace("  1916.4   70.04  122.57      0", "  1916.4   70.04  122.57      5")
    log = ("$ all_reduce_perf -b 8 -e 4G -f 2 -g 2\n" + two + "$ all_reduce_perf -b 8 -e 4G -f 2 -g 8\n"
           + wrong + "$ all_reduce_perf -b 8 -e 4G -f 2 -g 4\nall_reduce_perf: command not found\n")
    a, b = acceptance.nccl_figures(log)             # the run without a table is left out
    assert (a["gpus"], len(a["rows"]), a["avg_busbw_gbs"]) == (2, 8, 14.9966)
    assert a["largest"] == {"size_bytes": 134217728, "busbw_gbs": 22.86, "inplace_busbw_gbs": 22.88}
    assert (b["gpus"], len(b["rows"]), b["wrong_total"], a["wrong_total"]) == (8, 25, 5, 0)
    assert [r["size_bytes"] for r in b["rows"]] == [8 * 2 ** k for k in range(25)]
    assert {r["root"] for r in b["rows"]} == {-1} and {r["redop"] for r in b["rows"]} == {"sum"}
    row = b["rows"][-1]
    assert (row["count"], row["type"], row["time_us"], row["algbw_gbs"], row["inplace_time_us"]) == \
        (33554432, "float", 1916.4, 70.04, 1907.8)


@pytest.mark.parametrize("gpus, size", [(1, "256M"), (2, "256M"), (3, "256M"), (4, "4G"), (8, "4G")])
def test_nccl_tests_go_to_4g_from_four_gpus(gpus, size, monkeypatch):
    step = acceptance_plan.plan(gpus, "/x", images=IMAGES).steps[1]
    assert _flags(step)["--max-size"] == size
    # and the step's command passes it to all_reduce_perf's -e, in the image named
    ran = []

    class Runner:
        def output(self, argv, timeout_s):
            ran.append(argv)
            return 0, (FIX / "nccl-tests-all-reduce-8x-gh200.txt").read_text()
    monkeypatch.setattr(acceptance, "choose_runner", lambda **kw: (ran.append(kw["image"]) or Runner(), None))
    assert acceptance.main(step.argv[3:]) == 0
    assert ran[0] == IMAGES["nccl"]
    assert [a[a.index("-e") + 1] for a in ran[1:]] == [size] * len(acceptance_plan.process_counts(gpus))


def test_without_a_gpu_the_cpu_equivalent_runs_and_says_so(monkeypatch, tmp_path):
    fake_nvml(monkeypatch, 0)
    text = dry_run(tmp_path)
    assert text.startswith("acceptance plan: CPU mode (no GPU on this machine")
    plan = acceptance_plan.plan(0, "/tmp/acc", cpus=2)
    assert "nccl-tests" not in [s.name for s in plan.steps]
    assert all(_flags(s).get("--device") == "cpu" for s in plan.steps if "bench" in s.argv)
    assert {_flags(s).get("--backend") for s in plan.steps if "bench" in s.argv} == {"gloo", "mpi"}
    steps = plan.steps[:2] + [plan.steps[-1]]
    for s in steps:
        s.outcome = "ok"
    text = acceptance.summary("CPU mode (no GPU on this machine: the CPU equivalent ran)", "here",
                              steps, plan.missing, 61)
    head = text.split("## Measured")[0]
    assert "CPU mode" in head and "no GPU" in head        # said before anything was measured
    assert text.index("## Not measured") < text.index("nccl-tests (needs GPUs)")


def test_every_bench_step_is_a_request_bench_accepts():
    """Each bench step's flags, as `invoke bench` hands them to settings_from_flags."""
    import inspect

    import tasks
    from lab.host.request.checks import settings_from_flags
    params = [p for p in inspect.signature(tasks.bench.body).parameters if p not in ("c", "resume")]
    for gpus, full in ((0, False), (1, False), (8, False), (8, True)):
        for step in (s for s in acceptance_plan.plan(gpus, "/tmp/acc", full=full, images=IMAGES).steps
                     if "bench" in s.argv):
            flags = dict.fromkeys(params)
            flags.update({k[2:].replace("-", "_"): v for k, v in _flags(step).items()})
            settings, lists = settings_from_flags(flags, {"timeout_s": 3600, "where": "auto"})
            assert settings.repeat == (acceptance_plan.REPEAT[full] if gpus else
                                       acceptance_plan.CPU_REPEAT), step.name


# Two GPU UUIDs as nvidia-smi -q printed them (tests/fixtures/nvidia-smi-q-brands.txt).
UUIDS = [line.split(":", 1)[1].strip() for line in
         (FIX / "nvidia-smi-q-brands.txt").read_text().splitlines() if line.strip().startswith("GPU UUID")]


@pytest.mark.parametrize("value, seen", [
    (",".join(UUIDS), 2), (UUIDS[1], 1),
    ("GPU-1db6b1cf,GPU-1b724e78", 2),         # abbreviated: the first characters, one GPU each
    ("GPU-1,0", 0),                           # a prefix of both UUIDs names neither: none visible
    ("GPU-1db6b1cf,GPU-00000000,1", 1),       # matches nothing: it and what follows are hidden
    (UUIDS[0].upper(), 0),                    # not as nvidia-smi prints it (upper-case hex)
    ("MIG-GPU-1db6b1cf/1/0", 1),              # the older MIG form, by its GPU's UUID
    (f"0,{UUIDS[0]},{UUIDS[0][:12]}", 2),     # the same UUID twice ends the list
])
def test_uuid_entries_are_checked_against_nvmls_uuids(monkeypatch, value, seen):
    fake_nvml(monkeypatch, 2)
    import pynvml
    pynvml.nvmlDeviceGetHandleByIndex = lambda i: i
    pynvml.nvmlDeviceGetUUID = lambda h: UUIDS[h]
    assert UUIDS[0].startswith("GPU-1db6b1cf") and UUIDS[1].startswith("GPU-1b724e78")
    assert [d["uuid"] for d in probe_gpus().value["devices"]] == UUIDS
    count = gpu_count.count_gpus({"CUDA_VISIBLE_DEVICES": value})
    assert (count.host, count.visible) == (2, seen)
    # without NVML's UUIDs (nvidia-smi only), a UUID entry is taken as written
    assert gpu_count.visible_count(2, "GPU-00000000") == 1


def test_a_results_dir_that_is_a_file_is_one_sentence(tmp_path):
    path = tmp_path / "results.txt"
    path.write_text("not a folder")
    with pytest.raises(acceptance.AcceptanceError, match=r"is a file, not a folder") as e:
        acceptance.run(str(path), dry_run=True, echo=lambda line: None)
    assert "\n" not in str(e.value)
    cp = subprocess.run([sys.executable, "-m", "invoke", "acceptance", "--results-dir", str(path),
                         "--dry-run"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert cp.returncode != 0 and "is a file, not a folder" in cp.stderr
    assert "Traceback" not in cp.stderr + cp.stdout
