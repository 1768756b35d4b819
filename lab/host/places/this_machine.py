"""Whether a name is this machine: its host names, the addresses they and its network
interfaces hold, loopback, and the machine an ssh alias reaches (`ssh -G`). `bench --hosts`
asks it of the first host (lab.host.places.hosts.check_first_host)."""
from __future__ import annotations

import ipaddress
import socket

from lab.common import proc


def addresses(name: str) -> set[str]:
    """The addresses `name` resolves to here (none where it does not resolve)."""
    try:
        return {a[4][0] for a in socket.getaddrinfo(name, None)}
    except (OSError, UnicodeError):
        return set()


def interface_addresses() -> set[str]:
    """The addresses this machine's network interfaces hold (Linux: IPv4 by SIOCGIFADDR,
    IPv6 from /proc/net/if_inet6); none where that cannot be read."""
    out: set[str] = set()
    try:
        import fcntl
        import struct
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for _, name in socket.if_nameindex():
                try:
                    packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
                    out.add(socket.inet_ntoa(packed[20:24]))
                except OSError:
                    pass            # an interface without an IPv4 address
    except (ImportError, OSError):
        pass
    try:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                h = line.split()[0]
                out.add(str(ipaddress.IPv6Address(int(h, 16))))
    except (OSError, ValueError, IndexError):
        pass
    return out


def this_machine() -> set[str]:
    """This machine's names and addresses, lower case: localhost and 127.0.0.1, its host
    name (short and fully qualified), what those resolve to, and its interfaces' addresses."""
    names = {"localhost", "127.0.0.1", "::1"}
    for n in (socket.gethostname(), socket.getfqdn()):
        names |= {n, n.split(".")[0]}
    for n in list(names):
        names |= addresses(n)
    return {n.lower() for n in names | interface_addresses() if n}


def ssh_hostname(host: str) -> str:
    """The machine ssh reaches as `host` (an alias of ~/.ssh/config names its HostName:
    `ssh -G`, which connects to nothing); `host` itself where ssh cannot say."""
    try:
        res = proc.run(["ssh", "-G", host], timeout=10)
    except proc.NotFound:
        return host
    for line in (res.stdout or "").splitlines() if res.returncode == 0 else []:
        key, _, value = line.partition(" ")
        if key == "hostname" and value.strip():
            return value.strip()
    return host


def is_this_machine(host: str, here: set[str] | None = None) -> bool:
    """Whether `host` (as --hosts names it) is this machine: its name, the name ssh
    reaches it by, or an address either resolves to is one of this machine's
    (this_machine) or a loopback address."""
    here = this_machine() if here is None else here
    real = ssh_hostname(host)
    for name in {host, real, *addresses(real)}:
        name = name.lower().split("%")[0]
        if name in here or name.startswith("127.") or name == "::1":
            return True
    return False
