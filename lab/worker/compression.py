"""Gradient compression beyond what the frameworks ship.

`int8`: each gradient chunk (CHUNK values) is scaled by its own max |value| into
[-127, 127], rounded to int8, and sent with its float32 scale; what rounding lost is
kept and added to the next step's gradient (error feedback), so nothing is lost for
good. int8 values cannot be summed in 8 bits (they overflow), so the ranks all-gather
the payloads and each one decodes and averages them in float32.

`int8-naive`: the baseline that fails — a plain cast of each gradient value to int8,
with no scale: a cast truncates toward zero, so every value smaller than 1 (nearly all
gradients) becomes 0, and values above 127 wrap around. The model then barely moves.

One codec is used by both frameworks: Horovod through `AllgatherOptimizer` (an
optimizer wrapper, as Horovod's own compressors ride on all-reduce), DDP through a
communication hook (`ddp_hook`). Also here: the bytes a rank hands to the collective
per step, and an estimate of what crosses its link (ring algorithms).

With fp16's gradient scaler the codecs see scaled gradients, before the scaler looks
for infs (DDP's hook runs inside the backward, Horovod's synchronize() before
unscale_), so an overflow must reach every rank's scaler as a non-finite gradient and
leave nothing behind: a chunk holding an inf or a NaN decodes as NaN (its scale is
kept, never replaced by 1), the naive cast sends one more byte saying whether its
values were finite, and the int8 codec's stored error is dropped for a key whose
average was not finite (the scaler skips that step) and is kept in unscaled units, so
a scale that halves or doubles between steps does not inflate it."""
from __future__ import annotations

import contextlib

import torch

CHUNK = 512


class ZeroedCounter:
    """How many nonzero values a codec saw and sent as 0, summed as tensors on the
    values' device: reading a count (`int(...)`) would synchronise a GPU inside every
    timed step, so they are read once, after training (`as_dict`)."""

    def __init__(self):
        self.values = self.zeroed = None

    def add(self, x: torch.Tensor, q: torch.Tensor) -> None:
        nonzero = x != 0
        v, z = nonzero.sum(), (nonzero & (q == 0)).sum()
        self.values = v if self.values is None else self.values + v
        self.zeroed = z if self.zeroed is None else self.zeroed + z

    def as_dict(self) -> dict:
        return {"values": int(self.values) if self.values is not None else 0,
                "zeroed": int(self.zeroed) if self.zeroed is not None else 0}

    def __getitem__(self, key: str) -> int:
        return self.as_dict()[key]


