# A Python dict of records made from the lines of a real text file, read
# back at random and checked.
#
# usage: python3 pydict.py CORPUS RECORDS LOOKUPS
#
# Record i holds line i of CORPUS (cycled) with its number appended, and the
# CRC-32 of that text. LOOKUPS keys drawn at random (seeded) are read back
# and each record's text checked against its CRC. Prints
# "pydict: ok RECORDS LOOKUPS SUM" and exits 0 only if every record checks
# out (a page of the heap read back wrong fails a record).
import random, sys, zlib

corpus, records, lookups = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(corpus, "rb") as f:
    lines = f.read().decode("utf-8", "replace").splitlines()
lines = [l for l in lines if l.strip()]
if not lines:
    sys.exit("pydict: the corpus has no text")
d = {}
for i in range(records):
    text = "%s #%d" % (lines[i % len(lines)], i)
    d[i] = (i, text, zlib.crc32(text.encode()))
del lines
rng = random.Random(20261126)
total = 0
for _ in range(lookups):
    k = rng.randrange(records)
    key, text, crc = d[k]
    if key != k or zlib.crc32(text.encode()) != crc:
        print("pydict: record %d is wrong" % k)
        sys.exit(1)
    total += len(text)
print("pydict: ok %d %d %d" % (records, lookups, total))
