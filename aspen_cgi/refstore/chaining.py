"""The hash chain over the store's versions (model/chain.py): sealing each
version once it is done, inside the transaction that made it done, and
checking the chain against the rows as they are now."""

from __future__ import annotations

from typing import Iterator, Optional

from ..model import chain
from ..model.versions import ChainReport
from . import db


def text_now(conn: db.Conn, version: int, prev: str) -> Optional[str]:
    """VERSION's canonical text from its rows as they are now (None: no such version)."""
    row = db.version_row(conn, version)
    if row is None:
        return None
    kind, who, at, push_id = row
    updates = [(r, o, n, bool(f)) for r, o, n, f, _, _ in db.version_updates(conn, version)]
    return chain.text(version, prev, kind, who, at, push_id, updates,
                      db.push_cert_text(conn, version) if kind == "push" else None)


def seal(conn: db.Conn) -> int:
    """Chain every done version not chained yet, in order, up to the first
    pending one (inside a write transaction). Returns how many."""
    tail = db.chain_tail(conn)
    start_from = int(db.get_state(conn, "chain_from") or "1")
    after, prev = tail if tail is not None else (start_from - 1, chain.START_PREV)
    sealed = 0
    for vid, *_ in db.unchained_done(conn, after):
        body = text_now(conn, vid, prev)
        assert body is not None                 # a done version unchained_done() just listed
        h = chain.digest(body)
        db.insert_link(conn, vid, prev, h, tail is None and sealed == 0, body)
        prev = h
        sealed += 1
    return sealed


def links(conn: db.Conn) -> Iterator[chain.Link]:
    """Every link, oldest first, read in batches."""
    after = 0
    while True:
        batch = db.chain_links(conn, after, 2000)
        for v, p, h, st, t in batch:
            yield chain.Link(v, p, h, bool(st), t)
        if len(batch) < 2000:
            return
        after = batch[-1][0]


def check(conn: db.Conn) -> ChainReport:
    """The chain end to end: each link as model/chain.first_break checks it,
    each link's text as the rows give it now, and no done version after the
    start left out of it."""
    rep = ChainReport()
    with db.reading(conn) as c:
        rep.starts_at = int(db.get_state(c, "chain_from") or "1")
        rep.latest = db.latest_version(c)
        every = list(links(c))
        now = {link.version: text_now(c, link.version, link.prev) for link in every}
        tail = every[-1].version if every else rep.starts_at - 1
        unchained = db.unchained_done(c, tail)
    rep.links = len(every)
    rep.first = every[0].version if every else None
    rep.last = every[-1].version if every else None
    broken = chain.first_break(every, now)
    if broken is None and every and every[0].version != rep.starts_at:
        broken = (every[0].version, f"the chain starts at version {rep.starts_at}, not here")
    if broken is None and unchained:
        broken = (unchained[0][0], "a done version after the chain's end is not chained")
    rep.broken_at, rep.why = broken if broken is not None else (None, None)
    return rep
