"""A signal sent to the process while every program thread blocks it stays
pending for the program: sigpending() sees it and sigwait() takes it.

The process has a second thread (a waiter) so that a runtime's helper
threads are not the only others; both program threads block the signal.
Data is stamped and checked so that the pager has pages to move.
Usage: sigpending.py MIB ROUNDS
"""
import hashlib
import os
import signal
import sys
import threading

mib, rounds = int(sys.argv[1]), int(sys.argv[2])
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1, signal.SIGUSR2])
stop = threading.Event()
waiter = threading.Thread(target=stop.wait)
waiter.start()

blocks = [bytearray(os.urandom(64)) * (1024 * 1024 // 64) for _ in range(mib)]
digests = [hashlib.sha256(b).digest() for b in blocks]

for n in range(rounds):
    for b in blocks:
        b[::4096] = b[::4096]
    sig = signal.SIGUSR1 if n % 2 == 0 else signal.SIGUSR2
    os.kill(os.getpid(), sig)
    pending = signal.sigpending()
    if pending != {sig}:
        print(f"round {n}: pending {pending}, expected {{{sig}}}", file=sys.stderr)
        sys.exit(1)
    got = signal.sigwait([sig])
    if got != sig:
        print(f"round {n}: sigwait took {got}", file=sys.stderr)
        sys.exit(1)

stop.set()
waiter.join()
bad = sum(hashlib.sha256(b).digest() != d for b, d in zip(blocks, digests))
if bad:
    print(f"{bad} blocks wrong", file=sys.stderr)
    sys.exit(1)
print(f"sigpending: ok {rounds}")
