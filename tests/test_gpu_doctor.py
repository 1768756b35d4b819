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
    from lab.common.versions import read
    from lab.host import images, places
    from lab.host.errors import RunnerError
    from lab.host.images import LABEL_PREFIX
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
