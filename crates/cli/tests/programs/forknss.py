"""Forks from a threaded process whose C library's own data is cold.

glibc's fork() reads its name-service state (a heap block of the C
library's own, made by the getpwuid below) after every pthread_atfork
prepare hook has run, in a process with more than one thread. Under a
budget, that block is evicted while the data below is touched, so the
forks find it stored. Each child checks a block of the parent's data
and exits; the parent checks every block at the end.
Usage: forknss.py MIB FORKS
"""
import hashlib
import os
import pwd
import sys
import threading

mib, forks = int(sys.argv[1]), int(sys.argv[2])
pwd.getpwuid(os.getuid())
stop = threading.Event()
waiter = threading.Thread(target=stop.wait)
waiter.start()

blocks = []
for i in range(mib):
    line = (f"block {i:6d} of the forking parent's data\n" * 25).encode()
    blocks.append(bytearray((line * (1024 * 1024 // len(line) + 1))[: 1024 * 1024]))
digests = [hashlib.sha256(b).digest() for b in blocks]

for n in range(forks):
    # Touch every page of the data: the cold C library block goes out.
    for b in blocks:
        b[::4096] = b[::4096]
    pid = os.fork()
    if pid == 0:
        i = n % mib
        os._exit(0 if hashlib.sha256(blocks[i]).digest() == digests[i] else 3)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        print(f"fork {n}: child exited with status {status:#x}", file=sys.stderr)
        sys.exit(1)

stop.set()
waiter.join()
bad = sum(hashlib.sha256(b).digest() != d for b, d in zip(blocks, digests))
if bad:
    print(f"{bad} blocks wrong", file=sys.stderr)
    sys.exit(1)
print(f"ok: {forks} forks, {mib} MiB checked")
