"""What a rank holds, measured from its tensors: the bytes of the storages behind its
parameters, their gradients and its optimizer's state, each storage counted once
(a view, a bucket shared by several gradients, a DTensor's local shard: its storage).
Nothing is computed from a formula, so a strategy that shards shows it. Beside it, what
the process's allocator came to (peak, reserved: figures.peak_memory, figures.reserved)."""
from __future__ import annotations

import resource

import torch


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (FSDP2's parameters); any other tensor as it is."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def _storage_key(t: torch.Tensor) -> tuple:
    s = t.untyped_storage()
    return (t.device.type, t.device.index, s.data_ptr(), s.nbytes())


def tensors_in(obj, seen_objects: set | None = None, depth: int = 6):
    """Every tensor reachable through dicts, lists, tuples and sets (an optimizer's
    state: per parameter a dict of tensors)."""
    seen_objects = set() if seen_objects is None else seen_objects
    if depth < 0 or id(obj) in seen_objects:
        return
    seen_objects.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield local_tensor(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from tensors_in(v, seen_objects, depth - 1)
    elif isinstance(obj, (list, tuple, set)):
        for v in obj:
            yield from tensors_in(v, seen_objects, depth - 1)


def storage_bytes(tensors, exclude: set | None = None, counted: set | None = None) -> int:
    """Bytes of the distinct storages behind `tensors`, leaving out those in `exclude`;
    the keys counted are added to `counted`."""
    total, exclude = 0, exclude or set()
    keys = set()
    for t in tensors:
        if t is None or t.untyped_storage().nbytes() == 0:
            continue
        k = _storage_key(t)
        if k in exclude or k in keys:
            continue
        keys.add(k)
        total += k[3]
    if counted is not None:
        counted |= keys
    return total


def optimizer_states(optimizer) -> list:
    """The state dicts an optimizer keeps, through the wrappers that keep them elsewhere:
    ZeroRedundancyOptimizer holds this rank's share in its local `optim`."""
    out, o = [], optimizer
    for _ in range(4):
        if o is None:
            break
        if hasattr(o, "state"):
            out.append(o.state)
        o = getattr(o, "optim", None) or getattr(o, "optimizer", None)
    return out


def holdings(parameters, optimizer=None, extra_state=()) -> dict[str, int]:
    """This rank's bytes in parameters, gradients and optimizer state (storages counted
    once across the three, in that order) and their total."""
    parameters = list(parameters)
    counted: set = set()
    p_bytes = storage_bytes([local_tensor(p) for p in parameters], counted=counted)
    # A DTensor's gradient is a DTensor too: its local shard is what this rank holds.
    g_bytes = storage_bytes([local_tensor(p.grad) for p in parameters if p.grad is not None],
                            exclude=counted, counted=counted)
    states = optimizer_states(optimizer) if optimizer is not None else []
    s_bytes = storage_bytes((t for st in (*states, *extra_state) for t in tensors_in(st)),
                            exclude=counted, counted=counted)
    return {"parameters": p_bytes, "gradients": g_bytes, "optimizer_state": s_bytes,
            "total": p_bytes + g_bytes + s_bytes}


def peak(device) -> int:
    """The most memory the rank held: on a GPU torch's allocated peak, on the CPU the
    process's peak resident set."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def reserved(device) -> dict | None:
    """On a GPU, what torch's caching allocator holds from CUDA, peak and at the end
    (torch.cuda.max_memory_reserved, memory_reserved: allocated tensors plus the cached
    blocks kept for reuse, so what nvidia-smi shows for the process, less CUDA's own
    context); None on the CPU, where no allocator reserves."""
    if device.type != "cuda":
        return None
    return {"peak": int(torch.cuda.max_memory_reserved(device)),
            "end": int(torch.cuda.memory_reserved(device))}
