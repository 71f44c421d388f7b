import cProfile
import pstats
import random
import subprocess
import sys
import time

sys.path.insert(0, __import__("os").environ.get("SRC", "/work/main"))
from aspen_cgi.planner.plan import plan
from aspen_cgi.protocol.requests import FetchRequest
from aspen_cgi.refstore import db
from aspen_cgi.refstore.history import StoreHistory
from aspen_cgi.refstore.store import RefStore

repo = sys.argv[1]; n = int(sys.argv[2]); prof = len(sys.argv) > 3
store = RefStore.open(repo, {}, create=False)
N = store.latest()
refs = db.refs_before(store.conn, N + 1)
out = subprocess.run(["git", "-C", repo, "for-each-ref", "--format=%(objectname) %(*objectname)"], capture_output=True, text=True).stdout.split("\n")
tags = {}
adv = set()
for l in out:
    if not l.strip(): continue
    p = l.split(" ")
    adv.add(p[0])
    if p[1]: tags[p[0]] = p[1]; adv.add(p[1])
print("versions", N, "refs", len(refs))
caps = ["multi_ack_detailed", "thin-pack", "ofs-delta", "side-band-64k", "include-tag", "no-done"]
random.seed(1)
times = []; res = []
pr = cProfile.Profile() if prof else None
for i in range(n):
    k = random.randint(max(2, N - 200), N)
    old = db.refs_before(store.conn, k)
    haves = sorted(set(old.values()))
    wants = sorted(set(refs.values()) - set(haves))
    if not wants: continue
    req = FetchRequest(version=2, wants=wants, haves=haves, done=False, capabilities=caps)
    h = StoreHistory(store)
    if pr: pr.enable()
    t0 = time.perf_counter()
    r = plan(req, h, frozenset(adv), tags, None, frozenset(tags))
    dt = (time.perf_counter() - t0) * 1e3
    if pr: pr.disable()
    times.append(dt); res.append((dt, k, type(r).__name__, getattr(r, "reason", ""), r.lookups, r.versions_visited))
times.sort()
print("n", len(times), "p50 %.2f p90 %.2f p99 %.2f max %.2f ms" % (times[len(times)//2], times[int(len(times)*.9)], times[int(len(times)*.99)], times[-1]))
for x in sorted(res)[-8:]: print(x)
if pr: pstats.Stats(pr).sort_stats("tottime").print_stats(30)
if pr:
    st = pstats.Stats(pr); st.sort_stats("cumulative"); st.print_callees("_candidate"); st.print_callees("discharge")
