"""UploadConfig.parse(): what upload-pack reads of a repository's
configuration (fetch/uploadconfig.py), tested without a server.

The configuration is the real RepoConfig, built with RepoConfig.parse()
from the bytes `git config -l -z` would print (name, newline, value, NUL;
a bare key has no newline): that parser starts no git, so no repository is
needed. Covers the allow bits in git's order, the advertised capabilities,
lsrefs.unborn, transfer.advertiseSID, the hidden refs of transfer.hideRefs
and uploadpack.hideRefs, and pack_threads_set.
"""

from __future__ import annotations

from typing import Optional

import pytest

from aspen_cgi.fetch.uploadconfig import ALLOW_ANY, ALLOW_REACHABLE, ALLOW_TIP, UploadConfig
from aspen_cgi.git.repoconfig import RepoConfig

ALL = ALLOW_TIP | ALLOW_REACHABLE | ALLOW_ANY
TIP = "uploadPack.allowTipSHA1InWant"
REACH = "uploadPack.allowReachableSHA1InWant"
ANY = "uploadPack.allowAnySHA1InWant"


def _config(*entries: tuple[str, Optional[str]]) -> RepoConfig:
    """A RepoConfig holding ENTRIES in order (value None: a bare key, which git reads as true)."""
    raw = b"".join((name if value is None else f"{name}\n{value}").encode() + b"\0" for name, value in entries)
    return RepoConfig.parse(raw)


def _parse(*entries: tuple[str, Optional[str]]) -> UploadConfig:
    return UploadConfig.parse(_config(*entries))


@pytest.fixture(autouse=True)
def no_sideband_all_from_env(monkeypatch):
    monkeypatch.delenv("GIT_TEST_SIDEBAND_ALL", raising=False)


# --- allowTipSHA1InWant, allowReachableSHA1InWant, allowAnySHA1InWant -----------

@pytest.mark.parametrize("entries, allow", [
    ((), 0),
    (((TIP, "true"),), ALLOW_TIP),
    (((REACH, "yes"),), ALLOW_REACHABLE),
    (((TIP, None),), ALLOW_TIP),                                  # a bare key is true
    (((TIP, "1"), (REACH, "on")), ALLOW_TIP | ALLOW_REACHABLE),
    (((ANY, "true"),), ALL),                                      # any sets all three
    (((ANY, "true"), (ANY, "false")), 0),                         # and a later false clears all three
    (((TIP, "true"), (REACH, "true"), (ANY, "false")), 0),
    (((ANY, "false"), (TIP, "true")), ALLOW_TIP),                 # in the order git reads them
    (((ANY, "true"), (TIP, "false")), ALLOW_REACHABLE | ALLOW_ANY),
    (((TIP, "true"), (TIP, "false")), 0),
    (((TIP, "maybe"),), 0),                                       # unparseable counts as false
    (((TIP, "true"), (TIP, "maybe")), 0),                         # ... and clears
    (((ANY, "true"), (ANY, "sometimes")), 0),
    (((TIP, "true"), ("uploadpack.other.allowtipsha1inwant", "false")), ALLOW_TIP),   # a subsection is another key
])
def test_allow_bits_in_gits_order(entries, allow):
    u = _parse(*entries)
    assert u.allow == allow
    assert u.caps.allow_tip == bool(allow & ALLOW_TIP)
    assert u.caps.allow_reachable == bool(allow & ALLOW_REACHABLE)


# --- capabilities ----------------------------------------------------------------

def test_capabilities_default_off():
    caps = _parse().caps
    assert (caps.allow_filter, caps.allow_ref_in_want, caps.allow_sideband_all, caps.packfile_uris) == \
        (False, False, False, False)
    assert caps.session_id is None
    assert caps.unborn == "advertise"
    assert caps.object_format == "sha1"


