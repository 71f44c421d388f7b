"""Who a request comes from, for fairness between clients (runtime/admission.py):
the authenticated user when the server authenticated one (REMOTE_USER), else
the client's address (an IPv6 address by its /64, as one host holds a whole
/64). http/client.py reads it from the request once; below, it is only this
value. Its TAG names the client's admission files without its address."""

from __future__ import annotations

from dataclasses import dataclass

USER = "user"
ADDRESS = "addr"


@dataclass(frozen=True)
class Client:
    kind: str       # USER or ADDRESS
    name: str       # the user name, or the address ("2001:db8:1:2::/64" for IPv6; "-" when none was given)

    @property
    def label(self) -> str:
        """As the access line and the server's log name it: `user:alice`, `addr:10.0.0.7`."""
        return f"{self.kind}:{self.name}"

    @property
    def tag(self) -> str:
        """A fixed-length name for files: 16 hex digits of the label's SHA-256."""
        import hashlib  # startup: only a request that goes to admission names its files
        return hashlib.sha256(self.label.encode("utf-8", "surrogateescape")).hexdigest()[:16]
