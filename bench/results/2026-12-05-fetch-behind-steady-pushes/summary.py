import json
import sys

for d in sys.argv[1:]:
    ops=[];pushes=[]
    for line in open(d+'/raw.jsonl'):
        r=json.loads(line); ex=r.get('extra') or {}
        ops+=ex.get('ops') or []
        pushes+=[p for p in ex.get('pushes') or [] if (p['target'],p['j']) not in {(x['target'],x['j']) for x in pushes}]
    def q(xs,p): xs=sorted(xs); return xs[min(len(xs)-1,int(p*len(xs)))]
    by={}
    for o in ops:
        if o['shape']=='fetch-behind' and o['ok']: by.setdefault(o['target'],{})[o['event']]=o
    t=sorted(by)
    print(d)
    for k in t:
        w=[o['wall_ms'] for o in by[k].values()]
        pw=[p['wall_ms'] for p in pushes if p['target']==k]
        plans={}
        for o in by[k].values(): plans[o.get('plan')]=plans.get(o.get('plan'),0)+1
        print(f"  {k:8} n={len(w)} p50={q(w,.5):.1f} p90={q(w,.9):.1f} p99={q(w,.99):.1f} max={max(w):.1f} | push p50={q(pw,.5):.1f} p99={q(pw,.99):.1f} max={max(pw):.1f} {plans}")
    for a,b in (('aspen','stock'),('aspen-apache','stock-apache')):
      if a in by and b in by:
        r=[by[a][e]['wall_ms']/by[b][e]['wall_ms'] for e in by[a] if e in by[b]]
        print(f"  per-event ratio p50={q(r,.5):.2f} p90={q(r,.9):.2f} p99={q(r,.99):.2f} max={max(r):.2f}")