def quantize(x: torch.Tensor, chunk: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """A flat float tensor -> (int8 values, padded to whole chunks; float32 scales)."""
    n = x.numel()
    pad = (-n) % chunk
    xs = torch.nn.functional.pad(x.float().reshape(-1), (0, pad)).view(-1, chunk)
    scale = xs.abs().amax(dim=1) / 127.0
    # an all-zero chunk takes 1; an inf or NaN keeps its scale, so the chunk decodes as NaN
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(xs / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.reshape(-1), scale.to(torch.float32)


def dequantize(q: torch.Tensor, scale: torch.Tensor, n: int, chunk: int = CHUNK) -> torch.Tensor:
    return (q.view(-1, chunk).float() * scale[:, None]).reshape(-1)[:n]


def loss_scale_of(scaler):
    """The loss scale an fp16 gradient scaler multiplied this step's gradients by, as a
    tensor (no synchronisation): torch.amp.GradScaler keeps it in `_scale`, created by its
    first scale() and updated in place by update() (torch 2.13 torch/amp/grad_scaler.py:
    scale() multiplies by self._scale; update() calls torch._amp_update_scale_ on it)."""
    scale = getattr(scaler, "_scale", None)
    return scale if isinstance(scale, torch.Tensor) else torch.tensor(float(scaler.get_scale()))


class Int8Codec:
    """int8 with per-chunk scales and error feedback (the residual of each key: a
    parameter group or a DDP bucket)."""
    name = "int8"

    def __init__(self, chunk: int = CHUNK):
        self.chunk = chunk
        self.residual: dict = {}
        self.stats = ZeroedCounter()
        # fp16: a callable giving the gradient scaler's current scale (a tensor); the
        # residual is kept divided by it (unscaled) and multiplied back when added
        self.loss_scale = None

    def encode(self, x: torch.Tensor, key=0) -> torch.Tensor:
        """The payload to send: int8 values then the scales' bytes, one int8 tensor."""
        x = x.reshape(-1).float()
        loss_scale = self.loss_scale() if self.loss_scale is not None else None
        if key in self.residual:
            r = self.residual[key]
            x = x + (r * loss_scale.to(r.device) if loss_scale is not None else r)
        q, scale = quantize(x, self.chunk)
        error = x - dequantize(q, scale, x.numel(), self.chunk)
        self.residual[key] = error / loss_scale.to(error.device) if loss_scale is not None else error
        self.stats.add(x, q[:x.numel()])
        return torch.cat([q, scale.view(torch.int8)])

    def settle(self, key, average: torch.Tensor) -> None:
        """After the ranks' payloads of `key` are averaged: a non-finite average (an fp16
        overflow on any rank, a step the scaler skips) drops the key's stored error, which
        holds that step's values, instead of carrying it into every later step. Elementwise,
        so a GPU is not synchronised."""
        if key in self.residual:
            r = self.residual[key]
            self.residual[key] = torch.where(torch.isfinite(average).all(), r, torch.zeros_like(r))

    def decode(self, payload: torch.Tensor, n: int) -> torch.Tensor:
        chunks = -(-n // self.chunk)
        q = payload[:chunks * self.chunk]
        scale = payload[chunks * self.chunk:].contiguous().view(torch.float32)
        return dequantize(q, scale, n, self.chunk)

    def payload_bytes(self, n: int) -> int:
        chunks = -(-n // self.chunk)
        return chunks * self.chunk + 4 * chunks


class Int8NaiveCodec:
    """A plain cast to int8 and back: no scale, no error feedback. A cast of an inf or a NaN
    gives some integer, so one byte more says whether the values were finite, and a payload
    that was not decodes as NaN (fp16's scaler then skips the step, as it would without
    compression)."""
    name = "int8-naive"

    def __init__(self):
        self.stats = ZeroedCounter()

    def encode(self, x: torch.Tensor, key=0) -> torch.Tensor:
        x = x.reshape(-1).float()
        finite = torch.isfinite(x).all()
        q = torch.where(torch.isfinite(x), x, torch.zeros_like(x)).to(torch.int8)
        self.stats.add(x, q)
        return torch.cat([q, finite.to(torch.int8).reshape(1)])

    def decode(self, payload: torch.Tensor, n: int) -> torch.Tensor:
        values = payload[:n].float()
        return torch.where(payload[n] != 0, values, torch.full_like(values, float("nan")))

    def settle(self, key, average: torch.Tensor) -> None:
        """Nothing is stored between steps."""

    def payload_bytes(self, n: int) -> int:
        return n + 1


CODECS = {"int8": Int8Codec, "int8-naive": Int8NaiveCodec}


def average_gathered(codec, gathered: torch.Tensor, n_values: int, size: int, key=0) -> torch.Tensor:
    """Decode each rank's payload of `key` from an all-gather and average them in float32
    (then the codec settles what it stored for the key: Int8Codec.settle)."""
    parts = gathered.view(size, -1)
    total = codec.decode(parts[0], n_values)
    for r in range(1, size):
        total = total + codec.decode(parts[r], n_values)
    average = total / size
    codec.settle(key, average)
    return average


class AllgatherOptimizer:
    """Horovod with an 8-bit codec: at step(), every gradient is flattened into one
    buffer, encoded, all-gathered with hvd.allgather (int8), decoded and averaged,
    and written back before the wrapped optimizer steps."""

    def __init__(self, optimizer, params, codec, hvd, device_payloads: bool = False):
        self.optimizer, self.params, self.codec, self.hvd = optimizer, list(params), codec, hvd
        # True: Horovod takes GPU tensors as they are (NCCL or CUDA-aware MPI GPU
        # operations); False: a GPU payload is copied to host memory first.
        self.device_payloads = device_payloads
        self._skip = False

    def zero_grad(self):
        self.optimizer.zero_grad()

    def synchronize(self):
        """The gradients averaged over the ranks (what step() does first), as Horovod's
        DistributedOptimizer.synchronize: called apart, the step's parts time it."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        payload = self.codec.encode(flat)
        gathered = self.hvd.allgather(payload if self.device_payloads or not payload.is_cuda
                                      else payload.cpu())
        avg = average_gathered(self.codec, gathered.to(flat.device), flat.numel(), self.hvd.size())
        offset = 0
        for p, g in zip(self.params, grads):
            k = g.numel()
            p.grad = avg[offset:offset + k].view_as(g).to(g.dtype)
            offset += k

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() without synchronize(), after calling it (Horovod's pattern)."""
        self._skip = True
        try:
            yield
        finally:
            self._skip = False

    def step(self):
        if not self._skip:
            self.synchronize()
        return self.optimizer.step()

    def __getattr__(self, name):
        return getattr(self.optimizer, name)


def ddp_hook(codec):
    """A DDP communication hook that all-gathers each bucket's encoded payload (one
    int8 tensor) and returns the float32 average."""
    import torch.distributed as dist

    iteration = [0]

    def hook(state, bucket):
        # DDP rebuilds its buckets after the first iteration (seen here: one bucket of
        # every parameter in iteration 0, two after, with bucket_cap_mb=0.25), so a
        # residual kept under a bucket's index in iteration 0 belongs to other values
        # later; PyTorch's PowerSGD hook waits past the rebuild for the same reason
        # (torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py). Residuals of
        # the first iteration are dropped when the second begins.
        if iteration[0] == 1 and getattr(codec, "residual", None):
            codec.residual.clear()
            iteration[0] = 2
        buf = bucket.buffer()
        payload = codec.encode(buf, key=bucket.index())
        if bucket.is_last() and iteration[0] == 0:
            iteration[0] = 1
        size = dist.get_world_size()
        out = [torch.empty_like(payload) for _ in range(size)]
        dist.all_gather(out, payload)
        avg = average_gathered(codec, torch.cat(out), buf.numel(), size,
                               key=bucket.index()).to(buf.dtype)
        fut = torch.futures.Future()
        fut.set_result(avg)
        return fut
    return hook


def bytes_per_step(compression: str, n_values: int, size: int) -> dict:
    """What one rank hands to the collective each step (payload) and an estimate of
    what it sends over its link: a ring all-reduce sends 2(n-1)/n of the payload, a ring
    all-gather (n-1) times it (the 8-bit codecs gather, since int8 cannot be summed)."""
    if compression == "none":
        payload, gather = 4 * n_values, False
    elif compression == "fp16":
        payload, gather = 2 * n_values, False
    else:
        payload, gather = CODECS[compression]().payload_bytes(n_values), True
    if size <= 1:
        wire = 0
    elif gather:
        wire = (size - 1) * payload
    else:
        wire = int(2 * (size - 1) / size * payload)
    return {"payload_bytes": payload, "wire_bytes_estimate": wire,
            "collective": "allgather" if gather else "allreduce"}
