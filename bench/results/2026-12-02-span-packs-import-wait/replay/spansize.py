import os
import sys
import tempfile

sys.path.insert(0, "/work/main")
import subprocess

from aspen_cgi import responder
from aspen_cgi.packs import spanpack
from aspen_cgi.planner.plan import Plan, plan
from aspen_cgi.protocol.requests import FetchRequest
from aspen_cgi.refstore import db
from aspen_cgi.refstore.history import StoreHistory
from aspen_cgi.refstore.store import RefStore

repo = sys.argv[1]
store = RefStore.open(repo, {}, create=False)
N = store.latest()
refs = db.refs_before(store.conn, N + 1)
out = subprocess.run(["git", "-C", repo, "for-each-ref", "--format=%(objectname) %(*objectname)"], capture_output=True, text=True).stdout.split("\n")
tags, adv = {}, set()
for l in out:
    if not l.strip(): continue
    p = l.split(" "); adv.add(p[0])
    if p[1]: tags[p[0]] = p[1]; adv.add(p[1])
caps = ["multi_ack_detailed", "thin-pack", "ofs-delta", "side-band-64k", "include-tag", "no-done"]
tmp = tempfile.mkdtemp()
rows = []
for k in range(2, N):
    for lag in (1, 2, 3, 5, 8, 13):
        if k + lag > N: continue
        old = db.refs_before(store.conn, k); new = db.refs_before(store.conn, k + lag)
        haves = sorted(set(old.values())); wants = sorted(set(new.values()) - set(haves))
        if not wants: continue
        req = FetchRequest(version=2, wants=wants, haves=haves, done=True, capabilities=caps)
        h = StoreHistory(store)
        r = plan(req, h, frozenset(adv), tags, None, frozenset(tags))
        if not isinstance(r, Plan): continue
        sp = responder.prepare(store.packs_dir, r, h.indexes)
        if not spanpack.worth(r.thin, r.packs, sp.size):
            sp.close(); continue
        values = [x for v in r.versions for x in h.version_values(v)]
        b = spanpack.make(repo, dict(os.environ), tmp, values, r.held)
        ext = len([n for n in r.packs if n])
        rows.append((ext, sp.size, b.size if b else None, sp.objects))
        sp.close()
import collections

print(len(rows))
by = collections.defaultdict(list)
for ext, s, b, o in rows:
    by[min(ext, 8)].append(s / b if b else 0)
for e in sorted(by):
    v = sorted(by[e]); print(e, len(v), "splice/span p50 %.3f p90 %.3f max %.3f" % (v[len(v)//2], v[int(len(v)*.9)], v[-1]), "span smaller in", sum(x > 1 for x in v))
for ext, s, b, o in sorted(rows, key=lambda r: -(r[1]/(r[2] or 1e9)))[:15]: print(ext, s, b, o, "%.3f" % (s/(b or 1e9)))
