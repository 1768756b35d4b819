"""What doctor says on GPU hosts that cannot exist here: a T4 on an R535 driver, a host
with a CUDA 12.6 image beside a CUDA 13.0 one, an HGX board whose fabric manager is not
running, and whether its mpirun probes take the transports the runs take. Drivers come
from captured nvidia-smi lines and torch's error text from captured output
(tests/fixtures/README.md); the matrix's drivers from docker/versions.env."""
import re
import shlex
import warnings
from pathlib import Path

import pytest

from envcheck import host, probes, stack
from envcheck.probes import FAIL, PASS, SKIP, WARN, Result
from lab.common import ompi, versions

FIX = Path(__file__).parent / "fixtures"
DRIVERS = {d[:3]: d for d in (probes.parse_nvidia_smi(line)["driver"] for line in
                              (FIX / "nvidia-smi-driver-lines.txt").read_text().splitlines()[1:])}
MATRIX = versions.read()
# A T4 is compute capability 7.5 (NVIDIA's CUDA GPUs table; deviceQuery on one prints
# "CUDA Capability 7.5", e.g. sylvia-ymlin/cuda-kernels-from-scratch README.md).
T4 = {"index": 0, "name": "Tesla T4", "compute_capability": "7.5", "memory_bytes": 15360 * 2**20}


def _gpus(driver, *devices):
    return Result("gpus", PASS, {"driver": driver, "count": len(devices), "devices": list(devices),
                                 "source": "NVML"})


def _labels(cuda):
    key = "CUDA_" + cuda.replace(".", "_") + "_"
    return {"id": "sha256:x", "cuda_version": cuda, "cuda_archs": MATRIX[key + "ARCHS"],
            "cuda_ptx": MATRIX[key + "PTX"]}


def test_the_matrix_names_cuda_12_6_for_a_t4_on_r535():
    r535 = DRIVERS["535"]
    # 13.0 needs its GA driver (CUDA_13_0_COMPAT_DRIVER is the same); 12.6 runs from its floor
    assert versions.version_tuple(r535) < versions.version_tuple(MATRIX["CUDA_13_0_COMPAT_DRIVER"])
    assert versions.version_tuple(r535) >= versions.version_tuple(MATRIX["CUDA_12_6_COMPAT_DRIVER"])
    assert versions.cuda_entry_for_driver(MATRIX, r535, ["7.5"]) == "12.6"
    assert versions.cuda_entry_for_driver(MATRIX, DRIVERS["580"], ["7.5"]) == MATRIX["CUDA_DEFAULT"]
    assert versions.cuda_entry_for_driver(MATRIX, DRIVERS["580"], ["7.0"]) == "12.6"  # a V100
    assert versions.cuda_entry_for_driver(MATRIX, "470.82.01", ["7.5"]) is None


def test_doctor_tells_a_t4_on_r535_to_build_cuda_12_6_by_name():
    """A T4 is a data-center GPU: on R535, a branch nvidia/cuda 13.0's NVIDIA_REQUIRE_CUDA
    lists, the 13.0 image runs through forward compatibility (a WARN), and 12.6 is named
    as the native option."""
    gpus = _gpus(DRIVERS["535"], T4)
    r = host.probe_driver_for_image(gpus, Result("lab_images", WARN, None))       # nothing built
    assert r.status == WARN and "invoke build --cuda 12.6" in r.fix and DRIVERS["535"] in r.fix
    built = Result("lab_images", PASS, {"dl-lab-kit:gpu-nccl": _labels("13.0")})
    r = host.probe_driver_for_image(gpus, built)
    assert r.status == WARN and "invoke build --cuda 12.6" in r.fix
    assert "CUDA forward compatibility (the image's cuda-compat) on a data-center GPU" in r.fix
    # the same host on an R580 driver runs what `invoke build` makes
    r = host.probe_driver_for_image(_gpus(DRIVERS["580"], T4), Result("lab_images", WARN, None))
    assert r.status == SKIP and "runs CUDA 13.0" in r.fix


