"""Co-scheduling as a program sees it (crates/cli/tests/cosched.rs).

Fills MIB MiB of distinct records and reads them back for SECONDS, one
thread of its own (with `idle-thread`: and a second one that waits all the
while, as a runtime's threads do), then reports, one line each:
  real-before / real-pinned / real-after: Cpus_allowed_list of this
      thread in /proc (the kernel's truth) at start, after the reads, and
      after it started a thread of its own;
  seen: os.sched_getaffinity(0) after the reads (what the program is told);
  nproc: what `nproc` started by subprocess (vfork + exec) counts;
  child: Cpus_allowed_list of a child made by os.fork();
  idle-real (with `idle-thread`): Cpus_allowed_list of the waiting thread
      after the reads;
and `cosched: ok` once every record read back right.
"""
import hashlib
import os
import subprocess
import sys
import threading
import time


def real():
    with open("/proc/thread-self/status") as f:
        for line in f:
            if line.startswith("Cpus_allowed_list:"):
                return line.split(":", 1)[1].strip()
    raise SystemExit("no Cpus_allowed_list")


def real_of(tid):
    with open("/proc/self/task/%d/status" % tid) as f:
        for line in f:
            if line.startswith("Cpus_allowed_list:"):
                return line.split(":", 1)[1].strip()
    raise SystemExit("no Cpus_allowed_list")


mib, seconds = int(sys.argv[1]), float(sys.argv[2])
idle = "idle-thread" in sys.argv[3:]
# wait-pin=N: after the reads, go on reading for up to N more seconds
# until this thread is pinned (a loaded machine may pin it late).
wait_pin = max([float(a[9:]) for a in sys.argv[3:] if a.startswith("wait-pin=")] or [0])
# until=PATH: after the reads, go on reading (90 s at most) until PATH
# exists (the test makes it once it saw this thread pinned and let go).
until = ([a[6:] for a in sys.argv[3:] if a.startswith("until=")] or [None])[0]
if idle:
    wake = threading.Event()
    waiter = threading.Thread(target=wake.wait)
    waiter.start()
print("real-before", real(), flush=True)
print("seen-before", ",".join(map(str, sorted(os.sched_getaffinity(0)))), flush=True)
blocks = []
digests = []
for k in range(mib):
    line = ("record %d of cosched.py, " % k).encode() * 40
    b = bytearray((line * (1 + (1 << 20) // len(line)))[: 1 << 20])
    blocks.append(b)
    digests.append(hashlib.sha256(b).digest())
step = 0


def read_some():
    global step
    for b in blocks[step % 7 :: 7]:
        for off in range(0, len(b), 4096):
            b[off] ^= 0  # read, and write the same byte back
    step += 1


end = time.monotonic() + seconds
end_wait = end + wait_pin
while time.monotonic() < end or (
    time.monotonic() < end_wait and not real().isdigit()
):
    read_some()
end_until = time.monotonic() + 90
while until and time.monotonic() < end_until and not os.path.exists(until):
    read_some()
print("real-pinned", real(), flush=True)
print("seen", ",".join(map(str, sorted(os.sched_getaffinity(0)))), flush=True)
if idle:
    print("idle-real", real_of(waiter.native_id), flush=True)
    wake.set()
    waiter.join()
print("nproc", subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip(), flush=True)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, real().encode())
    os._exit(0)
os.close(w)
print("child", os.read(r, 100).decode(), flush=True)
os.waitpid(pid, 0)
t = threading.Thread(target=time.sleep, args=(2,))
t.start()
time.sleep(0.5)
print("real-after", real(), flush=True)
t.join()
for b, d in zip(blocks, digests):
    if hashlib.sha256(b).digest() != d:
        raise SystemExit("cosched: a record read back wrong")
print("cosched: ok", flush=True)
