"""Device time by kernel from an `ncu --metrics gpu__time_duration.sum --csv` log: total, count and share
per kernel name, the largest first.

    ncu --metrics gpu__time_duration.sum --csv --log-file ncu.csv python3 ... ; python3 ncu_by_kernel.py ncu.csv
"""
import collections
import csv
import sys


def main(path, top=25):
    rows = [r for r in csv.reader(open(path)) if len(r) > 10]
    head = rows[0]
    name, unit, value = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
    total, count = collections.Counter(), collections.Counter()
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
    for r in rows[1:]:
        key = r[name][:90]
        total[key] += float(r[value].replace(",", "")) * scale[r[unit]]
        count[key] += 1
    whole = sum(total.values())
    print(f"{whole:.1f} us in {sum(count.values())} kernels")
    for key, us in total.most_common(top):
        print(f"{us:9.1f} us {100 * us / whole:5.1f}% x{count[key]:4d}  {key}")


if __name__ == "__main__":
    main(sys.argv[1])
