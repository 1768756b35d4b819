"""GPU-side decisions, checked without a GPU: what each call is given and in which
order, with the CUDA and NVML entry points replaced by recorders. Each test names the
upstream source its expectation comes from."""
import pytest
import torch

from lab.common.config import ConfigError, RunConfig
from lab.worker import dist as adapters


@pytest.fixture
def fake_gpus(monkeypatch):
    """torch sees 2 GPUs; set_device and init_process_group are recorded, in order."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: calls.append(("set_device", i)))
    import torch.distributed as dist
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(dist, "init_process_group",
                        lambda backend, **kw: calls.append(("init_process_group", backend, kw)))
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    for k, v in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(k, v)
    return calls


def test_ddp_picks_the_ranks_gpu_before_the_process_group_exists(fake_gpus):
    adapters.DDP(RunConfig(framework="ddp", backend="nccl", device="cuda"))
    assert fake_gpus[0] == ("set_device", 1)
    name, backend, kw = fake_gpus[1]
    assert (name, backend) == ("init_process_group", "nccl")
    assert kw["device_id"] == torch.device("cuda", 1)


def test_ddp_over_gloo_on_gpus_sets_the_device_but_binds_no_nccl_communicator(fake_gpus):
    adapters.DDP(RunConfig(framework="ddp", backend="gloo", device="cuda"))
    assert fake_gpus[0] == ("set_device", 1)
    assert "device_id" not in fake_gpus[1][2]


def test_ddp_on_cpus_touches_no_gpu(fake_gpus):
    adapters.DDP(RunConfig(framework="ddp", backend="gloo", device="cpu"))
    assert [c[0] for c in fake_gpus] == ["init_process_group"]


def test_more_local_ranks_than_gpus_is_one_sentence_before_the_group(fake_gpus, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match="2 ranks on this host but only 1 GPUs"):
        adapters.DDP(RunConfig(framework="ddp", backend="nccl", device="cuda"))
    assert fake_gpus == []


# Horovod's GPU operations: which data path a GPU tensor takes, read from the library
# (NCCL) or from install-horovod.sh's build record (MPI), and the combinations refused.
import json  # noqa: E402
import sys  # noqa: E402
import types  # noqa: E402

from lab.common import kit  # noqa: E402
from lab.host.errors import BenchError  # noqa: E402
from lab.host.request.checks import check_request  # noqa: E402
from lab.host.settings import BenchSettings  # noqa: E402


class FakeHvd(types.ModuleType):
    """horovod.torch as a rank sees it, for a given build (no GPU, no launcher)."""

    def __init__(self, nccl=0, mpi_enabled=True):
        super().__init__("horovod.torch")
        self._nccl, self._mpi = nccl, mpi_enabled
        self.Compression = types.SimpleNamespace(none="none", fp16="fp16")

    def nccl_built(self):
        return self._nccl

    def init(self):
        pass

    def rank(self):
        return 0

    local_rank = rank

    def size(self):
        return 2

    local_size = size

    def mpi_enabled(self):
        return self._mpi

    def gloo_enabled(self):
        return not self._mpi

    def broadcast_parameters(self, *a, **k):
        pass

    broadcast_optimizer_state = broadcast_parameters


@pytest.fixture
def horovod_build(tmp_path, monkeypatch):
    """A horovod package whose folder holds (or lacks) install-horovod.sh's record."""
    def make(record=None, nccl=0, mpi_enabled=True):
        pkg = tmp_path / "horovod"
        pkg.mkdir(exist_ok=True)
        (pkg / "__init__.py").write_text("")
        if record is not None:
            (pkg / kit.HOROVOD_BUILD_RECORD).write_text(record)
        parent = types.ModuleType("horovod")
        parent.__file__ = str(pkg / "__init__.py")
        hvd = FakeHvd(nccl, mpi_enabled)
        parent.torch = hvd
        monkeypatch.setitem(sys.modules, "horovod", parent)
        monkeypatch.setitem(sys.modules, "horovod.torch", hvd)
        return hvd
    return make


def test_gpu_operations_come_from_the_library_or_the_build_record(horovod_build):
    assert kit.horovod_gpu_operations(horovod_build(nccl=22907)) == "NCCL"
    assert kit.horovod_gpu_operations(
        horovod_build(json.dumps({"gpu_operations": "MPI"}))) == "MPI"
    assert kit.horovod_gpu_operations(horovod_build(json.dumps({"gpu_operations": None}))) is None
    assert kit.horovod_gpu_operations(horovod_build("{not json")) is None