def test_the_driver_check_passes_when_any_built_image_runs():
    """A CUDA 12.6 image beside a CUDA 13.0 one on R535: the 12.6 one runs (minor-version
    compatibility, and it has cubins for sm_75, so no PTX JIT is needed)."""
    gpus = _gpus(DRIVERS["535"], T4)
    built = Result("lab_images", PASS, {"dl-lab-kit:gpu-nccl": _labels("13.0"),
                                        "dl-lab-kit:gpu-nccl-cu126": _labels("12.6")})
    r = host.probe_driver_for_image(gpus, built)
    assert r.status == PASS and r.value["runs"] == ["dl-lab-kit:gpu-nccl-cu126"]
    assert "dl-lab-kit:gpu-nccl: driver" in r.fix and "forward compatibility" in r.fix
    # without the cuda_version label, the tag's -cu126 says it
    no_label = {k: v for k, v in _labels("12.6").items() if k != "cuda_version"}
    assert host.image_cuda("dl-lab-kit:gpu-nccl-cu126", no_label) == "12.6"
    built = Result("lab_images", PASS, {"dl-lab-kit:gpu-nccl": _labels("13.0"),
                                        "dl-lab-kit:gpu-mpi-cu126": no_label})
    assert host.probe_driver_for_image(gpus, built).status == PASS


def test_minor_version_compatibility_passes_only_with_cubins_for_the_gpus():
    r535 = DRIVERS["535"]
    assert probes.driver_supports(r535, "12.6", MATRIX, "70,75,80,86,90", ["7.5"])[0] == PASS
    # an H100 (9.0) is covered; a GPU newer than the list would need PTX JIT: WARN
    assert probes.driver_supports(r535, "12.6", MATRIX, "70,75,80,86,90", ["12.0"])[0] == WARN
    assert probes.driver_supports(r535, "12.6", MATRIX)[0] == WARN     # GPUs not known


# ---------------------------------------------------------------- forward compatibility

BRANDS = [line.split(":", 1)[1].strip() for line in
          (FIX / "nvidia-smi-q-brands.txt").read_text().splitlines()[1:]]
L40S = dict(zip(("name", "brand_text", "uuid"), BRANDS[0:3]))       # NVIDIA L40S, NVIDIA
RTX4070 = dict(zip(("name", "brand_text", "uuid"), BRANDS[3:6]))    # GeForce RTX 4070, GeForce


def test_forward_compatible_branches_come_from_nvidia_cudas_require_cuda():
    fc = versions.forward_compat("13.0")
    assert sorted(fc) == [535, 550, 565, 570, 575]
    assert fc[535] >= {"tesla", "nvidia", "quadro", "nvidiartx"} and "geforce" not in fc[535]
    assert sorted(versions.forward_compat("12.6")) == [470, 535, 550]
    assert versions.forward_compat_brands("13.0", DRIVERS["560"]) == set()    # R560: not listed
    assert "tesla" in versions.forward_compat_brands("13.0", DRIVERS["535"])


def _fake_pynvml(monkeypatch, driver, devices):
    """pynvml as nvidia-ml-py names its calls and constants (NVML_BRAND_NVIDIA = 14,
    NVML_BRAND_GEFORCE = 5, NVML_BRAND_TESLA = 2: nvidia-ml-py's pynvml.py), for GPUs given
    as (name, brand constant or None, capability, uuid)."""
    import sys
    import types
    m = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass
    m.NVMLError = NVMLError
    m.NVML_BRAND_UNKNOWN, m.NVML_BRAND_TESLA, m.NVML_BRAND_GEFORCE, m.NVML_BRAND_NVIDIA = 0, 2, 5, 14
    m.nvmlInit = m.nvmlShutdown = lambda: None
    m.nvmlSystemGetDriverVersion = lambda: driver
    m.nvmlDeviceGetCount = lambda: len(devices)
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda h: devices[h][0]
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=2**34)
    m.nvmlDeviceGetCudaComputeCapability = lambda h: tuple(map(int, devices[h][2].split(".")))
    m.nvmlDeviceGetUUID = lambda h: devices[h][3]

    def brand(h):
        if devices[h][1] is None:
            raise NVMLError("Not Supported")
        return devices[h][1]
    m.nvmlDeviceGetBrand = brand
    monkeypatch.setitem(sys.modules, "pynvml", m)


