"""Who a request comes from (model/client.Client), read once from its
environment for the admission's per-client share (runtime/admission.py).

- REMOTE_USER, when the server authenticated the request (Apache's auth,
  or ASPEN_REMOTE_USER_HEADER behind nginx): the user, wherever it comes from.
- Else the address: REMOTE_ADDR; when that peer is a trusted proxy
  (ASPEN_TRUSTED_PROXIES, default none; `unix` for a peer on a unix socket,
  which has no address), `X-Forwarded-For` is read from its right end, as
  nginx's realip module reads it recursively: the first address that is not
  a trusted proxy is the client's (all trusted: the leftmost). An entry that
  is not an address ends the walk at the hop that wrote it. From any other
  peer the header is ignored: a client cannot choose who it counts as.
- IPv6 addresses count by their /64 (one host is given a whole /64);
  IPv4-mapped ones as their IPv4 address."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Optional, Union

from .. import settings as aspen_settings
from ..model.client import ADDRESS, USER, Client

if TYPE_CHECKING:
    import ipaddress
    Address = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]


def _ipv4(text: str) -> bool:
    """TEXT is a plain dotted IPv4 address (the common case, read without the ipaddress module)."""
    parts = text.split(".")
    return len(parts) == 4 and all(p.isdigit() and len(p) <= 3 and int(p) <= 255 and (p == "0" or p[0] != "0")
                                   for p in parts)


def _address(text: str) -> Optional["Address"]:
    import ipaddress  # startup: only for X-Forwarded-For and IPv6
    text = text.strip()
    if text.startswith("[") and "]" in text:            # "[2001:db8::1]:443", as some proxies write it
        text = text[1:text.index("]")]
    elif text.count(":") == 1:                          # "10.0.0.7:51234"
        text = text.split(":", 1)[0]
    try:
        addr = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def _trusted(addr: Optional["Address"], proxies: tuple) -> bool:
    if addr is None:
        return "unix" in proxies
    return any(p != "unix" and addr.version == p.version and addr in p for p in proxies)


def _name(addr: "Address") -> str:
    import ipaddress  # startup
    if isinstance(addr, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((int(addr) >> 64 << 64, 64)))
    return str(addr)


def of(env: Mapping[str, str], s: Optional[aspen_settings.Settings] = None) -> Client:
    """The client of the request whose environment is ENV."""
    user = env.get("REMOTE_USER")
    if user:
        return Client(USER, user)
    proxies = (s or aspen_settings.of(env)).trusted_proxies
    raw = env.get("REMOTE_ADDR") or ""
    if not proxies and _ipv4(raw):
        return Client(ADDRESS, raw)
    peer = _address(raw) if raw else None
    if raw and peer is None:
        return Client(ADDRESS, raw)                      # not an address: counted as given
    forwarded = env.get("HTTP_X_FORWARDED_FOR")
    if forwarded and proxies and _trusted(peer, proxies):
        for item in reversed(forwarded.split(",")):
            hop = _address(item)
            if hop is None:
                break
            peer = hop
            if not _trusted(hop, proxies):
                break
    return Client(ADDRESS, _name(peer) if peer is not None else "-")
