"""GPUDirect RDMA readiness (envcheck/rdma.py) on captured outputs: a sysfs tree built
from a captured `ibstatus`, which prints the port files of /sys/class/infiniband as
they are (infiniband-diags' ibstatus script cats state, phys_state, rate and
link_layer); `ibv_devinfo`; `nvidia-smi topo -m`; `ompi_info`. tests/fixtures/README.md
names each capture's source."""
import gzip
import re
from pathlib import Path

import pytest

from envcheck import rdma
from envcheck.probes import FAIL, PASS, SKIP, WARN, Result

FIX = Path(__file__).parent / "fixtures"


def _fake(path: Path, body: str):
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


def _sysfs_from_ibstatus(root: Path, text: str, state=None) -> Path:
    files = {"state": "state", "phys state": "phys_state", "rate": "rate", "link_layer": "link_layer"}
    for block in text.strip().split("\n\n"):
        m = re.match(r"Infiniband device '(\S+)' port (\d+) status:", block)
        port = root / m.group(1) / "ports" / m.group(2)
        port.mkdir(parents=True)
        for line in block.splitlines()[1:]:
            key, _, value = line.strip().partition(":")
            if key in files:
                (port / files[key]).write_text(value.strip() + "\n")
        if state is not None:          # the kernel writes "%d: %s" (drivers/infiniband/core/sysfs.c)
            (port / "state").write_text(state + "\n")
    return root


GPU1 = Result("gpus", PASS, {"count": 1})
TOPO = (FIX / "nvidia-smi-topo-m-3gpu-2nic.txt").read_text()


def test_rdma_checks_skip_with_their_reasons_where_there_is_no_device(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))            # no ibv_devinfo either
    devices = rdma.probe_rdma_devices(root=str(tmp_path / "none"))
    assert devices.status == SKIP and "no InfiniBand/RoCE device" in devices.fix
    for r in (rdma.probe_peermem(GPU1, devices), rdma.probe_gpu_nic_affinity(GPU1, devices, topo=TOPO),
              rdma.probe_nccl_rdma_settings(devices, environ={})):
        assert r.status == SKIP and r.fix, r


def test_active_roce_ports_from_sysfs(tmp_path):
    root = _sysfs_from_ibstatus(tmp_path / "ib", (FIX / "ibstatus-roce-2x-mlx5.txt").read_text())
    r = rdma.probe_rdma_devices(root=str(root))
    assert r.status == PASS and r.value["active"] == ["mlx5_0:1", "mlx5_1:1"]
    assert {p["link_layer"] for p in r.value["ports"]} == {"Ethernet"}
    assert r.value["ports"][0]["rate"] == "100 Gb/sec (4X EDR)"
    down = _sysfs_from_ibstatus(tmp_path / "ib-down", (FIX / "ibstatus-roce-2x-mlx5.txt").read_text(),
                                state="1: DOWN")
    r = rdma.probe_rdma_devices(root=str(down))
    assert r.status == FAIL and "ACTIVE" in r.fix


def test_a_port_down_read_from_ibv_devinfo(tmp_path, monkeypatch):
    ports = rdma.parse_ibv_devinfo((FIX / "ibv_devinfo-port-down.txt").read_text())
    assert ports == [{"device": "mlx5_0", "port": 1, "state": "DOWN", "phys_state": None,
                      "link_layer": "InfiniBand", "rate": None}]
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    _fake(bin_ / "ibv_devinfo", f"exec /bin/cat '{FIX / 'ibv_devinfo-port-down.txt'}'")
    monkeypatch.setenv("PATH", str(bin_))
    r = rdma.probe_rdma_devices(root=str(tmp_path / "no-sysfs-class"))
    assert r.status == FAIL and r.value["active"] == []


