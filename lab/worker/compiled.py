"""--compile inside a rank: torch.compile of the model, and the compiler's own seconds.

- What is compiled: the strategy's training module, once the framework has wrapped it.
  DDP: the DistributedDataParallel module itself, as PyTorch's DDP notes say ("apply the
  DDP model wrapper before compiling the model, such that torchdynamo can apply
  DDPOptimizer (graph-break optimizations) based on DDP bucket sizes",
  docs/source/notes/ddp.rst, "TorchDynamo DDPOptimizer"); the compiler then cuts the
  graph at DDP's bucket boundaries so each bucket's all-reduce overlaps the rest of the
  backward (torch/_dynamo/config.py, torch 2.13: `optimize_ddp`, whose default True is
  "ddp_optimizer"; set here by name). Horovod: its DistributedOptimizer hooks the
  gradient accumulators of the module's parameters before the compile, and the compiled
  module holds those same parameters (torch.compile's OptimizedModule keeps the module
  as `_orig_mod`), whose accumulation the autograd engine still runs after the compiled
  backward, so the hooks fire as in eager mode.
- Evaluation and checkpoints use the module itself (Strategy.eval_module unwraps
  `_orig_mod`): evaluation runs eagerly, so its other batch size and eval mode cost no
  compilation.
- The compiler's seconds: TorchDynamo's own count of the time it spent compiling
  frames and their backward graphs (torch/_dynamo/utils.py, torch 2.13:
  calculate_time_spent()["total_wall_time"], entire_frame_compile plus
  entire_backward_compile). The training loop reads it around each step: a step in
  which it grew compiled, and is never timed.
- The compiler must not be imported after lab.worker.lean has marked torch's
  compile-disabled methods as plain calls (that shortcut is for runs that compile
  nothing): a compiled run imports it first (load), and lean then leaves torch as it is.
"""
from __future__ import annotations

import contextlib


def load() -> None:
    """Import the compiler before anything else of the run (lab.worker.lean's shortcut and
    DDP's constructor then see it imported and leave torch as it is)."""
    import torch._dynamo  # noqa: F401 - imported for its effect: the real compiler is there


def compile_module(module):
    """The module compiled (torch.compile's default mode and Inductor back end), with DDP's
    bucket-split graphs."""
    import torch
    torch._dynamo.config.optimize_ddp = "ddp_optimizer"
    return torch.compile(module)


def watch(compiling) -> None:
    """compiling(True) when the compiler starts and compiling(False) when it ends
    (TorchDynamo's callbacks around each compilation, nested ones counted once:
    torch/_dynamo/callback.py, torch 2.13, CompilationCallbackHandler): the rank's
    heartbeat is in its compile phase meanwhile (lab.worker.heartbeat)."""
    from torch._dynamo.callback import callback_handler
    callback_handler.register_start_callback(lambda _args: compiling(True))
    callback_handler.register_end_callback(lambda _args: compiling(False))


def seconds() -> float:
    """The compiler's seconds so far in this process (TorchDynamo's count: see above)."""
    from torch._dynamo.utils import calculate_time_spent
    return calculate_time_spent()["total_wall_time"]


def eager(compiled: bool):
    """Around a call that must run eagerly in a compiled run (the first step's forward,
    watched by hooks that count its layers' dtypes, lab.worker.precision.layer_dtypes:
    traced, they would be compiled into the graph): torch.compiler.set_stance
    ("force_eager"), torch >= 2.6's public switch; nothing in an eager run."""
    if not compiled:
        return contextlib.nullcontext()
    import torch
    return torch.compiler.set_stance("force_eager")
