"""What a measurement of this machine's and this Python's stack depends on, read cheaply
(listings, modification times, a few variables and one small file; no package is
imported), for the caches that keep such measurements: the stack probe's
(lab.host.places.stack_cache, with lab.worker.capabilities.depends_on) and the run folder's
manifest (lab.worker.manifest). Standard library only."""
from __future__ import annotations

import glob
import os

DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
DEVICE_FILES = "/dev/nvidia*"
# Which GPUs a process here sees (CUDA's list, and the container toolkit's).
VISIBLE_GPU_VARIABLES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
# The packages whose versions a measurement reports, as their installation records
# (name-version.dist-info) begin; nvidia- and nvidia_ are CUDA's wheels (cuDNN, NCCL).
STACK_PACKAGES = ("torch", "torchvision", "horovod", "deepspeed", "nvidia_", "nvidia-")
INSTALL_RECORDS = (".dist-info", ".egg-info")


def mtime(path: str) -> int | None:
    """The path's modification time in nanoseconds, or None where there is none."""
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def driver_version() -> str | None:
    """The first line of the NVIDIA driver's version file, or None without one."""
    try:
        with open(DRIVER_VERSION_FILE) as f:
            return f.readline().strip()
    except OSError:
        return None


def gpu_facts(environ=None) -> dict:
    """The GPUs as a process here meets them: the visible-device variables of `environ`
    (default: this process's), the device files and the driver's version."""
    environ = os.environ if environ is None else environ
    return {"visible": {k: environ.get(k) for k in VISIBLE_GPU_VARIABLES},
            "devices": sorted(glob.glob(DEVICE_FILES)), "driver": driver_version()}


def user_site_folders() -> list[str]:
    """The user site folder (where `pip install --user` puts packages) and its parent,
    whether or not they exist yet, so that one made later is a change; none where this
    Python reads no user site."""
    import site
    if not site.ENABLE_USER_SITE:
        return []
    user = site.getusersitepackages()
    return [user, os.path.dirname(user)]


def site_folders() -> list[str]:
    """The folders this Python's packages are installed in: its site folders, the site-
    and dist-packages folders on its path, and the user site (existing or not)."""
    import site
    import sys
    folders = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    folders += [p for p in sys.path
                if os.path.basename(p.rstrip(os.sep)) in ("site-packages", "dist-packages")]
    return list(dict.fromkeys(folders + user_site_folders()))


def python_facts() -> dict:
    """This Python's installed stack, cheaply: each site folder's modification time and
    the installation records of the stack's packages in it (their names carry the
    versions), None for a folder that does not exist."""
    out = {}
    for folder in site_folders():
        try:
            names = os.listdir(folder)
        except OSError:
            out[folder] = None
            continue
        out[folder] = {"mtime": mtime(folder),
                       "packages": sorted(n for n in names if n.endswith(INSTALL_RECORDS)
                                          and n.lower().startswith(STACK_PACKAGES))}
    return out