def test_the_peer_memory_module(tmp_path):
    devices = Result("rdma_devices", PASS, {"ports": [{"device": "mlx5_0"}]})
    r = rdma.probe_peermem(GPU1, devices, files=(str(tmp_path / "nvidia_peermem" / "version"),))
    assert r.status == WARN and "modprobe nvidia_peermem" in r.fix
    (tmp_path / "nvidia_peermem").mkdir()
    (tmp_path / "nvidia_peermem" / "version").write_text("580.126.20\n")
    r = rdma.probe_peermem(GPU1, devices, files=(str(tmp_path / "nvidia_peermem" / "version"),))
    assert r.status == PASS


def test_gpu_to_nic_affinity_against_nccls_gdr_level():
    """The 3-GPU, 2-NIC machine of the capture: GPU0 and GPU1 reach the NICs through
    NODE, GPU2 through PHB; NCCL uses GPUDirect RDMA up to PXB unless told otherwise."""
    m = rdma.parse_topo_matrix(TOPO)
    assert m == {"GPU0": {"mlx5_0": "NODE", "mlx5_1": "NODE"},
                 "GPU1": {"mlx5_0": "NODE", "mlx5_1": "NODE"},
                 "GPU2": {"mlx5_0": "PHB", "mlx5_1": "PHB"}}
    devices = Result("rdma_devices", PASS, {"ports": [{"device": "mlx5_0"}, {"device": "mlx5_1"}]})
    gpus = Result("gpus", PASS, {"count": 3})
    r = rdma.probe_gpu_nic_affinity(gpus, devices, topo=TOPO, environ={})
    assert r.status == WARN and "GPU2's nearest NIC mlx5_0 is PHB" in r.fix and "PXB" in r.fix
    r = rdma.probe_gpu_nic_affinity(gpus, devices, topo=TOPO, environ={"NCCL_NET_GDR_LEVEL": "3"})
    assert r.status == PASS and r.value["gdr_level"] == "PHB"      # old numbering: 3 is PHB
    for off in ("LOC", "0"):                                         # off for every GPU, said so
        r = rdma.probe_gpu_nic_affinity(gpus, devices, topo=TOPO, environ={"NCCL_NET_GDR_LEVEL": off})
        assert r.status == WARN and r.fix.startswith(f"GPUDirect RDMA is off by NCCL_NET_GDR_LEVEL={off}")
    with pytest.raises(ValueError):
        rdma.parse_topo_matrix("Failed to run topology matrix")


@pytest.mark.parametrize("raw,level", [
    # NCCL v2.29.7 src/graph/paths.cc ncclGetLevel: exact names of topoPathTypeStr up to SYS,
    # else a leading digit on the old scale {LOC, PIX, PXB, PHB, SYS, SYS}, capped at 5
    ("PIX", "PIX"), ("P2C", "P2C"), ("PXN", "PXN"), ("NVB", "NVB"), ("C2C", "C2C"),
    ("1", "PIX"), ("2", "PXB"), ("3", "PHB"), ("4", "SYS"), ("5", "SYS"), ("9", "SYS"),
    ("42", "SYS"), ("0", "LOC"),
    ("phb", "P2C"), ("NODE", "P2C"), ("NET", "P2C"), ("", "P2C"),     # ignored: the default
])
def test_gdr_level_as_nccl_reads_it(raw, level):
    assert rdma._gdr_level({"NCCL_NET_GDR_LEVEL": raw})[0] == level
    # NCCL_NET_GDR_C2C=0 turns the default back to PXB (paths.cc, ncclTopoCheckGdr)
    if level == "P2C" and raw != "P2C":
        assert rdma._gdr_level({"NCCL_NET_GDR_LEVEL": raw, "NCCL_NET_GDR_C2C": "0"})[0] == "PXB"


def test_nccl_ignores_a_lower_case_level_and_doctor_says_so():
    level, problem = rdma._gdr_level({"NCCL_NET_GDR_LEVEL": "phb"})
    assert level == "P2C" and "NCCL ignores it and uses its default, P2C" in problem
    assert "write PHB" in problem