@pytest.mark.parametrize("ops,backend,refused", [
    ("NCCL", "nccl", None), ("NCCL", "gloo", "would measure NCCL"),
    ("NCCL", "mpi", "would measure NCCL"), ("MPI", "mpi", None),
    ("MPI", "gloo", "only under the MPI controller"), (None, "gloo", None), (None, "mpi", None),
])
def test_horovods_gpu_data_path_must_be_the_back_end_recorded(ops, backend, refused, horovod_build):
    problem = kit.horovod_gpu_path_problem(ops, backend)
    assert (problem is None) if refused is None else (refused in problem)
    # The host refuses the same before any rank starts.
    stack = {"torch": "2.13.0", "cuda_available": True, "gpus": 2, "mpirun": True,
             "ddp_backends": {"gloo": True, "mpi": False, "nccl": True},
             "horovod": {"gloo": True, "mpi": True, "nccl": ops == "NCCL", "gpu_operations": ops}}
    s = BenchSettings(np=[2], framework="horovod", backend=backend, device="cuda")
    if refused is None:
        assert check_request(s, stack)[0] == "horovod"
    else:
        with pytest.raises(BenchError, match=refused):
            check_request(s, stack)
    # ... and so does the rank, for a job started by hand with horovodrun --gloo|--mpi.
    horovod_build(json.dumps({"gpu_operations": ops}), nccl=22907 if ops == "NCCL" else 0,
                  mpi_enabled=backend == "mpi")
    cfg = RunConfig(framework="horovod", backend=backend, device="cuda")
    if refused is None:
        assert adapters.Horovod(cfg).gpu_operations == ops
    else:
        with pytest.raises(ConfigError, match=refused):
            adapters.Horovod(cfg)


def test_the_8bit_payload_stays_on_the_gpu_only_where_horovod_takes_gpu_memory(horovod_build):
    import torch.nn as nn

    from lab.worker.compression import AllgatherOptimizer
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for record, nccl, on_device in ((None, 22907, True), (json.dumps({"gpu_operations": "MPI"}), 0, True),
                                    (json.dumps({"gpu_operations": None}), 0, False)):
        horovod_build(record, nccl=nccl)
        backend = "nccl" if nccl else "mpi"
        h = adapters.Horovod(RunConfig(framework="horovod", backend=backend, device="cuda"))
        _, wrapped = h.wrap(model, opt, "int8")
        assert isinstance(wrapped, AllgatherOptimizer) and wrapped.device_payloads is on_device


# The image must have code for the host's GPUs: a V100 (7.0) gets the CUDA 12.6 image,
# since the CUDA 13 builds start at 7.5 (docker/versions.env says why).
from lab.common import versions  # noqa: E402
from lab.common.docker_api import LABEL_PREFIX  # noqa: E402
from lab.host import places as where  # noqa: E402
from lab.host.images import choice as images  # noqa: E402
from tests.conftest import FakeImage  # noqa: E402


@pytest.mark.parametrize("archs,cc,ptx,runs", [
    ("75,80,86,90,100,120", "7.0", True, False),   # V100 on the CUDA 13 list
    ("70,75,80,86,90", "7.0", False, True),
    ("75,80,86,90,100,120", "8.9", True, True),    # an sm_86 cubin runs on 8.9 (same major)
    ("75,80,86,90,100,120", "12.1", True, True),
    ("80,90", "8.0", False, True), ("80,90", "7.5", True, False),
    ("75,80,86,90,100,120", "13.0", True, True),   # newer than the list: its highest PTX
    ("70,75,80,86,90", "10.0", False, False),      # the 12.6 wheels carry no PTX
    ("70,75,80,86,90", "10.0", True, True),
])
def test_which_architectures_run_on_which_gpu(archs, cc, ptx, runs):
    assert versions.archs_cover(archs, cc, ptx) is runs


def test_the_matrix_names_the_cuda_entry_for_a_volta():
    m = versions.read()
    assert versions.cuda_entry_for(m, "7.0") == "12.6"
    assert versions.cuda_entry_for(m, "10.0") == m["CUDA_DEFAULT"]
    assert m["CUDA_12_6_PTX"] == "0" and m["CUDA_13_0_PTX"] == "1"
    assert versions.cuda_entry_for(m, "9.0") == m["CUDA_DEFAULT"]
    assert versions.cuda_entry_for(m, "6.1") is None


