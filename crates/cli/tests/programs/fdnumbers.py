"""Lists the descriptor numbers below 256 a process has open, as CPython's
fd_status.py does (fstat of each number), in three places: the program
after its memory was built and evicted, a forked child after building its
own, and an exec'd child at its start.

python3 fdnumbers.py MIB: builds MIB MiB of records in the parent (and a
quarter of that in the forked child), then prints one line each:
"parent: 0,1,2,...", "forked: ...", "exec: ...", then checks every record
and prints "fdnumbers: ok" when all is right. The lines are compared with
the same script's unmanaged: a runtime's descriptor among them is one the
program would meet.
"""
import os
import subprocess
import sys
import time
import zlib

LIST = (
    "import os\n"
    "fds = []\n"
    "for fd in range(256):\n"
    "    try:\n"
    "        os.fstat(fd)\n"
    "    except OSError:\n"
    "        continue\n"
    "    fds.append(fd)\n"
    "print(','.join(map(str, fds)))\n"
)


def numbers():
    out = []
    for fd in range(256):
        try:
            os.fstat(fd)
        except OSError:
            continue
        out.append(fd)
    return ",".join(map(str, out))


def build(mib):
    records = [(b"%08d" % i) * 128 for i in range(mib * 1024)]
    return records, [zlib.crc32(r) for r in records]


def bad(records, sums):
    return sum(1 for r, s in zip(records, sums) if zlib.crc32(r) != s)


mib = int(sys.argv[1])
records, sums = build(mib)
# Let the evictor go idle: what is left open then is what stays.
time.sleep(0.5)
print("parent:", numbers(), flush=True)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    mine, my_sums = build(mib // 4)
    time.sleep(0.5)
    # The pipe's write end is the child's own: left out of its line.
    line = "forked: " + ",".join(n for n in numbers().split(",") if n != str(w))
    ok = bad(mine, my_sums) == 0 and bad(records, sums) == 0
    os.write(w, (line + ("\n" if ok else " WRONG\n")).encode())
    os._exit(0 if ok else 1)
os.close(w)
with os.fdopen(r) as f:
    print(f.read().strip(), flush=True)
_, status = os.waitpid(pid, 0)
out = subprocess.run(
    [sys.executable, "-c", LIST], capture_output=True, text=True, check=True
).stdout
print("exec:", out.strip(), flush=True)
wrong = bad(records, sums)
ok = wrong == 0 and status == 0
print("fdnumbers: %s" % ("ok" if ok else "WRONG %d" % wrong), flush=True)
sys.exit(0 if ok else 1)