def test_capabilities_from_config():
    caps = _parse(("uploadpack.allowFilter", "true"), ("uploadPack.allowRefInWant", None),
                  ("uploadpack.allowSidebandAll", "1"), ("extensions.objectFormat", "sha256")).caps
    assert (caps.allow_filter, caps.allow_ref_in_want, caps.allow_sideband_all) == (True, True, True)
    assert caps.object_format == "sha256"


def test_capability_last_value_wins():
    caps = _parse(("uploadpack.allowfilter", "true"), ("uploadpack.allowfilter", "false")).caps
    assert caps.allow_filter is False


def test_sideband_all_from_the_test_environment(monkeypatch):
    monkeypatch.setenv("GIT_TEST_SIDEBAND_ALL", "1")
    assert _parse().caps.allow_sideband_all is True


@pytest.mark.parametrize("value, unborn", [
    ("advertise", "advertise"),
    ("allow", "allow"),
    ("ignore", "ignore"),
    ("bogus", "advertise"),          # an unknown value falls back to advertise
    ("", "advertise"),
])
def test_lsrefs_unborn(value, unborn):
    assert _parse(("lsrefs.unborn", value)).caps.unborn == unborn


def test_lsrefs_unborn_last_value_wins():
    assert _parse(("lsrefs.unborn", "ignore"), ("lsrefs.unborn", "allow")).caps.unborn == "allow"


def test_advertise_sid_gives_an_aspen_session_id():
    sid = _parse(("transfer.advertiseSID", "true")).caps.session_id
    assert sid is not None and sid.startswith("aspen-")
    assert len(sid) > len("aspen-")
    assert _parse(("transfer.advertiseSID", "false")).caps.session_id is None


# --- hidden refs ----------------------------------------------------------------------

def test_hidden_refs_from_transfer_and_uploadpack():
    hidden = _parse(
        ("transfer.hideRefs", "refs/hidden/"),                           # trailing '/' dropped
        ("uploadpack.hideRefs", "!refs/hidden/shown"),                   # a later negation wins
        ("uploadPack.hideRefs", "^refs/namespaces/ns/refs/secret"),      # '^': the full name
        ("receive.hideRefs", "refs/heads"),                              # another service's
        ("uploadpack.hideRefs", ""),                                     # empty: ignored
    ).hidden
    assert hidden
    assert hidden.hidden("refs/hidden/x") is True
    assert hidden.hidden("refs/hidden") is True
    assert hidden.hidden("refs/hiddenx") is False                        # a prefix only up to a '/'
    assert hidden.hidden("refs/hidden/shown") is False
    assert hidden.hidden("refs/hidden/shown/deeper") is False
    assert hidden.hidden("refs/hidden/shownx") is True
    assert hidden.hidden("refs/heads/main") is False
    assert hidden.hidden("refs/secret/a", "refs/namespaces/ns/refs/secret/a") is True
    assert hidden.hidden("refs/secret/a", "refs/namespaces/other/refs/secret/a") is False
    assert hidden.hidden("refs/secret/a") is False                       # '^' never matches the short name
    assert hidden.hidden("refs/namespaces/ns/refs/secret/a") is True     # no namespace: full name = name


def test_hidden_refs_order_crosses_the_two_keys():
    hidden = _parse(("uploadpack.hiderefs", "!refs/a"), ("transfer.hiderefs", "refs/a")).hidden
    assert hidden.hidden("refs/a/b") is True
    hidden = _parse(("transfer.hiderefs", "refs/a"), ("uploadpack.hiderefs", "!refs/a")).hidden
    assert hidden.hidden("refs/a/b") is False


def test_no_hidden_refs():
    hidden = _parse(("receive.hiderefs", "refs/heads")).hidden
    assert not hidden
    assert hidden.hidden("refs/heads/main") is False


# --- pack.threads ---------------------------------------------------------------------

@pytest.mark.parametrize("entries, is_set", [
    ((), False),
    ((("pack.threads", "4"),), True),
    ((("Pack.Threads", "0"),), True),
    ((("pack.threadsx", "4"),), False),
])
def test_pack_threads_set(entries, is_set):
    assert _parse(*entries).pack_threads_set is is_set