def test_a_gpu_run_takes_the_image_with_code_for_its_gpus(engine_with, tmp_path):
    m = versions.read()
    new, old = FakeImage("dl-lab-kit:gpu-nccl", m["CUDA_13_0_ARCHS"], m["CUDA_13_0_PTX"]), \
        FakeImage("dl-lab-kit:gpu-nccl-cu126", m["CUDA_12_6_ARCHS"], m["CUDA_12_6_PTX"])
    kw = dict(device="cuda", framework="ddp", backend="nccl", results_dir=str(tmp_path))
    engine_with({new.tags[0]: new, old.tags[0]: old}, ["7.0", "7.0"])
    assert where.choose_runner(**kw)[0].image is old
    engine_with({new.tags[0]: new, old.tags[0]: old}, ["9.0"])
    assert where.choose_runner(**kw)[0].image is new
    # A GPU newer than both lists: only the image whose torch carries PTX runs on it.
    engine_with({old.tags[0]: old, new.tags[0]: new}, ["12.1"])
    assert where.choose_runner(**kw)[0].image is new
    engine_with({old.tags[0]: old}, ["10.0"])
    with pytest.raises(images.RunnerError, match=r"no GPU code for compute capability 10\.0"):
        where.choose_runner(**kw)
    engine_with({new.tags[0]: new}, ["7.0"])
    with pytest.raises(images.RunnerError, match=r"no GPU code for compute capability 7\.0.*"
                                                  r"invoke build --cuda 12\.6"):
        where.choose_runner(**kw)
    # doctor takes it anyway and reports the finding instead.
    assert where.choose_runner(check_gpu_code=False, **kw)[0].image is new


def test_doctor_finds_an_image_without_code_for_the_gpus():
    from envcheck import findings
    from envcheck.probes import FAIL, PASS, Result
    m = versions.read()
    host = {"gpus": Result("gpus", PASS, {"count": 2, "devices": [
                {"name": "Tesla V100-SXM2-32GB", "compute_capability": "7.0"}] * 2}, ""),
            "lab_images": Result("lab_images", PASS, {
                "dl-lab-kit:gpu-nccl": {"cuda_archs": m["CUDA_13_0_ARCHS"]},
                "dl-lab-kit:cpu": {"flavor": "cpu"}}, "")}
    name = "finding: the GPU images have code for these GPUs"
    got = {f.name: f for f in findings.find(host, {}, np=2, in_image=True)}[name]
    assert got.status == FAIL and "invoke build --cuda 12.6" in got.fix
    assert "Tesla V100-SXM2-32GB (7.0)" in got.fix
    # With the CUDA 12.6 image built too, bench takes that one: no FAIL, just the fact.
    host["lab_images"].value["dl-lab-kit:gpu-nccl-cu126"] = {"cuda_archs": m["CUDA_12_6_ARCHS"]}
    got = {f.name: f for f in findings.find(host, {}, np=2, in_image=True)}[name]
    assert got.status == PASS and "bench uses dl-lab-kit:gpu-nccl-cu126" in got.fix
    host["gpus"].value["devices"] = [{"name": "NVIDIA A100", "compute_capability": "8.0"}]
    got = {f.name: f for f in findings.find(host, {}, np=2, in_image=True)}[name]
    assert got.status == PASS and not got.fix


def test_doctor_expects_the_gpus_cuda_visible_devices_gives_the_image():
    from envcheck import findings
    from envcheck.probes import FAIL, PASS, Result
    host = {"gpus": Result("gpus", PASS, {"count": 4}, "")}
    ranks = {"torch": Result("torch", PASS, {"cuda_build": "13.0", "cuda_available": True,
                                             "device_count": 2}, "")}
    name = "finding: the ranks see every GPU of the host"
    assert {f.name: f for f in findings.find(host, ranks, 2, True)}[name].status == FAIL
    assert {f.name: f for f in findings.find(host, ranks, 2, True, visible=2)}[name].status == PASS