def test_a_grace_gpus_nic_behind_its_own_cpu_is_within_nccls_default():
    """On a C2C system NCCL's default P2C lets a NIC of the GPU's own CPU (nvidia-smi: PHB,
    or NODE) use GPUDirect RDMA; the captured 3-GPU topology with GPUs marked C2C by NVML."""
    devices = Result("rdma_devices", PASS, {"ports": [{"device": "mlx5_0"}, {"device": "mlx5_1"}]})
    gpus = Result("gpus", PASS, {"count": 3, "devices": [{"index": i, "c2c": True} for i in range(3)]})
    r = rdma.probe_gpu_nic_affinity(gpus, devices, topo=TOPO, environ={})
    assert r.status == PASS and r.value["nearest"]["GPU2"]["nccl_path"] == "P2C"
    # NCCL_NET_GDR_C2C=0: PXB again, and those NICs are too far
    r = rdma.probe_gpu_nic_affinity(gpus, devices, topo=TOPO, environ={"NCCL_NET_GDR_C2C": "0"})
    assert r.status == WARN and "default level PXB" in r.fix
    for below_pix in ("NVL", "NVB", "C2C"):                      # below PIX: off, like LOC
        r = rdma.probe_gpu_nic_affinity(gpus, devices, topo=TOPO, environ={"NCCL_NET_GDR_LEVEL": below_pix})
        assert r.status == WARN and r.fix.startswith("GPUDirect RDMA is off")


@pytest.mark.parametrize("env,status,words", [
    ({}, PASS, None), ({"NCCL_IB_HCA": "mlx5_1"}, PASS, None), ({"NCCL_IB_HCA": "=mlx5_1:1"}, PASS, None),
    ({"NCCL_IB_HCA": "mlx4"}, FAIL, "names none of the RDMA devices"),
    ({"NCCL_IB_DISABLE": "1"}, WARN, "TCP sockets"),
    ({"NCCL_NET_GDR_LEVEL": "NEAR"}, FAIL, "NCCL ignores it"),
    # LOC (and 0, the old scale's LOC: NCCL src/graph/paths.cc, ncclGetLevel's
    # levelsOldToNew) is below every GPU-NIC path, so ncclTopoCheckGdr never enables it
    ({"NCCL_NET_GDR_LEVEL": "LOC"}, WARN, "GPUDirect RDMA is off by NCCL_NET_GDR_LEVEL=LOC"),
    ({"NCCL_NET_GDR_LEVEL": "0"}, WARN, "GPUDirect RDMA is off by NCCL_NET_GDR_LEVEL=0"),
    ({"NCCL_NET_GDR_LEVEL": "PIX"}, PASS, None),
    ({"NCCL_NET_GDR_LEVEL": "NVB"}, WARN, "GPUDirect RDMA is off by NCCL_NET_GDR_LEVEL=NVB"),
    ({"NCCL_NET_GDR_LEVEL": "pix"}, FAIL, "uses its default, P2C"),
])
def test_the_nccl_variables_that_steer_rdma(env, status, words):
    devices = Result("rdma_devices", PASS, {"ports": [{"device": "mlx5_0"}, {"device": "mlx5_1"}]})
    r = rdma.probe_nccl_rdma_settings(devices, environ=env)
    assert r.status == status and (words is None or words in r.fix)


def test_which_open_mpi_can_use_verbs(tmp_path):
    """Debian's Open MPI 4.1.4 has the UCX PML and the openib BTL; the GPU image's, built
    by docker/install-openmpi.sh, has neither (MPI over TCP between hosts)."""
    debian = gzip.open(FIX / "ompi_info-parsable-all-debian-4.1.4.txt.gz", "rt").read()
    image = gzip.open(FIX / "ompi_info-parsable-all-4.1.4-cuda.txt.gz", "rt").read()
    assert rdma.parse_ompi_transports(debian) == {"ucx": True, "openib": True}
    assert rdma.parse_ompi_transports(image) == {"ucx": False, "openib": False}
    ib = _sysfs_from_ibstatus(tmp_path / "ib", (FIX / "ibstatus-roce-2x-mlx5.txt").read_text())
    r = rdma.probe_verbs_libraries(ompi_info=image, root=str(ib), provider_globs=())
    assert r.status == WARN and "Open MPI transport over verbs" in r.fix
