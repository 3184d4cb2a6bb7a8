"""Allocation-heavy Python for bench/real-programs: usage alloc.py N.

Records built as dicts, strings joined and split, a JSON round trip per
batch, lists sorted and grouped; blocks above pymalloc's 512 bytes (string
joins, list and dict growth, JSON text) go to malloc. Prints a checksum
that does not depend on the hash seed.
"""
import json, sys

n = int(sys.argv[1])
groups, total = {}, 0
for batch in range(n // 1000):
    rows = []
    for i in range(batch * 1000, batch * 1000 + 1000):
        key = "k%05d" % (i * 7919 % 50000)
        rows.append({"id": i, "key": key, "text": key * (i % 200 + 1), "vals": list(range(i % 150))})
    text = json.dumps(rows)
    back = json.loads(text)
    total += len(text) + sum(len(r["vals"]) for r in back)
    for r in sorted(back, key=lambda r: r["key"]):
        groups.setdefault(r["key"][:4], []).append(r["text"][:64])
    if len(groups) > 20:
        total += sum(len(",".join(v)) for v in groups.values())
        groups = {}
print(n, total)
