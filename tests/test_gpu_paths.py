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
