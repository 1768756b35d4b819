"""NCCL's, UCX's, Open MPI's, CUDA's and PyTorch's NCCL settings reach the ranks in
every runner (lab.common.forwarded_env: one allow-list, one call per runner). The
runners are built without an engine, a cluster or SSH (what they start is not needed
to see the environment they hand their ranks)."""
import os

import pytest

from lab.common.forwarded_env import forwarded

HOST = {"NCCL_DEBUG": "INFO", "NCCL_P2P_DISABLE": "1", "NCCL_IB_HCA": "mlx5_0",
        "NCCL_SOCKET_IFNAME": "ens5", "UCX_TLS": "rc,sm,cuda_copy", "UCX_NET_DEVICES": "mlx5_0:1",
        "OMPI_MCA_btl_tcp_if_include": "ens5", "OMPI_MCA_pml": "ucx",
        "CUDA_LAUNCH_BLOCKING": "1", "CUDA_VISIBLE_DEVICES": "1,3", "CUDA_HOME": "/usr/local/cuda-12.6",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "HOME": "/root", "NCCLX": "not one of them",
        # Horovod's tuning reaches the ranks; what horovodrun sets per run and rank does not
        "HOROVOD_FUSION_THRESHOLD": "33554432", "HOROVOD_CYCLE_TIME": "2.5",
        "HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "HOROVOD_RANK": "3", "HOROVOD_SIZE": "8",
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.9",
        "HOROVOD_GLOO_RENDEZVOUS_PORT": "4242", "HOROVOD_GLOO_IFACE": "ens5"}
EVERYWHERE = {"NCCL_DEBUG": "INFO", "NCCL_P2P_DISABLE": "1", "NCCL_IB_HCA": "mlx5_0",
              "UCX_TLS": "rc,sm,cuda_copy", "OMPI_MCA_pml": "ucx", "CUDA_LAUNCH_BLOCKING": "1",
              "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "HOROVOD_FUSION_THRESHOLD": "33554432",
              "HOROVOD_CYCLE_TIME": "2.5", "HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}
# Set by horovodrun itself (Horovod 0.28.1 horovod/runner/gloo_run.py,
# create_slot_env_vars and create_run_env_vars): never taken from the host.
LAUNCHER = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_CONTROLLER", "HOROVOD_GLOO_RENDEZVOUS_ADDR",
            "HOROVOD_GLOO_RENDEZVOUS_PORT", "HOROVOD_GLOO_IFACE")
INTERFACES = {"NCCL_SOCKET_IFNAME": "ens5", "UCX_NET_DEVICES": "mlx5_0:1",
              "OMPI_MCA_btl_tcp_if_include": "ens5"}


def test_the_allow_list():
    assert forwarded(HOST) == {**EVERYWHERE, **INTERFACES}
    assert forwarded(HOST, own_network=True) == EVERYWHERE


@pytest.fixture
def host_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith(("NCCL_", "UCX_", "OMPI_MCA_", "CUDA_", "TORCH_NCCL_", "HOROVOD_")):
            monkeypatch.delenv(k)
    for k, v in HOST.items():
        monkeypatch.setenv(k, v)


def _has(env: dict, wanted: dict, absent=()):
    assert {k: env.get(k) for k in wanted} == wanted
    assert not [k for k in absent if k in env]


def test_local_processes_inherit_them(host_env, monkeypatch, tmp_path):
    """Local ranks get the whole environment (they did before the list existed too)."""
    from lab.common import proc
    from lab.host.places.local import LocalRunner
    seen = {}

    def start(cmd, env=None, **kw):
        seen.update(env)
        raise RuntimeError("stop here")
    monkeypatch.setattr(proc, "start", start)
    with pytest.raises(RuntimeError):
        LocalRunner(str(tmp_path)).run({"localhost": ["true"]}, {"OMP_NUM_THREADS": "1"}, 10, print)
    _has(seen, {**EVERYWHERE, **INTERFACES})


def test_a_container_of_the_image_gets_them(host_env, tmp_path):
    from lab.host.places.image import job_spec
    spec = job_spec("dl-lab-kit:gpu-nccl", ["true"], results_dir=str(tmp_path), data_dir=None,
                    frozen=True, gpus=True, host_uid=1000, host_gid=1000,
                    environment={"OMP_NUM_THREADS": "1"})
    _has(spec.environment, EVERYWHERE, absent=[*INTERFACES, *LAUNCHER, "CUDA_VISIBLE_DEVICES",
                                                "CUDA_HOME"])
    assert spec.gpu_ids == ["1", "3"]          # the devices themselves, renumbered inside


def _cluster_runner(cls):
    r = cls.__new__(cls)           # no engine: only the environment is looked at
    r.image = type("Img", (), {"id": "sha256:x", "labels": {}})()
    r.frozen = True
    return r


def test_the_compose_clusters_nodes_get_them(host_env):
    from lab.host.places.compose.runner import ClusterRunner
    env = _cluster_runner(ClusterRunner).env({"OMP_NUM_THREADS": "1"})
    _has(env, EVERYWHERE, absent=[*INTERFACES, *LAUNCHER, "CUDA_VISIBLE_DEVICES"])


def test_a_slurm_job_on_the_cluster_exports_them(host_env):
    from lab.host.places.slurm import script as slurm
    from lab.host.places.slurm.runner import SlurmClusterRunner
    env = _cluster_runner(SlurmClusterRunner).env({"OMP_NUM_THREADS": "1"})
    script = slurm.job_script(slurm.SlurmJob("ddp", "nccl", 2, 2, ["--epochs", "1"], env=env))
    assert "export NCCL_DEBUG=INFO" in script and "export TORCH_NCCL_ASYNC_ERROR_HANDLING=1" in script
    assert "NCCL_SOCKET_IFNAME" not in script and "CUDA_VISIBLE_DEVICES=1,3" not in script


def test_your_hosts_get_them_over_ssh(host_env, tmp_path):
    from lab.host.places.hosts import HostsRunner, remote
    from lab.host.places.launch import Host
    r = HostsRunner([Host("gpu1", 1), Host("gpu2", 1)], str(tmp_path), None)
    env = r._env({"OMP_NUM_THREADS": "1"})
    _has(env, {**EVERYWHERE, **INTERFACES}, absent=["CUDA_VISIBLE_DEVICES", *LAUNCHER])
    assert "NCCL_DEBUG=INFO" in " ".join(remote("gpu2", ["python", "-V"], env))
