"""Starts children the way that closes every descriptor before exec.

python3 closefds.py MIB N: builds MIB MiB of records, then runs /bin/true
N times with subprocess and a preexec_fn (which makes Python fork, not
vfork, and close every descriptor but the child's own before exec), then
checks every record. Prints "closefds: ok N" when all is right.
"""
import subprocess
import sys
import zlib

mib, n = int(sys.argv[1]), int(sys.argv[2])
records = [(b"%08d" % i) * 128 for i in range(mib * 1024)]
sums = [zlib.crc32(r) for r in records]
for _ in range(n):
    subprocess.run(["/bin/true"], preexec_fn=lambda: None, check=True)
bad = sum(1 for r, s in zip(records, sums) if zlib.crc32(r) != s)
print("closefds: %s %d" % ("ok" if bad == 0 else "WRONG %d" % bad, n), flush=True)
sys.exit(1 if bad else 0)
