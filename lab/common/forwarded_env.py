"""The host's variables that reach the ranks wherever they run: NCCL's, UCX's, Open
MPI's MCA parameters, CUDA's, PyTorch's NCCL settings and Horovod's run-time settings
(HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME, HOROVOD_HIERARCHICAL_ALLREDUCE, ...). NCCL_DEBUG=INFO is the
first thing anyone sets when a GPU run hangs; a container's or a node's environment is
fixed, so each runner adds these to the environment it gives its ranks (the one list
here, one call per runner). Standard library only.

Three kinds are held back:
- CUDA_VISIBLE_DEVICES: a container is given the host's devices by id and numbers them
  from 0 inside (lab.host.places.image.visible_gpus); on other hosts and under Slurm the
  devices are theirs (Slurm sets the variable per job step).
- where the ranks have a network of their own (a container on Docker's bridge, the
  compose cluster), the variables that name the host's network interfaces: those names
  do not exist there (the cluster sets NCCL_SOCKET_IFNAME and OMPI_MCA_*_if_include to
  its eth0 in compose.yaml, and a docker exec environment would override them).
- the HOROVOD_ variables horovodrun itself sets for each run and rank (LAUNCHER_SET): a
  value left in the host's environment would name another run's rendezvous or rank.
"""
from __future__ import annotations

import os

PREFIXES = ("NCCL_", "UCX_", "OMPI_MCA_", "CUDA_", "TORCH_NCCL_", "HOROVOD_")
# Paths of the host's CUDA installation mean nothing where the ranks run.
NEVER = frozenset({"CUDA_VISIBLE_DEVICES", "CUDA_HOME", "CUDA_PATH", "CUDA_ROOT",
                   "CUDA_TOOLKIT_ROOT_DIR"})
# What horovodrun sets in each rank's environment (Horovod 0.28.1,
# horovod/runner/gloo_run.py: create_slot_env_vars gives HOROVOD_HOSTNAME, _RANK, _SIZE,
# _LOCAL_RANK, _LOCAL_SIZE, _CROSS_RANK, _CROSS_SIZE; create_run_env_vars gives
# HOROVOD_GLOO_RENDEZVOUS_ADDR, _GLOO_RENDEZVOUS_PORT, _CONTROLLER, _CPU_OPERATIONS,
# _GLOO_IFACE and, elastic, HOROVOD_ELASTIC). Under --mpi (horovod/runner/mpi_run.py,
# mpi_run) it sets none of them: the ranks read Open MPI's OMPI_COMM_WORLD_*, so a
# forwarded HOROVOD_CONTROLLER=gloo or HOROVOD_RANK would contradict the launcher there.
# The kit chooses the controller itself (--backend), so these never come from the host.
LAUNCHER_SET = frozenset({
    "HOROVOD_HOSTNAME", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK",
    "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE",
    "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT", "HOROVOD_GLOO_IFACE",
    "HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS", "HOROVOD_ELASTIC"})
# Variables naming network interfaces (NCCL docs env.rst: NCCL_SOCKET_IFNAME,
# NCCL_IB_HCA names RDMA devices, not interfaces, and is kept; UCX_NET_DEVICES; Open MPI
# 4.1's btl_tcp_if_include/exclude and oob_tcp_if_include/exclude).
INTERFACES = frozenset({"NCCL_SOCKET_IFNAME", "UCX_NET_DEVICES",
                        "OMPI_MCA_btl_tcp_if_include", "OMPI_MCA_btl_tcp_if_exclude",
                        "OMPI_MCA_oob_tcp_if_include", "OMPI_MCA_oob_tcp_if_exclude"})


def forwarded(environ=None, own_network: bool = False) -> dict[str, str]:
    """The allow-listed variables of `environ` (os.environ by default). own_network:
    the ranks run in a network namespace of their own, so interface names stay home."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items()
            if k.startswith(PREFIXES) and k not in NEVER and k not in LAUNCHER_SET
            and not (own_network and k in INTERFACES)}
