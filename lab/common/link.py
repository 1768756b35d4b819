"""A --link spec, RATE[/DELAY] (tc's units: 1gbit, 100mbit/1ms), read without the cluster:
its rate in bits and bytes per second. The host shapes links with it
(lab.host.places.compose.cluster); the report compares a run's bus bandwidth with it."""
from __future__ import annotations

import re

RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$", re.IGNORECASE)
DELAY = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$", re.IGNORECASE)
UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}     # tc's decimal units


def rate_bits(rate: str) -> float:
    """'1gbit' -> 1e9 (bits per second); ValueError when it is no rate."""
    m = RATE.match(rate)
    if not m:
        raise ValueError(f"not a rate: {rate!r}")
    return float(m.group(1)) * UNITS[m.group(2).lower()]


def tbf_burst_bytes(spec: str) -> int | None:
    """The token bucket the simulated cluster shapes a rate-only link with (tc's tbf): at
    least sixteen 1500-byte frames and about 4 ms of traffic at the rate; None for a spec
    with a delay (netem, no bucket) or none. What fills the bucket leaves at the host's
    speed: a message after a pause longer than 4 ms sends that much unshaped."""
    rate, _, delay = (spec or "").partition("/")
    if not rate or delay:
        return None
    return max(16 * 1500, int(rate_bits(rate) / 8 / 250))


def rate_gbs(spec: str) -> float | None:
    """A spec's rate in GB/s (10^9 bytes per second), None when it names none."""
    try:
        return rate_bits(spec.partition("/")[0]) / 8 / 1e9 if spec else None
    except ValueError:
        return None
