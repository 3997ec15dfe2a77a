import sys, re
for f in sys.argv[1:]:
    rows=[]; on=False
    for l in open(f):
        if l.startswith('workload '): on=True; continue
        if on and re.match(r'^\d+x\d+x\d+ ', l):
            p=l.split()
            key=" ".join(p[0:3]); vs=float(p[13]); rows.append((key,vs,p[4],p[6],p[9],p[11]))
        elif on: on=False
    vs=[r[1] for r in rows]
    miss=[f"{r[0]} {r[1]:.3f} (ours {r[2]}/{r[3]}, vendor {r[4]}/{r[5]})" for r in rows if abs(r[1]-1)>0.03]
    hdr=open(f).readline()
    m=re.search(r'over (\d+) placements(?: \(timing buffers ([^)]*)\))?', hdr)
    pl = m.group(1) if m else '?'; al = (m.group(2) if m and m.group(2) else 'packed')
    print(f"{f.split('/')[-1]:28s} P={pl} {al:14s} {sum(abs(v-1)<=0.03 for v in vs)}/{len(vs)} vs-rec {min(vs):.3f}..{max(vs):.3f}  miss: {'; '.join(miss)}")
