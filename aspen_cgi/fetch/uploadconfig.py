"""upload-pack's configuration, parsed once per request from the
repository's (as stock's upload_pack_config() fills upload_pack_data): which
wants are allowed (allowTipSHA1InWant, allowReachableSHA1InWant,
allowAnySHA1InWant, in the order git reads them), the capabilities the
advertisements offer, the hidden refs."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .. import AGENT
from ..git.repoconfig import ConfigError, RepoConfig, parse_bool
from ..model.refs import HiddenRefs
from ..protocol import advertise as adv

ALLOW_TIP, ALLOW_REACHABLE, ALLOW_ANY = 1, 2, 4
ALLOW_BITS = {"uploadpack.allowtipsha1inwant": ALLOW_TIP,
            "uploadpack.allowreachablesha1inwant": ALLOW_REACHABLE,
            "uploadpack.allowanysha1inwant": ALLOW_TIP | ALLOW_REACHABLE | ALLOW_ANY}


def _allow_uor(config) -> int:
    """upload_pack_config()'s allow_uor: each setting sets or clears its bits
    in the order git reads them (allowAnySHA1InWant=false clears all three)."""
    allow = 0
    for key, value in config.entries:
        bits = ALLOW_BITS.get(key)
        if bits is None:
            continue
        try:
            on = parse_bool(value)
        except ConfigError:
            on = False
        allow = (allow | bits) if on else (allow & ~bits)
    return allow


@dataclass(frozen=True)
class UploadConfig:
    """What upload-pack reads of the repository's configuration."""
    allow: int                  # allow_uor: ALLOW_* bits
    caps: adv.UploadCaps        # what the advertisements offer
    hidden: HiddenRefs          # transfer.hideRefs and uploadpack.hideRefs
    pack_threads_set: bool      # pack.threads is configured (else git's delta search runs single-threaded)

    @classmethod
    def parse(cls, c: RepoConfig) -> "UploadConfig":
        allow = _allow_uor(c)
        return cls(allow, _caps(c, allow), HiddenRefs.from_config(c, "uploadpack"), c.has("pack.threads"))


def _caps(c: RepoConfig, allow: int) -> adv.UploadCaps:
    unborn = (c.get("lsrefs.unborn") or "advertise").lower()
    return adv.UploadCaps(
        allow_tip=bool(allow & ALLOW_TIP),
        allow_reachable=bool(allow & ALLOW_REACHABLE),
        allow_filter=c.bool("uploadpack.allowfilter", False),
        allow_ref_in_want=c.bool("uploadpack.allowrefinwant", False),
        allow_sideband_all=c.bool("uploadpack.allowsidebandall", False) or os.environ.get("GIT_TEST_SIDEBAND_ALL") == "1",
        packfile_uris=c.get("uploadpack.blobpackfileuri") is not None,
        session_id=_session_id() if c.bool("transfer.advertisesid", False) else None,
        unborn=unborn if unborn in ("advertise", "allow", "ignore") else "advertise",
        agent=AGENT,
        object_format=c.object_format,
    )


def _session_id() -> str:
    import uuid  # startup: imported only when asked: uuid costs a CGI start-up milliseconds
    return f"aspen-{uuid.uuid4().hex}"
