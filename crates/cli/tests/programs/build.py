"""Builds MIB of Python objects (dicts, strings, lists, bytes), then walks
them several times checking a digest taken when they were built.
Usage: build.py MIB PASSES; exits 0 when every digest matches, 1 otherwise."""
import hashlib
import sys

mib, passes = int(sys.argv[1]), int(sys.argv[2])
words = open(__file__).read().split()
records, digests, size = [], [], 0
i = 0
while size < mib << 20:
    rec = {
        "id": i,
        "name": " ".join(words[(i * 7 + k) % len(words)] for k in range(12)),
        "values": [i * k for k in range(40)],
        "blob": hashlib.sha256(str(i).encode()).digest() * 16,
    }
    records.append(rec)
    digests.append(hashlib.sha256(repr(rec).encode()).digest())
    size += 1200
    i += 1
bad = 0
for p in range(passes):
    for rec, d in zip(records, digests):
        if hashlib.sha256(repr(rec).encode()).digest() != d:
            bad += 1
    # Replace a fifth of the records: fresh objects, old ones freed.
    for j in range(p % 5, len(records), 5):
        rec = dict(records[j])
        rec["values"] = list(rec["values"])
        records[j] = rec
print(f"build.py: {len(records)} records, {passes} passes, {bad} bad")
sys.exit(1 if bad else 0)
