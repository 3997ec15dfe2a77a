# The finalist records (remeasure) of a records export: workload, template, config, time, vendor, samples.
import json, sys
print("workload\ttemplate\tconfig\tmedian_us\tbaseline_us\tbaseline_kind\tsamples_us")
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r.get('remeasure'):
        print("\t".join([r['workload'], r['template'], json.dumps(r['config'], separators=(',', ':')), "%.4f" % r['median_us'],
                         "%.4f" % (r['baseline_us'] or 0), r['baseline_kind'][:40], " ".join("%.3f" % s for s in r['samples_us'])]))