# NVLink topology through a fake pynvml: an 8-GPU NVSwitch board, an NVLink-bridged
# pair, and a PCIe-only pair. The shapes come from real boards: on DGX A100 each A100
# has 12 NVLinks, two to each of 6 NVSwitches, and NVML gives the switch's PCI bus id
# as a link's remote (go-nvml issue #166; NCCL issue #1505's topology dump lists six
# nvlink targets of PCI class 0x068000 per GPU); the GPUs sit at 07, 0F, 47, 4E, 87, 90,
# B7 and BD. The constants are nvidia-ml-py 13.x's (pynvml.py): NVML_P2P_CAPS_INDEX_NVLINK
# = 2, NVML_P2P_STATUS_OK = 0, device types GPU 0 / SWITCH 2, NVML_NVLINK_MAX_LINKS 36.
class FakeNVMLError(Exception):
    pass


def fake_pynvml(gpu_bus, links, nvlink_p2p, ancestor=20):
    """links[i]: [(device type, remote bus id)] of GPU i's active links."""
    m = types.ModuleType("pynvml")
    m.NVMLError = FakeNVMLError
    m.NVML_P2P_CAPS_INDEX_NVLINK, m.NVML_P2P_STATUS_OK, m.NVML_P2P_STATUS_NOT_SUPPORTED = 2, 0, 5
    m.NVML_NVLINK_DEVICE_TYPE_GPU, m.NVML_NVLINK_DEVICE_TYPE_SWITCH = 0, 2
    m.NVML_NVLINK_MAX_LINKS = 36
    m.nvmlInit = m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: len(gpu_bus)
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=gpu_bus[h].encode())

    def link(h, n):
        if n >= 12 or n >= len(links[h]) and not links[h]:
            raise FakeNVMLError("NVML_ERROR_INVALID_ARGUMENT" if n >= 12 else "NVML_ERROR_NOT_SUPPORTED")
        return links[h][n] if n < len(links[h]) else None
    m.nvmlDeviceGetNvLinkState = lambda h, n: 1 if link(h, n) else 0
    m.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, n: types.SimpleNamespace(busId=link(h, n)[1].encode())
    m.nvmlDeviceGetNvLinkRemoteDeviceType = lambda h, n: link(h, n)[0]

    def p2p(a, b, index):
        assert index == 2
        return 0 if nvlink_p2p else 5
    m.nvmlDeviceGetP2PStatus = p2p
    m.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: ancestor
    return m


def topology(monkeypatch, module):
    from envcheck import host
    from envcheck.probes import PASS, Result
    monkeypatch.setitem(sys.modules, "pynvml", module)
    r = host.probe_gpu_topology(Result("gpus", PASS, {"count": module.nvmlDeviceGetCount(),
                                                      "source": "NVML"}, ""))
    assert r.status == PASS, r.fix
    return r.value