def test_nvmls_brand_decides_forward_compatibility(monkeypatch):
    """An L40S (brand NVIDIA) on R535 runs the 13.0 image through forward compatibility
    (WARN); a GeForce RTX 4070 (brand GeForce) on the same branch cannot: FAIL, naming 12.6."""
    built = Result("lab_images", PASS, {"dl-lab-kit:gpu-nccl": _labels("13.0")})
    assert L40S["brand_text"] == "NVIDIA" and RTX4070["brand_text"] == "GeForce"
    _fake_pynvml(monkeypatch, DRIVERS["535"], [(L40S["name"], 14, "8.9", L40S["uuid"])])
    gpus = host.probe_gpus()
    assert gpus.value["devices"][0]["brand"] == "nvidia"
    assert gpus.value["devices"][0]["uuid"] == L40S["uuid"]
    r = host.probe_driver_for_image(gpus, built)
    assert r.status == WARN and "on a data-center GPU; or build --cuda 12.6" in r.fix
    _fake_pynvml(monkeypatch, DRIVERS["535"], [(RTX4070["name"], 5, "8.9", RTX4070["uuid"])])
    r = host.probe_driver_for_image(host.probe_gpus(), built)
    assert r.status == FAIL and "not brand geforce" in r.fix and "invoke build --cuda 12.6" in r.fix
    # no brand from NVML: the name says it (Tesla T4: data center)
    _fake_pynvml(monkeypatch, DRIVERS["535"], [(T4["name"], None, "7.5", "GPU-x")])
    gpus = host.probe_gpus()
    assert gpus.value["devices"][0]["brand"] == "unknown"
    assert host.probe_driver_for_image(gpus, built).status == WARN
    # a branch that is not listed (R560) stays a FAIL, whatever the GPU
    _fake_pynvml(monkeypatch, DRIVERS["560"], [(L40S["name"], 14, "8.9", L40S["uuid"])])
    assert host.probe_driver_for_image(host.probe_gpus(), built).status == FAIL


def test_bench_takes_the_13_0_image_through_forward_compatibility(engine_with, monkeypatch, tmp_path):
    """On R535 with a data-center GPU: a built 12.6 image first (native), else 13.0 with
    a one-line note, not a refusal."""
    from lab.common.docker_api import LABEL_PREFIX
    from lab.common.versions import read
    from lab.host import places
    from lab.host.errors import RunnerError
    from lab.host.images import choice as images
    from tests.conftest import FakeImage

    def image(tag, cuda):
        key = "CUDA_" + cuda.replace(".", "_")
        img = FakeImage(tag, read()[key + "_ARCHS"], read()[key + "_PTX"])
        img.labels[LABEL_PREFIX + "cuda_version"] = cuda
        return img
    new, old = image("dl-lab-kit:gpu-nccl", "13.0"), image("dl-lab-kit:gpu-nccl-cu126", "12.6")
    monkeypatch.setattr(images, "host_gpu_driver", lambda: DRIVERS["535"])
    monkeypatch.setattr(images, "host_gpu_devices", lambda: [dict(L40S, compute_capability="8.9",
                                                                   brand="nvidia")])
    kw = dict(device="cuda", framework="ddp", backend="nccl", results_dir=str(tmp_path))
    engine_with({new.tags[0]: new, old.tags[0]: old}, ["8.9"])
    runner, note = places.choose_runner(**kw)
    assert runner.image is old and "note:" not in note
    engine_with({new.tags[0]: new}, ["8.9"])
    runner, note = places.choose_runner(**kw)
    assert runner.image is new and "note: driver 535.161.07 (R535) runs CUDA 13.0 through CUDA " \
        "forward compatibility" in note
    # a GeForce on the same driver: refused, as before
    monkeypatch.setattr(images, "host_gpu_devices", lambda: [dict(RTX4070, compute_capability="8.9",
                                                                   brand="geforce")])
    with pytest.raises(RunnerError, match="not brand geforce"):
        places.choose_runner(**kw)


# ---------------------------------------------------------------- CUDA error 802

ERROR_802 = [line for line in (FIX / "cuda-error-802.txt").read_text().splitlines()
             if not line.startswith("#")]


@pytest.mark.parametrize("text", ERROR_802)
def test_error_802_names_the_fabric_manager(text):
    fix = probes.cuda_init_problem(text)
    assert fix and "nvidia-fabricmanager" in fix and "driver's version" in fix
    # another CUDA initialisation error is not mistaken for it (804, forward compatibility)
    assert probes.cuda_init_problem(text.replace("802: system not yet initialized",
                                                 "804: forward compatibility was attempted "
                                                 "on non supported HW")) is None


