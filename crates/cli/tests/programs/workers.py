"""A parent with a dataset and worker processes, each checking its data.

usage: workers.py START_METHOD WORKERS MIB [HOLD_SECONDS]

The parent builds MIB of distinct records and keeps them; each worker
(started with START_METHOD: spawn, forkserver or fork) builds its own MIB
of distinct records from its seed, reads them all back twice and returns a
checksum the parent recomputes; a worker started by fork also reads the
parent's records it inherited (pages the parent may have had evicted)
and returns their checksum too. With HOLD_SECONDS, each worker prints
"ready PID" and sleeps that long before it checks (a test kills one).
Prints "ok N workers" and exits 0 only if every checksum and the parent's
own data check out.
"""
import hashlib
import multiprocessing as mp
import os
import sys
import time

RECORD = 1000
# The parent's records: a forked worker inherits them.
MINE = None


def records(seed, mib):
    n = mib * (1 << 20) // RECORD
    return [hashlib.sha256(b"%d:%d" % (seed, i)).digest() * (RECORD // 32) for i in range(n)]


def checksum(recs):
    h = hashlib.sha256()
    for r in recs:
        h.update(r)
    return h.hexdigest()


def work(args):
    seed, mib, hold = args
    recs = records(seed, mib)
    if hold:
        print("ready", os.getpid(), flush=True)
        time.sleep(hold)
    first = checksum(recs)
    assert checksum(recs) == first
    inherited = checksum(MINE) if MINE is not None else None
    return seed, first, inherited


def main():
    method, workers, mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    hold = float(sys.argv[4]) if len(sys.argv) > 4 else 0
    global MINE
    mp.set_start_method(method)
    mine = records(10_000, mib)
    if method == "fork":
        MINE = mine
    with mp.Pool(workers) as pool:
        results = pool.map(work, [(s, mib, hold) for s in range(workers)], chunksize=1)
    want_mine = checksum(records(10_000, mib))
    bad = [s for s, c, _ in results if c != checksum(records(s, mib))]
    bad += [s for s, _, i in results if method == "fork" and i != want_mine]
    if bad or checksum(mine) != want_mine:
        print("bad data from workers", bad)
        sys.exit(1)
    print("ok", len(results), "workers")


if __name__ == "__main__":
    main()
