"""The GPUs this machine gives the lab and acceptance: how many the host has (the kit's
one look at them, envcheck.gpu.probe_gpus: NVML, else nvidia-smi) and how many of them
CUDA will show under CUDA_VISIBLE_DEVICES. Taken before anything runs."""
from __future__ import annotations

import os
from dataclasses import dataclass

from envcheck.gpu import probe_gpus
from envcheck.probes import PASS


@dataclass
class GpuCount:
    host: int                   # what NVML (or nvidia-smi) sees
    visible: int                # what CUDA will show: host capped by CUDA_VISIBLE_DEVICES
    driver: str
    source: str                 # NVML, nvidia-smi, or none
    limit: str | None           # CUDA_VISIBLE_DEVICES as found (None: unset)

    def mode(self) -> str:
        if self.visible:
            capped = (f"; CUDA_VISIBLE_DEVICES={self.limit} leaves {self.visible} of {self.host}"
                      if self.visible != self.host else "")
            return f"GPU mode, {self.visible} GPU(s) ({self.source}, driver {self.driver}{capped})"
        if self.host:
            return (f"CPU mode (CUDA_VISIBLE_DEVICES={self.limit!r} hides the {self.host} GPU(s) "
                    f"{self.source} sees: the CPU equivalent instead)")
        return "CPU mode (no GPU on this machine: the CPU equivalent instead)"


def count_gpus(environ=None) -> GpuCount:
    """The host's GPUs (probe_gpus; none when it sees none or cannot look), and how many
    CUDA_VISIBLE_DEVICES of `environ` (default: this process's) leaves visible, its UUID
    entries checked against the UUIDs NVML gives."""
    environ = os.environ if environ is None else environ
    r = probe_gpus()
    value = r.value if r.status == PASS and r.value else {}
    n, driver, source = int(value.get("count", 0)), value.get("driver", ""), value.get("source", "none")
    limit = environ.get("CUDA_VISIBLE_DEVICES")
    uuids = None
    if source == "NVML" and limit is not None:
        # None where NVML gave no UUID: the entries are then taken as written
        uuids = [u for d in value.get("devices", []) for u in [d.get("uuid"), *d.get("mig_uuids", [])] if u] or None
    return GpuCount(n, visible_count(n, limit, uuids), driver, source, limit)


def visible_count(total: int, value: str | None, uuids: list[str] | None = None) -> int:
    """How many of the `total` GPUs NVML sees CUDA will show under CUDA_VISIBLE_DEVICES
    `value` (None: unset, all of them). CUDA's documentation (CUDA C++ Programming
    Guide, "CUDA Environment Variables"): a comma list of indices or UUIDs; UUIDs "in the
    same format as given by nvidia-smi" (GPU-..., MIG-...; compared here as written, case
    included), abbreviated to as many leading characters as identify one device; only those
    devices are visible, and an entry that is not a valid device hides it and every one
    after it; so "", "-1" or "none" leave none. `uuids`: the UUIDs NVML gives
    (nvmlDeviceGetUUID: the GPUs', and their MIG devices'); a UUID entry counts only when it
    is the prefix of exactly one of them. None (no NVML): UUID entries are taken as valid."""
    if value is None:
        return total
    seen = []
    for entry in (e.strip() for e in value.split(",")):
        key = None
        if entry.isdigit():
            key = int(entry) if int(entry) < total else None
        elif entry.startswith(("GPU-", "MIG-")):
            if uuids is None:
                key = entry
            else:
                # the older MIG form, MIG-GPU-<uuid>/<gi>/<ci>, is checked by its GPU part
                target = entry[4:].split("/")[0] if entry.startswith("MIG-GPU-") else entry
                hits = [u for u in uuids if u.startswith(target)]
                key = (hits[0] + entry[len(target) + 4:] if target != entry else hits[0]) \
                    if len(hits) == 1 else None
        if key is None or key in seen:
            break
        seen.append(key)
    return min(len(seen), total)