def test_the_torch_probe_fails_with_the_fabric_manager_when_cuda_says_802(monkeypatch):
    """torch.cuda.is_available() warns and returns False on a failed cudaGetDeviceCount
    (the captured warning's own trace: torch/cuda/__init__.py, c10/cuda/CUDAFunctions.cpp)."""
    import torch
    warning = ERROR_802[0].split("UserWarning: ", 1)[1]

    def is_available():
        warnings.warn(warning, UserWarning)
        return False
    monkeypatch.setattr(torch.cuda, "is_available", is_available)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    r = stack.probe_torch()
    assert r.status == FAIL and "nvidia-fabricmanager" in r.fix
    assert "Error 802" in r.value["cuda_init_error"]
    assert probes.probe_torch_cuda().value["cuda_init_error"] == r.value["cuda_init_error"]
    # no GPU and nothing said: the CPU case stays a PASS
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert stack.probe_torch().status == PASS


def test_error_802_is_found_when_an_earlier_call_took_torchs_warning(monkeypatch):
    """torch warns about a failed cudaGetDeviceCount once per process; is_available() then
    returns False in silence, and torch.cuda.init() raises the error again, every time
    (the captured RuntimeError of an H200 without its fabric manager)."""
    import torch
    error = ERROR_802[1].split("RuntimeError: ", 1)[1]
    calls = []

    def init():
        calls.append(1)
        raise RuntimeError(error)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)    # the warning already taken
    monkeypatch.setattr(torch.cuda, "init", init)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    avail, said = probes.cuda_available()
    assert avail is False and probes.cuda_init_problem(said) and calls == [1]
    r = stack.probe_torch()
    assert r.status == FAIL and "nvidia-fabricmanager" in r.fix
    # a CPU build of torch is not asked
    monkeypatch.setattr(torch.version, "cuda", None)
    assert probes.cuda_available() == (False, "") and calls == [1, 1]     # not asked again
    # another initialisation error is no 802
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "init", lambda: (_ for _ in ()).throw(
        RuntimeError("Found no NVIDIA driver on your system.")))
    assert probes.cuda_init_problem(probes.cuda_available()[1]) is None


# ---------------------------------------------------------------- MPI transports

def test_doctors_mpirun_takes_the_transports_of_the_kits_mpi_launches():
    """Horovod 0.28.1's horovodrun --mpi passes -mca pml ob1 -mca btl ^openib to Open MPI
    (horovod/runner/mpi_run.py, _OMPI_FLAGS); the k8s MPIJob's mpirun and doctor's own
    mpirun probes pass what lab.common.ompi holds."""
    assert ompi.TRANSPORTS == (("pml", "ob1"), ("btl", "^openib"))
    probe = ompi.mca_pairs(stack._mpirun(2))
    from tests.test_k8s import container, manifest
    body = manifest(np="2", nodes="2", framework="horovod", backend="mpi").body
    launcher = container(body["spec"]["mpiReplicaSpecs"]["Launcher"]["template"])
    words = [w for part in launcher["command"] for w in shlex.split(part)]
    k8s = [p for p in ompi.mca_pairs(words) if p[0] in ("pml", "btl")]
    assert probe == k8s == list(ompi.TRANSPORTS)


def test_horovods_own_flags_are_the_same_where_horovod_is_installed():
    mpi_run = pytest.importorskip("horovod.runner.mpi_run")
    flags = [tuple(re.fullmatch(r"-mca (\S+) (\S+)", f).groups()) for f in mpi_run._OMPI_FLAGS]
    assert flags == list(ompi.TRANSPORTS)


# ---------------------------------------------------------------- GPU collectives

# doctor on one H100 without nccl-tests (tests/fixtures/README.md): the capture's rows are
# what the decisions below are fed with.
H100_DOCTOR = (FIX / "doctor-local-1x-h100.txt").read_text()


