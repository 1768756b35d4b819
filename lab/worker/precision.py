"""--precision inside a rank (and the ceiling's process): what each precision does to the
arithmetic, the one place it is decided (lab.common.config.PRECISIONS names them and
RunConfig.check_precision refuses what cannot honour one).

- fp32: nothing changes.
- tf32: fp32 tensors; CUDA's matrix products and cuDNN's convolutions may use TF32
  tensor cores (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32:
  PyTorch's "TensorFloat-32 (TF32) on Ampere (and later) devices" notes). No autocast.
- bf16, fp16: torch.autocast(device_type, dtype) around the forward and the loss only
  (PyTorch's AMP examples: "backward passes under autocast are not recommended"); the
  weights, gradients and update stay fp32. fp16's small range needs a gradient scaler:
  torch.amp.GradScaler, or torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler
  where each rank holds a shard of the gradients (its inf check is all-reduced over the
  ranks, so all skip a step together). bf16 has fp32's range: no scaler.
- DeepSpeed runs bf16/fp16 as its own config's modes (lab.worker.strategies.deepspeed),
  not by autocast: its engine casts the model and scales the loss itself.
- On CUDA, with any precision but fp32, the convolutional models (their spec's
  channels_last) run channels-last (NHWC), the layout tensor cores' convolutions take
  (PyTorch's "Channels Last Memory Format" tutorial); fp32 runs keep the layout every
  earlier record was measured in.
"""
from __future__ import annotations

import collections
import contextlib

import torch

# precision -> autocast's dtype (None: no autocast)
AUTOCAST_DTYPES = {"fp32": None, "tf32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_dtype(precision: str):
    return AUTOCAST_DTYPES[precision]


def autocast(precision: str, device: torch.device):
    """The context the forward and the loss run in: torch.autocast at the precision's
    dtype on the run's device type, or nothing."""
    dtype = autocast_dtype(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def scaler_kind(precision: str, sharded: bool) -> str | None:
    """Which gradient scaler a precision needs: None (fp32, tf32, bf16), "grad" (torch.amp's
    GradScaler) or "sharded" (FSDP's ShardedGradScaler, where gradients are sharded)."""
    if precision != "fp16":
        return None
    return "sharded" if sharded else "grad"


def scaler(precision: str, device: torch.device, sharded: bool = False):
    """The gradient scaler of a precision (scaler_kind), or None."""
    kind = scaler_kind(precision, sharded)
    if kind == "sharded":
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
        return ShardedGradScaler(device.type)
    if kind == "grad":
        return torch.amp.GradScaler(device.type)
    return None


def set_math(precision: str, device: torch.device) -> None:
    """The process-wide matrix arithmetic: TF32 allowed on CUDA for tf32, and forbidden
    otherwise (torch's defaults differ between matmul and cuDNN: set both, so fp32 is
    fp32)."""
    if device.type != "cuda":
        return
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


# Where channels-last cannot go: its weights are not contiguous, and Horovod 0.28.1 refuses
# a tensor that is not (horovod/torch/mpi_ops.py, _check_function: "Tensor is required to
# be contiguous", on broadcast_parameters and every gradient's allreduce), as FSDP2's
# fully_shard does ("FSDP does not support non-contiguous parameters yet", torch 2.13
# torch/distributed/fsdp/_fully_shard/_fsdp_param.py). DDP, ZeRO-1 and nn.DataParallel
# take either layout.
CONTIGUOUS_ONLY = {"framework": ("horovod",), "strategy": ("fsdp",)}


def channels_last(precision: str, device: torch.device, model_name: str,
                  framework: str = "ddp", strategy: str = "ddp") -> bool:
    """Whether the run's model and images are channels-last (see the module's notes)."""
    from lab import models
    if framework in CONTIGUOUS_ONLY["framework"] or strategy in CONTIGUOUS_ONLY["strategy"]:
        return False
    return (device.type == "cuda" and precision != "fp32"
            and models.get(model_name).channels_last)


def to_layout(t: torch.Tensor, last: bool) -> torch.Tensor:
    """A batch of images (4-d) channels-last when `last`; anything else as it is."""
    return t.contiguous(memory_format=torch.channels_last) if last and t.dim() == 4 else t


@contextlib.contextmanager
def layer_dtypes(module: torch.nn.Module):
    """Within it, the dtypes the compute layers of `module` computed in: forward hooks on
    every submodule with weights of its own (Linear, Conv*, LSTM, norms) count the dtype
    of each floating-point output; removed on leaving. Yields the count (a Counter of
    dtype names). The model's output is not it: CUDA's autocast runs log_softmax in
    float32 (its fp32 list), so a bf16 CNN's output is float32 though its layers ran in
    bfloat16."""
    seen: collections.Counter = collections.Counter()

    def hook(_module, _inputs, output):
        for t in output if isinstance(output, tuple) else (output,):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                seen[str(t.dtype).removeprefix("torch.")] += 1
    handles = [m.register_forward_hook(hook) for m in module.modules()
               if next(m.parameters(recurse=False), None) is not None]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def forward_dtype(seen: collections.Counter, out: torch.Tensor) -> str:
    """The dtype a forward computed in: the most common among its layers' outputs
    (layer_dtypes), the output's own where no layer with weights ran."""
    if seen:
        return seen.most_common(1)[0][0]
    return str(out.dtype).removeprefix("torch.")


class AutocastForward(torch.nn.Module):
    """A module whose forward runs under the precision's autocast. nn.DataParallel runs
    each replica in a thread of its own, and autocast's state is per thread:
    torch/nn/parallel/parallel_apply.py (torch 2.13) re-enters autocast there with the
    caller's on/off but the thread's default dtype (fp16 on CUDA), so bf16 would not
    reach the replicas; entered inside forward, it does (PyTorch's AMP examples:
    "DataParallel in a single process")."""

    def __init__(self, module: torch.nn.Module, precision: str, device: torch.device):
        super().__init__()
        self.module, self.precision, self.device_type = module, precision, device.type

    def forward(self, *args, **kwargs):
        with autocast(self.precision, torch.device(self.device_type)):
            return self.module(*args, **kwargs)
