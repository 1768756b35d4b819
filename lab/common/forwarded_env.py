"""The host's variables that reach the ranks wherever they run: NCCL's, UCX's, Open
MPI's MCA parameters, CUDA's and PyTorch's NCCL settings. NCCL_DEBUG=INFO is the
first thing anyone sets when a GPU run hangs; a container's or a node's environment is
fixed, so each runner adds these to the environment it gives its ranks (the one list
here, one call per runner). Standard library only.

Two kinds are held back:
- CUDA_VISIBLE_DEVICES: a container is given the host's devices by id and numbers them
  from 0 inside (lab.host.places.image.visible_gpus); on other hosts and under Slurm the
  devices are theirs (Slurm sets the variable per job step).
- where the ranks have a network of their own (a container on Docker's bridge, the
  compose cluster), the variables that name the host's network interfaces: those names
  do not exist there (the cluster sets NCCL_SOCKET_IFNAME and OMPI_MCA_*_if_include to
  its eth0 in compose.yaml, and a docker exec environment would override them).
"""
from __future__ import annotations

import os

PREFIXES = ("NCCL_", "UCX_", "OMPI_MCA_", "CUDA_", "TORCH_NCCL_")
# Paths of the host's CUDA installation mean nothing where the ranks run.
NEVER = frozenset({"CUDA_VISIBLE_DEVICES", "CUDA_HOME", "CUDA_PATH", "CUDA_ROOT",
                   "CUDA_TOOLKIT_ROOT_DIR"})
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
            if k.startswith(PREFIXES) and k not in NEVER
            and not (own_network and k in INTERFACES)}