def _captured_torch(text):
    """The torch row's value as the capture prints it (note [3]: version=..., device_count=1)."""
    m = re.search(r"torch \(local\), value: (.*?)\n(?:\[|\S)", text, re.S)
    pairs = dict(kv.split("=", 1) for kv in " ".join(m.group(1).split()).split(", "))
    return Result("torch", PASS, {"version": pairs["version"], "cuda_build": pairs["cuda_build"],
                                  "cuda_available": pairs["cuda_available"] == "True",
                                  "device_count": int(pairs["device_count"])})


def _probe_argv(monkeypatch, torch_r, np=2, printed='{"backend": "nccl", "ranks": 1, "ops": {}}',
                nccl_tests=None):
    seen = []

    def run_command(argv, timeout=10, env=None):
        seen.append(argv)
        return "launcher noise\n" + printed + "\n"
    monkeypatch.setattr(stack, "run_command", run_command)
    r = stack.probe_collectives(torch_r, np, nccl_tests=nccl_tests)
    return seen[0], r


def test_on_the_captured_h100_host_the_collectives_go_over_nccl_on_its_one_gpu(monkeypatch):
    """The capture: 1 GPU, doctor's default --np 2, no nccl-tests; its collectives row was
    Gloo on 2 CPU ranks. Now: NCCL with one rank per GPU (np = the GPU count, 1), whose
    sweep is the device copy at GPU sizes up to 1 GiB."""
    from envcheck import collectives
    assert re.search(r"local\s+collectives\s+PASS", H100_DOCTOR)
    assert "[7] collectives (local), value: gloo, 2 ranks" in H100_DOCTOR       # what it was
    assert re.search(r"nccl_all_reduce_perf\s+SKIP", H100_DOCTOR)
    torch_r = _captured_torch(H100_DOCTOR)
    assert torch_r.value["device_count"] == 1 and torch_r.value["cuda_available"]
    # what the sweep printed there (tests/fixtures/README.md: the H100's device copy)
    printed = (FIX / "collectives-1x-h100-copy.json").read_text().strip()
    argv, r = _probe_argv(monkeypatch, torch_r, np=2, printed=printed)
    assert "--nproc-per-node=1" in argv and argv[argv.index("--backend") + 1] == "nccl"
    assert r.status == PASS and "nccl_tests" not in r.value
    one = collectives.plan("cuda", 1)
    assert one["measure"] == "copy" and max(one["sizes"]) == 2**30 and min(one["sizes"]) == 4096
    assert r.value["ops"] == {} and [c["size_bytes"] for c in r.value["copy"]] == one["sizes"]
    from envcheck import report
    line = report.short("collectives", r.value)
    assert line.startswith("nccl, one rank: no collective timed") and "device-to-device copy" in line
    assert f"{r.value['copy'][-1]['gbs']:.3g} GB/s at 1 GiB (read + written)" in line
    # eight GPUs (an HGX H100, tests/fixtures/nvidia-smi-8x-h100.txt): eight NCCL ranks, all
    # collectives, the same sizes
    eight = len(re.findall(r"H100 80GB HBM3", (FIX / "nvidia-smi-8x-h100.txt").read_text()))
    assert eight == 8
    argv, _ = _probe_argv(monkeypatch, Result("torch", PASS, dict(torch_r.value, device_count=eight)))
    assert "--nproc-per-node=8" in argv and argv[argv.index("--backend") + 1] == "nccl"
    assert collectives.plan("cuda", 8) == {"measure": "collectives", "sizes": one["sizes"]}
    # no GPU: Gloo on doctor's --np, CPU sizes (to 16 MiB, the memory copy's reference)
    argv, _ = _probe_argv(monkeypatch, Result("torch", PASS, dict(torch_r.value, device_count=0)), np=3)
    assert "--nproc-per-node=3" in argv and argv[argv.index("--backend") + 1] == "gloo"
    assert collectives.plan("cpu", 3) == {"measure": "collectives", "sizes": collectives.DEFAULT_SIZES}
    assert max(collectives.DEFAULT_SIZES) == 16 * 2**20


