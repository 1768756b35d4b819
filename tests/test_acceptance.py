"""`invoke acceptance`: the plan it runs on a GPU machine and on one without, and the
summary that opens its archive. The plan is the kit's own command lines; what they
do is tested where each command is."""
import json

from lab.host import acceptance


def _flags(step):
    a = step.argv
    return {a[i]: a[i + 1] for i in range(len(a) - 1) if a[i].startswith("--")}


def test_on_eight_gpus_every_gpu_path_is_measured_at_np_1_to_8():
    steps, missing = acceptance.plan(8, "/tmp/acc")
    names = [s.name for s in steps]
    assert names[0] == "nccl-tests" and steps[0].argv[-2:] == ["nccl-tests", "8"]
    assert names[-1] == "report" and steps[-1].argv[-1] == "/tmp/acc/results"
    benches = {s.name: _flags(s) for s in steps if "bench" in s.argv}
    for model in ("mnist", "resnet50"):
        for fw, be in (("horovod", "nccl"), ("horovod", "mpi"), ("ddp", "nccl")):
            f = benches[f"{model}-{fw}-{be}"]
            assert (f["--model"], f["--framework"], f["--backend"], f["--device"]) == (model, fw, be, "cuda")
            assert f["--np"] == "1,2,3,4,5,6,7,8" and f["--repeat"] == "3"
            assert f["--results-dir"] == "/tmp/acc/results"
    assert benches["strategies"]["--strategy"] == "ddp,zero1,fsdp,deepspeed"
    assert benches["dataparallel"]["--np"] == "1"
    assert not any("GPU" in m for m in missing)


def test_without_a_gpu_the_cpu_equivalent_runs_and_says_so():
    steps, missing = acceptance.plan(0, "/tmp/acc", cpus=2)
    assert "nccl-tests" not in [s.name for s in steps]
    assert all(_flags(s).get("--device") == "cpu" for s in steps if "bench" in s.argv)
    assert {_flags(s).get("--backend") for s in steps if "bench" in s.argv} == {"gloo", "mpi"}
    assert any("no GPU" in m or "there is none here" in m for m in missing)
    text = acceptance.summary("CPU mode (no GPU on this machine: the CPU equivalent ran)", "here",
                              steps[:2] + [steps[-1]], missing, 61)
    head = text.split("## Measured")[0]
    assert "CPU mode" in head and "no GPU" in head        # said before anything was measured
    assert text.index("## Not measured") < text.index("nccl-tests (needs GPUs)")


def test_the_gpu_count_comes_from_doctors_json():
    doc = {"checks": [{"where": "host", "name": "gpus", "status": "PASS",
                       "value": {"count": 8, "driver": "550.90.07"}}]}
    assert acceptance.gpu_count(json.dumps(doc)) == (8, "550.90.07")
    assert acceptance.gpu_count("a warning first\n" + json.dumps(doc)) == (8, "550.90.07")
    doc["checks"][0].update(status="SKIP", value=None)
    assert acceptance.gpu_count(json.dumps(doc)) == (0, "")
    assert acceptance.gpu_count("") == (0, "")


def test_every_bench_step_is_a_request_bench_accepts():
    """Each bench step's flags, as `invoke bench` hands them to settings_from_flags."""
    import inspect

    import tasks
    from lab.host.request import settings_from_flags
    params = [p for p in inspect.signature(tasks.bench.body).parameters if p not in ("c", "resume")]
    for gpus in (0, 1, 8):
        steps, _ = acceptance.plan(gpus, "/tmp/acc")
        for step in (s for s in steps if "bench" in s.argv):
            flags = dict.fromkeys(params)
            flags.update({k[2:].replace("-", "_"): v for k, v in _flags(step).items()})
            settings, lists = settings_from_flags(flags, {"timeout_s": 3600, "where": "auto"})
            assert settings.repeat == 3, step.name
