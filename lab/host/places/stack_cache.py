"""The stack probe (lab.worker.capabilities: a Python that imports torch, Horovod and
torchvision, seconds) answered from a cache of that environment's last answer, keyed by
what the answer depends on, so a run does not pay for it again while nothing changed.

- Local processes: the key is the interpreter, the variables that change what it imports
  or finds (PATH, PYTHONPATH, LD_LIBRARY_PATH, the user site's, HOME), the visible GPUs,
  the GPU device files and driver version of this machine and the kit's probe code; the
  answer also lists what it was read from (lab.worker.capabilities.depends_on: the
  folders on the Python path, where an installation adds or removes packages, the user
  site folder whether or not it exists yet, the probed packages' folders, mpirun), and it
  is reused only while each of those is unchanged (its modification time).
- The lab image, in a container of its own or on the simulated cluster's nodes: an
  image's content never changes, so the key is its id (with the kit's copy it runs, the
  GPUs it is given: with GPUs, the host's visible-device variables, and this machine's GPU
  files and driver).

LAB_STACK_CACHE=off probes every time; LAB_STACK_CACHE=<folder> keeps the cache there
(default: $XDG_CACHE_HOME/dl-lab-kit/stack, else ~/.cache/dl-lab-kit/stack). `cores` is
measured now, not cached (an affinity may change). Standard library only."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from lab.common import kit, stack_facts

CACHE_ENV = "LAB_STACK_CACHE"
FORMAT = 1
# What changes what a Python imports, finds or sees, beside its own files.
# (The visible GPUs are machine_facts'.)
KEY_VARIABLES = ("PATH", "PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH", "LD_PRELOAD",
                 "PYTHONUSERBASE", "PYTHONNOUSERSITE", "HOME", "HOROVOD_GPU_OPERATIONS")
# The kit's code that makes the answer: a change to it is a new answer.
PROBE_CODE = ("lab/worker/capabilities.py", "lab/common/kit.py", "lab/common/stack_facts.py")


def cache_dir() -> Path | None:
    """Where the cache is, or None when it is off."""
    setting = os.environ.get(CACHE_ENV, "")
    if setting.lower() in ("off", "0", "no", "false"):
        return None
    if setting:
        return Path(setting)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dl-lab-kit" / "stack"


def machine_facts(env) -> dict:
    """This machine's GPUs as a probe would meet them with the variables `env`: the
    visible-device variables, the device files and the driver's version (no library is
    loaded); and the kit's probe code."""
    return {**stack_facts.gpu_facts(env),
            "probe_code": {p: stack_facts.mtime(str(kit.REPO_ROOT / p)) for p in PROBE_CODE}}


def local_key(python: str, env: dict | None = None) -> str:
    env = os.environ if env is None else env
    facts = {"kind": "local", "python": python, "real": os.path.realpath(python),
             "python_mtime": stack_facts.mtime(os.path.realpath(python)),
             "env": {k: env.get(k) for k in KEY_VARIABLES}, **machine_facts(env)}
    return _digest(facts)


def image_key(image_id: str, frozen: bool, gpus: bool, env: dict | None = None, kind: str = "image",
              devices=None) -> str:
    """With `gpus`, the container is given the GPUs the host's variables make visible
    (lab.host.places.image.visible_gpus); without, none, whatever they say. `kind`:
    "image" (a container of its own) or "cluster" (the simulated cluster's node1, which
    runs the image it was brought up with, given the GPUs of its `devices`: the
    container's device requests, fixed when the cluster came up)."""
    env = (os.environ if env is None else env) if gpus else {}
    return _digest({"kind": kind, "image": image_id, "frozen": frozen, "gpus": gpus,
                    **machine_facts(env), **({"device_requests": devices} if devices else {})})


def _digest(facts: dict) -> str:
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:24]


def fingerprint(paths) -> dict[str, int | None]:
    return {p: stack_facts.mtime(p) for p in paths}


def cached(key: str, probe, depends: bool = True) -> dict:
    """The stack for `key`: the cached answer while what it depends on is unchanged, else
    `probe()`'s (then cached). `depends`: check the answer's depends_on (local Pythons;
    an image's key says everything)."""
    folder = cache_dir()
    if folder is None:
        return probe()
    path = folder / f"{key}.json"
    try:
        entry = json.loads(path.read_text())
        if entry.get("format") == FORMAT and (
                not depends or fingerprint(entry["depends"]) == entry["depends"]):
            return {**entry["stack"], "cores": kit.cores()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    stack = probe()
    if depends and not stack.get("depends_on"):
        return stack                    # an older probe that cannot say: not cached
    entry = {"format": FORMAT, "stack": stack,
             "depends": fingerprint(stack.get("depends_on", ())) if depends else {}}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{key}.")
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f)
        os.replace(tmp, path)           # atomic: two benches never read half an entry
    except OSError:
        pass                            # an unwritable cache: probe next time too
    return stack
