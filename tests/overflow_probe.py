"""fp16 under a forced overflow, from inside 2 real ranks (run by tests/test_compression.py
under torch.distributed.run for DDP and horovodrun for Horovod):
`python -m tests.overflow_probe OUT.json`.

For each gradient compression the kit's own strategy (lab.worker.strategies, its fp16
GradScaler on "cpu" and CPU autocast in float16) trains the MNIST CNN on a fixed,
learnable batch per rank, and at step OVERFLOW_STEP rank 1 alone puts an inf into one
gradient value (a hook on the first layer's weight, which runs before the framework
reads the gradient). Per step every rank notes whether its parameters moved, the loss,
the scaler's scale, the gradient the optimizer got for the 8-bit codecs' chunk that held
the inf, and whether what the int8 codec stored for the next step is finite; rank 0
writes them all to OUT.json."""
from __future__ import annotations

import hashlib
import json
import sys

import torch
import torch.nn.functional as F

from lab.common.config import COMPRESSIONS, RunConfig
from lab.worker import dist as worker_dist
from lab.worker import models
from lab.worker.compression import CHUNK
from lab.worker.strategies import create

STEPS = 24
OVERFLOW_STEP = 6


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def learnable_batch(rank: int, n: int = 16):
    """Images whose class is the brightest of 10 bands: a CNN learns it in a few steps."""
    g = torch.Generator().manual_seed(100 + rank)
    y = torch.randint(0, 10, (n,), generator=g)
    x = torch.rand(n, 1, 28, 28, generator=g) * 0.2
    for i, c in enumerate(y.tolist()):
        x[i, 0, :, 2 * c + 4:2 * c + 6] += 1.0
    return x, y


def run(framework: str, backend: str, compression: str, d) -> dict:
    torch.manual_seed(0)
    model = models.build("mnist", 1, 28, 10)[0]
    cfg = RunConfig(framework=framework, backend=backend, precision="fp16", compression=compression,
                    lr=0.05)
    s = create(cfg, d, torch.device("cpu"))
    s.build(model, F.nll_loss)
    step_no = [0]
    first = next(s.eval_module().parameters())

    def poison(grad):
        if step_no[0] == OVERFLOW_STEP and d.rank == 1:
            grad = grad.clone()
            grad.view(-1)[0] = float("inf")
        return grad
    first.register_hook(poison)
    x, y = learnable_batch(d.rank)
    codec = d.codec if compression.startswith("int8") else None
    steps = []
    for i in range(STEPS):
        step_no[0] = i
        before = digest(s.eval_module())
        scale = float(s.scaler.get_scale()) if i else None
        loss = s.step(x, y)
        # the gradient of the chunk that held the inf, as the optimizer got it (unscaled)
        chunk = first.grad.reshape(-1)[:CHUNK]
        steps.append({"moved": digest(s.eval_module()) != before, "loss": float(loss),
                      "chunk_finite": bool(torch.isfinite(chunk).all()),
                      "chunk_nonzero": int((chunk != 0).sum()),
                      # what the int8 codec keeps for the next step (None: nothing kept)
                      "stored_finite": (all(bool(torch.isfinite(r).all()) for r in codec.residual.values())
                                        if getattr(codec, "residual", None) else None),
                      "scale_before": scale, "scale_after": float(s.scaler.get_scale())})
    return {"steps": steps, "digest": digest(s.eval_module())}


def main(out: str) -> int:
    framework = "horovod" if "horovod" in sys.argv[2:] else "ddp"
    cfg = RunConfig(framework=framework, backend="gloo")
    d = (worker_dist.Horovod if framework == "horovod" else worker_dist.DDP)(cfg)
    results = {c: run(framework, "gloo", c, d) for c in COMPRESSIONS}
    everyone = d.allgather_object(results)
    if d.rank == 0:
        with open(out, "w") as f:
            json.dump({"ranks": everyone, "overflow_step": OVERFLOW_STEP}, f)
    d.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
