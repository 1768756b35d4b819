"""A rank imports only what its run uses. Two of torch's wrappers import torch._dynamo,
the compiler, at their first call, in a run that compiles nothing: 1.4 s of a rank's
start-up here (sympy, the compiler's tables). `skip_compiler_import` keeps it out:

- torch._compile._disable_dynamo marks methods as never to be compiled
  (Optimizer.add_param_group, zero_grad, state_dict, DistributedDataParallel's hooks),
  building the mark at the first call and keeping it on the method (its
  `__dynamo_disable` attribute): the method itself is put there first, so the call goes
  straight through, as the mark does outside compilation.
- torch.optim.optimizer._use_grad_for_differentiable (the optimizers' step) sets grad
  mode around the step and breaks the compiler's graph on each side; outside
  compilation a graph break does nothing, so the step gets the same wrapper without
  them (the same grad mode, the same call).

Nothing is changed once torch._dynamo is imported (something compiles: the marks are
then built as torch builds them), and a torch whose wrapper differs is left as it is
(the run is slower to start, never different). A run with --compile imports the
compiler before anything here is called (lab.worker.compiled.load), so nothing is marked."""
from __future__ import annotations

import sys

MARK = "__dynamo_disable"    # the attribute torch._compile's wrapper caches its mark in


def _wrapper_code():
    try:
        from torch._compile import _disable_dynamo
    except ImportError:
        return None
    return _disable_dynamo(lambda: None).__code__


def _use_grad_code():
    try:
        from torch.optim.optimizer import _use_grad_for_differentiable
    except ImportError:
        return None
    return _use_grad_for_differentiable(lambda *a: None).__code__


def _lean_use_grad(func):
    """_use_grad_for_differentiable's wrapper without its graph breaks."""
    import functools

    import torch

    def _use_grad(*args, **kwargs):
        self = args[0]
        prev_grad = torch.is_grad_enabled()
        try:
            torch.set_grad_enabled(self.defaults["differentiable"])
            return func(*args, **kwargs)
        finally:
            torch.set_grad_enabled(prev_grad)
    functools.update_wrapper(_use_grad, func)
    return _use_grad


def _subclasses(cls):
    seen, todo = [], [cls]
    while todo:
        c = todo.pop()
        if c not in seen:
            seen.append(c)
            todo += c.__subclasses__()
    return seen


def skip_compiler_import(*extra_classes) -> int:
    """Pre-mark the compile-disabled methods of torch's optimizers, of
    DistributedDataParallel and of `extra_classes`; how many were marked."""
    if "torch._dynamo" in sys.modules:
        return 0
    code, use_grad = _wrapper_code(), _use_grad_code()
    import torch
    from torch.nn.parallel import DistributedDataParallel
    classes = [*_subclasses(torch.optim.Optimizer), DistributedDataParallel, *extra_classes]
    marked = 0
    for cls in classes:
        for name, attr in list(vars(cls).items()):
            attr = getattr(attr, "__func__", attr)          # staticmethod, classmethod
            fn = getattr(attr, "__wrapped__", None)
            if fn is None or getattr(attr, "__code__", None) is None:
                continue
            if attr.__code__ is use_grad and isinstance(vars(cls)[name], type(attr)):
                setattr(cls, name, _lean_use_grad(fn))
                marked += 1
                continue
            # The wrapper, or a wrapper of it (a contextmanager over it: DDP's
            # _inside_ddp_forward).
            while fn is not None:
                if getattr(attr, "__code__", None) is code and not hasattr(fn, MARK):
                    setattr(fn, MARK, fn)
                    marked += 1
                attr, fn = fn, getattr(fn, "__wrapped__", None)
    return marked


class _Compiler:
    """What DistributedDataParallel's constructor reads of torch._dynamo before the
    compiler is imported: utils.get_optimize_ddp_mode() as the compiler's default
    configuration answers it (optimize_ddp = True: "ddp_optimizer"; the other modes are
    for compiled code, and setting one means importing the compiler first, which turns
    this off). Anything else it is asked imports the real compiler and answers from it."""

    class utils:
        @staticmethod
        def get_optimize_ddp_mode() -> str:
            return "ddp_optimizer"

        def __getattr__(self, name):        # pragma: no cover - never reached by DDP
            import importlib
            return getattr(importlib.import_module("torch._dynamo.utils"), name)

    def __getattr__(self, name):
        import importlib
        return getattr(importlib.import_module("torch._dynamo"), name)


def ddp_without_compiler():
    """Around DistributedDataParallel(...): its constructor asks the compiler's
    configuration which reducer to use (torch._dynamo.utils.get_optimize_ddp_mode(),
    which imports torch._dynamo: 1.3 s); with the compiler not imported, the answer is
    its default's, given here without the import. Does nothing once torch._dynamo is
    imported."""
    import contextlib

    @contextlib.contextmanager
    def scope():
        import torch
        if "torch._dynamo" in sys.modules or "_dynamo" in vars(torch):
            yield
            return
        torch._dynamo = _Compiler()
        try:
            yield
        finally:
            if isinstance(vars(torch).get("_dynamo"), _Compiler):
                del torch._dynamo
    return scope()