def test_nccl_tests_rides_along_as_the_reference_where_it_ran(monkeypatch):
    """nccl-tests stays the reference: its all_reduce_perf's largest row goes onto the
    collectives row (the capture of 2 GH200s, nccl-tests 2.18.2)."""
    from envcheck import nccl_tests, report
    parsed = nccl_tests.parse_nccl_tests((FIX / "nccl-tests-all-reduce-2x-gh200.txt").read_text())
    ran = Result("nccl_all_reduce_perf", PASS, dict(parsed, gpus=2))
    sweep = {"backend": "nccl", "ranks": 2, "reference": {"name": "GPU memory copy", "gbs": 3000.0},
             "ops": {"allreduce": [{"size_bytes": 4096, "time_us": 20.0, "algbw_gbs": 0.2, "busbw_gbs": 0.2},
                                   {"size_bytes": 2**30, "time_us": 9000.0, "algbw_gbs": 119.3,
                                    "busbw_gbs": 119.3}]}}
    import json
    _, r = _probe_argv(monkeypatch, _captured_torch(H100_DOCTOR), printed=json.dumps(sweep), nccl_tests=ran)
    big = parsed["rows"][-1]
    assert r.value["nccl_tests"] == {"op": "allreduce", "gpus": 2, "size_bytes": big["size_bytes"],
                                     "busbw_gbs": big["busbw_gbs"], "algbw_gbs": big["algbw_gbs"]}
    line = report.collectives_line(r.value)
    assert "busbw GB/s at 1 GiB" in line and "all-reduce 20 us at 4 KiB" in line
    assert (f"nccl-tests all_reduce_perf (the reference), 2 GPU(s): busbw {big['busbw_gbs']:.3g} GB/s "
            f"at 128 MiB") in line
    _, r = _probe_argv(monkeypatch, _captured_torch(H100_DOCTOR), printed=json.dumps(sweep),
                       nccl_tests=Result("nccl_all_reduce_perf", SKIP, None, "not installed"))
    assert "nccl_tests" not in r.value and "nccl-tests" not in report.collectives_line(r.value)


def test_one_rank_of_nccl_times_no_transfer_for_the_in_place_collectives():
    """Why one GPU gets its copy, not collectives: NCCL's sweep forced at one rank on the
    H100 (tests/fixtures/README.md). All-reduce, broadcast and reduce (in place) cost the
    same at 1 GiB as at 4 KiB, nothing being moved; the out-of-place ones are a device copy."""
    import json
    v = json.loads((FIX / "collectives-1x-h100-nccl-one-rank.json").read_text())
    assert v["ranks"] == 1
    for op, rows in v["ops"].items():
        assert all(r["busbw_gbs"] == 0 for r in rows), op                # n = 1: factor 0
    for op in ("allreduce", "broadcast", "reduce"):
        small, big = v["ops"][op][0], v["ops"][op][-1]
        assert big["size_bytes"] == 2**30 and big["time_us"] < 2 * small["time_us"], op
    for op in ("allgather", "reducescatter", "alltoall"):
        assert v["ops"][op][-1]["time_us"] > 10 * v["ops"][op][0]["time_us"], op


def test_one_gpus_row_is_its_copy_and_says_why():
    from envcheck import report
    value = {"backend": "nccl", "ranks": 1, "ops": {}, "reference": None,
             "copy": [{"size_bytes": 4096, "time_us": 7.0, "gbs": 1.2},
                      {"size_bytes": 2**30, "time_us": 700.0, "gbs": 3067.0}]}
    line = report.short("collectives", value)
    assert line.startswith("nccl, one rank: no collective timed, since nothing crosses a bus and "
                           "nccl-tests' bus bandwidth is 0 by definition; its copy instead: "
                           "device-to-device copy 3.07e+03 GB/s at 1 GiB (read + written), 7 us at 4 KiB")
    assert "memory copy 1.2" in report.short("collectives", dict(value, backend="gloo",
                                                                  copy=value["copy"][:1]))


