"""Test hosts: network namespaces on one bridge (iproute2, as root), so that
a cluster's nodes and its PostgreSQL each have an address of their own and
reach each other only over the network the test made, never over the
loopback of the machine they share.

A Network is a bridge in this namespace, with the address .1 of a /24
picked free at random in 10.128.0.0/9; each Host is a namespace with its
own loopback and one address on that bridge (.2, .3, ...). Programs run on
a host through `ip netns exec` (host.argv()), which execs them: their pid is
the one the test started. Where namespaces cannot be made, need() skips the
test with one line, and fails it in CI (CI=true), as for a missing system
package."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from dataclasses import dataclass

import pytest

IP = shutil.which("ip") or "/usr/sbin/ip"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([IP, *args], capture_output=True, text=True, check=check, timeout=30)


def need() -> None:
    """Skip (fail in CI) the calling test where network namespaces cannot be made here."""
    why = None
    if os.geteuid() != 0:
        why = "not root"
    elif not os.path.exists(IP):
        why = "no ip (iproute2)"
    else:
        probe = f"aspen-probe-{os.getpid()}"
        r = _ip("netns", "add", probe, check=False)
        if r.returncode != 0:
            why = r.stderr.strip()
        else:
            _ip("netns", "del", probe, check=False)
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"network namespaces cannot be made here ({why}); CI runs the cluster on test hosts")
        pytest.skip(f"network namespaces cannot be made here ({why})")


@dataclass
class Host:
    name: str          # its namespace
    address: str

    def argv(self, argv: list[str]) -> list[str]:
        return [IP, "netns", "exec", self.name, *argv]


class Network:
    def __init__(self) -> None:
        taken = _ip("-o", "-4", "addr").stdout
        for _ in range(50):
            a, b = random.randrange(128, 256), random.randrange(0, 256)
            prefix = f"10.{a}.{b}"
            if f" {prefix}." not in taken:
                break
        self.prefix = prefix
        self.tag = f"{os.getpid() % 100000:05d}{random.randrange(36 ** 2):03x}"[-7:]
        self.bridge = f"ab{self.tag}"
        self.hosts: list[Host] = []
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{prefix}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    @property
    def address(self) -> str:
        """This namespace's address on the bridge: where the test, its clients and nginx are."""
        return f"{self.prefix}.1"

    @property
    def subnet(self) -> str:
        return f"{self.prefix}.0/24"

    def host(self) -> Host:
        i = len(self.hosts) + 2
        name = f"aspen-{self.tag}-{i}"
        outside, inside = f"av{self.tag}{i}", f"ai{self.tag}{i}"
        _ip("netns", "add", name)
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", name)
        _ip("link", "set", outside, "master", self.bridge)
        _ip("link", "set", outside, "up")
        _ip("-n", name, "addr", "add", f"{self.prefix}.{i}/24", "dev", inside)
        _ip("-n", name, "link", "set", inside, "up")
        _ip("-n", name, "link", "set", "lo", "up")
        host = Host(name, f"{self.prefix}.{i}")
        self.hosts.append(host)
        return host

    def close(self) -> None:
        for host in self.hosts:
            _ip("netns", "del", host.name, check=False)
        _ip("link", "del", self.bridge, check=False)