def test_nvlink_through_nvswitch_is_seen_on_an_8_gpu_board(monkeypatch):
    gpus = [f"00000000:{b}:00.0" for b in ("07", "0F", "47", "4E", "87", "90", "B7", "BD")]
    switches = [f"00000000:{b}:00.0" for b in ("C4", "C5", "C6", "C7", "C8", "C9")]
    links = [[(2, switches[k // 2]) for k in range(12)] for _ in gpus]
    v = topology(monkeypatch, fake_pynvml(gpus, links, nvlink_p2p=True))
    assert len(v["pairs"]) == 28
    assert all(p == "NVLink via NVSwitch (12 links from GPU " + k.split("-")[0] + ")"
               for k, p in v["pairs"].items())
    assert v["summary"] == "NVLink via NVSwitch"


def test_an_nvlink_bridged_pair_counts_its_links(monkeypatch):
    gpus = ["00000000:17:00.0", "00000000:65:00.0"]
    links = [[(0, gpus[1])] * 4, [(0, gpus[0])] * 4]
    v = topology(monkeypatch, fake_pynvml(gpus, links, nvlink_p2p=True))
    assert v["pairs"] == {"0-1": "NVLink x4"}


def test_a_link_nvml_cannot_read_is_skipped_not_the_end(monkeypatch):
    """NVML errs on a link that is not supported; the links after it still count."""
    gpus = ["00000000:17:00.0", "00000000:65:00.0"]
    m = fake_pynvml(gpus, [[(0, gpus[1])] * 5, [(0, gpus[0])] * 5], nvlink_p2p=True)
    state = m.nvmlDeviceGetNvLinkState

    def gap(h, n):
        if n == 0:
            raise FakeNVMLError("NVML_ERROR_NOT_SUPPORTED")
        return state(h, n)
    m.nvmlDeviceGetNvLinkState = gap
    assert topology(monkeypatch, m)["pairs"] == {"0-1": "NVLink x4"}


def test_a_pcie_pair_gives_its_pcie_path(monkeypatch):
    gpus = ["00000000:17:00.0", "00000000:65:00.0"]
    v = topology(monkeypatch, fake_pynvml(gpus, [[], []], nvlink_p2p=False, ancestor=30))
    assert v["pairs"] == {"0-1": "PCIe host bridge"}


def _h100_links():
    """(PCIe max generation, max width, NVLink count, GB/s a link) from the captures of an
    H100 80GB HBM3 (tests/fixtures/README.md)."""
    import re
    text = (Path(__file__).parent / "fixtures" / "nvidia-smi-h100-links.txt").read_text()
    gen = int(re.search(r"PCIe Generation\n\s+Max\s+: (\d+)", text).group(1))
    width = int(re.search(r"Link Width\n\s+Max\s+: (\d+)x", text).group(1))
    speeds = {int(n): float(v) for n, v in re.findall(r"Link (\d+): ([\d.]+) GB/s", text)}
    return gen, width, max(speeds) + 1, set(speeds.values()).pop()


def with_rates(m, gen, width, mbps=None):
    """The fake NVML's link rates: nvidia-ml-py's nvmlDeviceGetFieldValues (a list of
    c_nvmlFieldValue_t: nvmlReturn, value.uiVal), max PCIe generation and width, and
    nvmlDeviceGetNvLinkVersion (nvmlNvlinkVersion_t)."""
    def fields(h, ids):
        assert ids == [90]                          # NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON
        ok = mbps is not None
        return [types.SimpleNamespace(nvmlReturn=0 if ok else 3, valueType=1,   # unsigned int
                                      value=types.SimpleNamespace(uiVal=mbps or 0))]
    m.nvmlDeviceGetFieldValues = fields
    m.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: gen
    m.nvmlDeviceGetMaxPcieLinkWidth = lambda h: width
    m.nvmlDeviceGetNvLinkVersion = lambda h, n: 7      # what some H100s report: never read
    return m


def test_an_h100_boards_links_are_the_reference_of_its_collectives(monkeypatch):
    """8 GPUs, each with the capture's 18 links at 26.562 GB/s through NVSwitch: the
    reference is 18 x 26.562 = 478.1 GB/s per direction; where NVML has no speed field,
    none (no guess from the reported version); PCIe gen 5 x16 when a pair goes over PCIe,
    even where a GPU has a bridge to another."""
    gen, width, count, gbs = _h100_links()
    assert (gen, width, count, gbs) == (5, 16, 18, 26.562)
    gpus = [f"00000000:{b}:00.0" for b in ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")]
    switches = [f"00000000:{b}:00.0" for b in ("C4", "C5", "C6", "C7")]
    links = [[(2, switches[k % 4]) for k in range(count)] for _ in gpus]
    m = with_rates(fake_pynvml(gpus, links, nvlink_p2p=True), gen, width, mbps=int(gbs * 1000))
    m.NVML_NVLINK_MAX_LINKS = 36
    monkeypatch.setattr(m, "nvmlDeviceGetNvLinkState", lambda h, n: 1 if n < count else 0)
    monkeypatch.setattr(m, "nvmlDeviceGetNvLinkRemotePciInfo",
                        lambda h, n: types.SimpleNamespace(busId=links[h][n][1].encode()))
    monkeypatch.setattr(m, "nvmlDeviceGetNvLinkRemoteDeviceType", lambda h, n: links[h][n][0])
    v = topology(monkeypatch, m)
    assert v["reference"] == {"name": "NVLink, 18 links x 26.562 GB/s", "gbs": 478.1}
    assert v["summary"] == "NVLink via NVSwitch (NVLink, 18 links x 26.562 GB/s = 478.1 GB/s per direction)"
    assert v["rates"][0]["pcie"] == {"generation": 5, "width": 16, "gbs": 63.0}
    with_rates(m, gen, width, mbps=None)
    v = topology(monkeypatch, m)
    assert v["reference"] is None and v["summary"] == "NVLink via NVSwitch"
    pair = ["00000000:17:00.0", "00000000:65:00.0"]
    m = with_rates(fake_pynvml(pair, [[], []], nvlink_p2p=False, ancestor=30), gen, width)
    v = topology(monkeypatch, m)
    assert v["reference"] == {"name": "PCIe gen 5 x16", "gbs": 63.0}
    assert v["pairs"] == {"0-1": "PCIe host bridge"}
    # four GPUs, bridged in pairs (0-1, 2-3): every GPU has NVLinks, 0-2 goes over PCIe
    four = ["00000000:17:00.0", "00000000:65:00.0", "00000000:CA:00.0", "00000000:E3:00.0"]
    bridged = [[(0, four[1])] * 4, [(0, four[0])] * 4, [(0, four[3])] * 4, [(0, four[2])] * 4]
    m = with_rates(fake_pynvml(four, bridged, nvlink_p2p=False, ancestor=30), gen, width, mbps=26562)
    v = topology(monkeypatch, m)
    assert v["pairs"]["0-1"] == "NVLink x4" and v["pairs"]["0-2"] == "PCIe host bridge"
    assert v["reference"] == {"name": "PCIe gen 5 x16", "gbs": 63.0}


def test_doctor_prints_a_gpu_collectives_share_of_the_links_and_leaves_the_cpu_ones(tmp_path):
    """The link reference goes onto the NCCL collectives only, and the line then names
    both references with each collective's two shares. The sweep is the probe's own
    (envcheck.collectives over Gloo on 2 ranks here, marked nccl as a GPU run writes it);
    the GPUs' links are the H100 board's NVLink as gpu_topology reads it from NVML."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from envcheck.probes import PASS, Result
    from envcheck.report import collectives_line
    from lab.host.suites.doctor import with_link_reference
    cp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                         "--standalone", "-m", "envcheck.collectives", "--backend", "gloo",
                         "--sizes", "4096,65536", "--iters", "2", "--warmup", "1"],
                        capture_output=True, text=True, timeout=180, cwd=tmp_path,
                        env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent),
                                 OMP_NUM_THREADS="1"))
    assert cp.returncode == 0, cp.stderr[-2000:]
    value = json.loads([ln for ln in cp.stdout.splitlines() if ln.startswith("{")][-1])
    value["backend"] = "nccl"
    links = {"name": "NVLink, 18 links x 26.562 GB/s", "gbs": 478.1}
    topo = Result("gpu_topology", PASS, {"reference": links}, "")
    ranks = [{"name": "collectives", "value": dict(value)},
             {"name": "collectives_mpi", "value": dict(value, backend="horovod")}]
    with_link_reference(ranks, topo)
    assert ranks[0]["value"]["link"] == links and "link" not in ranks[1]["value"]
    line = collectives_line(ranks[0]["value"])
    big = value["ops"]["allreduce"][-1]["busbw_gbs"]
    copy = value["reference"]["gbs"]
    assert f"allreduce {big:.3g} ({big / copy:.0%}/{big / links['gbs']:.0%})" in line
    assert (f"share of the memory copy, {copy:.3g} GB/s / of NVLink, 18 links x 26.562 GB/s, "
            f"478 GB/s") in line
    assert "NVLink" not in collectives_line(ranks[1]["value"])


def test_without_an_image_the_runtime_probe_looks_for_the_hook(monkeypatch):
    import shutil

    from envcheck import host
    from envcheck.probes import FAIL, PASS, Result
    monkeypatch.setattr(host, "_docker", lambda: (object(), None))
    gpus = Result("gpus", PASS, {"count": 1}, "")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    r = host.probe_gpu_runtime(gpus, Result("lab_images", "WARN", None, ""))
    assert r.status == FAIL and "nvidia-container-runtime-hook" in r.fix
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/" + name)
    assert host.probe_gpu_runtime(gpus, None).status == PASS


# A CDI-only host: the NVIDIA container toolkit installed the CDI hook and generated a
# spec, but no nvidia-container-runtime-hook. moby registers "gpu" for either hook
# (daemon/devices_nvidia_linux.go, getNVIDIADeviceDrivers). The spec is nvidia-ctk's own
# expected output (tests/fixtures/README.md), written with its default kind.
from pathlib import Path  # noqa: E402

FIX = Path(__file__).parent / "fixtures"


def test_a_cdi_only_host_gives_containers_gpus(monkeypatch, tmp_path):
    import shutil

    from envcheck import host
    from envcheck.probes import FAIL, PASS, Result
    monkeypatch.setattr(host, "_docker", lambda: (object(), None))
    hooks = {"nvidia-cdi-hook": "/usr/bin/nvidia-cdi-hook"}
    monkeypatch.setattr(shutil, "which", lambda name: hooks.get(name))
    gpus = Result("gpus", PASS, {"count": 1}, "")
    cdi = tmp_path / "etc-cdi"
    cdi.mkdir()
    r = host.probe_gpu_runtime(gpus, None, cdi_dirs=(str(cdi),))
    assert r.status == FAIL and "nvidia-ctk cdi generate" in r.fix      # the hook, no spec
    spec = (FIX / "cdi-spec-nvidia-ctk-generate.yaml").read_text()
    (cdi / "nvidia.yaml").write_text(spec.replace("kind: example.com/device", "kind: nvidia.com/gpu"))
    r = host.probe_gpu_runtime(gpus, None, cdi_dirs=(str(cdi),))
    assert r.status == PASS and r.value["cdi_specs"] == [str(cdi / "nvidia.yaml")]
    # Another vendor's spec alone does not give NVIDIA GPUs.
    (cdi / "nvidia.yaml").write_text(spec)
    assert host.probe_gpu_runtime(gpus, None, cdi_dirs=(str(cdi),)).status == FAIL


def test_the_collectives_probe_picks_its_gpu_before_the_nccl_group(fake_gpus, monkeypatch):
    import torch.distributed as dist

    from envcheck import collectives

    class Stop(Exception):
        pass

    def stop(*a, **k):
        raise Stop
    monkeypatch.setattr(dist, "get_rank", stop)        # end the probe once the group exists
    with pytest.raises(Stop):
        collectives.main(["--backend", "nccl", "--sizes", "4096", "--iters", "1"])
    assert fake_gpus[0] == ("set_device", torch.device("cuda", 1))
    name, backend, kw = fake_gpus[1]
    assert (name, backend) == ("init_process_group", "nccl")
    assert kw["device_id"] == torch.device("cuda", 1)


# The driver decides too: the GPU images set NVIDIA_DISABLE_REQUIRE, so a CUDA 13 image
# starts on an R535 or R560 driver and torch sees no GPU. Drivers from captured
# nvidia-smi lines (tests/fixtures/README.md); the images' CUDA and architectures from
# docker/versions.env, as lab.host.images labels them.
from envcheck.probes import parse_nvidia_smi  # noqa: E402

DRIVERS = {d[:3]: d for d in (parse_nvidia_smi(line)["driver"] for line in
                              (FIX / "nvidia-smi-driver-lines.txt").read_text().splitlines()[1:])}


def _image(tag, cuda):
    m = versions.read()
    key = "CUDA_" + cuda.replace(".", "_")
    img = FakeImage(tag, m[key + "_ARCHS"], m[key + "_PTX"])
    img.labels[LABEL_PREFIX + "cuda_version"] = cuda
    return img


@pytest.mark.parametrize("branch,expected", [("535", "cu126"), ("560", "cu126"), ("580", "cu130")])
def test_a_gpu_run_takes_the_image_this_driver_runs(engine_with, monkeypatch, tmp_path, branch, expected):
    new, old = _image("dl-lab-kit:gpu-nccl", "13.0"), _image("dl-lab-kit:gpu-nccl-cu126", "12.6")
    engine_with({new.tags[0]: new, old.tags[0]: old}, ["8.0"])          # an A100: both have its code
    monkeypatch.setattr(images, "host_gpu_driver", lambda: DRIVERS[branch])
    got = where.choose_runner(device="cuda", framework="ddp", backend="nccl",
                                results_dir=str(tmp_path))[0].image
    assert got is {"cu126": old, "cu130": new}[expected]


def test_no_built_image_runs_on_this_driver_is_one_sentence(engine_with, monkeypatch, tmp_path):
    new = _image("dl-lab-kit:gpu-nccl", "13.0")
    engine_with({new.tags[0]: new}, ["8.6"])
    monkeypatch.setattr(images, "host_gpu_driver", lambda: DRIVERS["560"])
    kw = dict(device="cuda", framework="ddp", backend="nccl", results_dir=str(tmp_path))
    with pytest.raises(images.RunnerError, match=r"runs none of the GPU images built.*"
                                                  r"560\.28\.03 is too old for CUDA 13\.0"):
        where.choose_runner(**kw)
    assert where.choose_runner(check_gpu_code=False, **kw)[0].image is new     # doctor reports it


def test_up_gpu_brings_the_cluster_up_from_the_image_this_host_runs(engine_with, monkeypatch):
    from lab.common import docker_api
    from lab.host.places.compose import cluster
    new, old = _image("dl-lab-kit:gpu-nccl", "13.0"), _image("dl-lab-kit:gpu-nccl-cu126", "12.6")
    engine_with({new.tags[0]: new, old.tags[0]: old}, ["8.0"])
    monkeypatch.setattr(images, "host_gpu_driver", lambda: DRIVERS["560"])
    assert cluster._gpu_image(docker_api.client()) == "dl-lab-kit:gpu-nccl-cu126"
    engine_with({new.tags[0]: new}, ["8.0"])
    with pytest.raises(cluster.ClusterError, match="560.28.03 is too old for CUDA 13.0"):
        cluster._gpu_image(docker_api.client())


def test_cpu_jobs_in_a_gpu_image_are_spared_open_mpis_libcuda_notice(tmp_path, monkeypatch):
    from lab.host.places.image import job_spec
    monkeypatch.delenv("OMPI_MCA_opal_warn_on_missing_libcuda", raising=False)

    def env(gpus):
        return job_spec("dl-lab-kit:gpu-mpi", ["true"], results_dir=str(tmp_path), data_dir=None,
                        frozen=True, gpus=gpus, host_uid=1000, host_gid=1000).environment
    assert env(False)["OMPI_MCA_opal_warn_on_missing_libcuda"] == "0"
    assert "OMPI_MCA_opal_warn_on_missing_libcuda" not in env(True)     # GPU jobs: it matters there
    monkeypatch.setenv("OMPI_MCA_opal_warn_on_missing_libcuda", "1")
    assert env(False)["OMPI_MCA_opal_warn_on_missing_libcuda"] == "1"   # the user's word wins


# --hosts with GPUs: each host runs its slots' ranks (mpirun's hostfile semantics), so
# each is checked against its own GPUs, not the first host's with ceil(np/hosts) ranks.
def _hosts_runner(monkeypatch, tmp_path, gpus: dict):
    from lab.host.places.hosts import HostsRunner
    from lab.host.places.launch import parse_hosts
    spec = ",".join(f"{h}:{slots}" for h, (slots, _) in gpus.items())
    r = HostsRunner(parse_hosts(spec), str(tmp_path), None)
    base = {"kit": "x", "python": "3.11", "torch": "2.13.0", "cuda_available": True, "mpirun": True,
            "ddp_backends": {"gloo": True, "mpi": False, "nccl": True}}
    answers = {h: json.dumps(dict(base, gpus=n)) for h, (_, n) in gpus.items()}
    monkeypatch.setattr(r, "output_on", lambda host, argv, timeout_s=120: (0, answers[host]))
    return r


def test_uneven_gpu_hosts_are_checked_each_against_its_own(monkeypatch, tmp_path):
    from lab.host.places.hosts import HostsError
    r = _hosts_runner(monkeypatch, tmp_path, {"small": (2, 2), "big": (4, 4)})   # slots, GPUs
    stack = r.probe_stack()
    s = BenchSettings(np=[6], framework="ddp", backend="nccl", device="cuda", nodes=2)
    assert check_request(s, stack)[0] == "ddp"          # 2 ranks on 2 GPUs, 4 on 4: it fits
    from lab.host.places.base import Launch
    args = tuple(RunConfig(framework="ddp", backend="nccl", device="cuda").to_args())
    gpu_job = Launch("ddp", "nccl", 6, args, device="cuda")
    assert r.commands(gpu_job)                          # and the hosts agree
    r = _hosts_runner(monkeypatch, tmp_path, {"small": (4, 2), "big": (2, 4)})
    r.probe_stack()
    with pytest.raises(HostsError, match=r"host small runs 4 rank\(s\).*sees 2 GPU\(s\).*small:2"):
        r.commands(gpu_job)
    assert r.commands(Launch("ddp", "gloo", 6, tuple(RunConfig(framework="ddp", backend="gloo").to_args())))