def test_bus_factors_and_bandwidths_are_nccl_tests_own():
    """nccl-tests doc/PERFORMANCE.md ("Summary"; NVIDIA/nccl-tests a0b82b2): all-reduce
    2(n-1)/n, reduce-scatter, all-gather and all-to-all (n-1)/n, broadcast and reduce 1;
    and its printed algbw and busbw (2 and 8 GH200s) come back from size and time. At
    n = 1 nccl-tests' broadcast and reduce print busbw = algbw (factor 1); nothing
    crosses a bus, so the kit says 0, as doctor's nccl-tests row does on one GPU."""
    from envcheck import nccl_tests
    from lab.common import collectives
    published = {"allreduce": lambda n: 2 * (n - 1) / n, "reducescatter": lambda n: (n - 1) / n,
                 "allgather": lambda n: (n - 1) / n, "alltoall": lambda n: (n - 1) / n,
                 "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0}
    assert set(published) == set(collectives.OPS) == set(collectives.NCCL_TESTS)
    for op, factor in published.items():
        for n in (2, 3, 4, 8, 16, 72):
            assert collectives.bus_factor(op, n) == pytest.approx(factor(n)), (op, n)
        assert collectives.bus_factor(op, 1) == 0.0
    assert collectives.bus_factor("reduce", 8) == 1.0 and collectives.bus_factor("allreduce", 8) == 1.75
    for name, n in (("nccl-tests-all-reduce-2x-gh200.txt", 2), ("nccl-tests-all-reduce-8x-gh200.txt", 8)):
        for row in nccl_tests.parse_nccl_tests((FIX / name).read_text())["rows"]:
            if row["algbw_gbs"] < 1:          # printed to 2 decimals: too few digits to compare
                continue
            bw = collectives.bandwidths("allreduce", row["size_bytes"], row["time_us"] * 1e-6, n)
            assert bw["algbw_gbs"] == pytest.approx(row["algbw_gbs"], rel=0.01, abs=0.01), row
            assert bw["busbw_gbs"] == pytest.approx(row["busbw_gbs"], rel=0.01, abs=0.01), row


def _run_rank(rank, n, port, out, args):
    import os
    import sys
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    with open(out, "w") as f:
        sys.stdout = f
        from envcheck import collectives
        code = collectives.main(["--backend", "gloo", "--sizes", "4096,65536", "--iters", "2",
                                 "--warmup", "1", *args])
    os._exit(code)


def _sweep(tmp_path, ranks, *args):
    """envcheck.collectives.main on `ranks` ranks over Gloo, as torch.distributed.run starts
    them (RANK, WORLD_SIZE, MASTER_ADDR/PORT), in processes forked from this one (torch
    already imported: seconds, not a launcher's start-up); rank 0's JSON line."""
    import json
    import multiprocessing
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_run_rank, args=(r, ranks, port, str(tmp_path / f"rank{r}.out"), args))
             for r in range(ranks)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * ranks, (tmp_path / "rank0.out").read_text()[-2000:]
    return json.loads([ln for ln in (tmp_path / "rank0.out").read_text().splitlines() if ln.startswith("{")][-1])


def test_the_sweep_runs_every_collective_over_gloo_at_two_ranks(tmp_path):
    """The GPU path's code (envcheck.collectives: the ops, their timing, the bandwidths),
    for real over Gloo on CPU at 2 ranks and tiny sizes; reduce's bus factor is 1."""
    from lab.common import collectives
    v = _sweep(tmp_path, 2)
    assert v["backend"] == "gloo" and v["ranks"] == 2 and list(v["ops"]) == list(collectives.OPS)
    for op, rows in v["ops"].items():
        assert [r["size_bytes"] for r in rows] == [4096, 65536]
        for r in rows:
            assert r["time_us"] > 0
            assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"] * collectives.bus_factor(op, 2)), op
    assert v["reference"]["name"] == "memory copy" and "copy" not in v


def test_one_rank_sweeps_its_copy_instead(tmp_path):
    v = _sweep(tmp_path, 1)
    assert v["ranks"] == 1 and v["ops"] == {} and v["reference"] is None
    assert [r["size_bytes"] for r in v["copy"]] == [4096, 65536]
    assert all(r["gbs"] == pytest.approx(2 * r["size_bytes"] / r["time_us"] / 1e3) for r in v["copy"])


@pytest.mark.parametrize("args, said", [
    (["--ops", "allreduce,all-gather"], "no collective all-gather: --ops takes allreduce"),
    (["--sizes", "4K"], "--sizes takes bytes as a comma list, not '4K'"),
    (["--backend", "horovod", "--ops", "reduce"], "Horovod has no reduce to a root"),
])
def test_a_wrong_option_is_one_sentence(args, said, capsys):
    from envcheck import collectives
    with pytest.raises(SystemExit) as e:
        collectives.main(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and said in err and "Traceback" not in err
