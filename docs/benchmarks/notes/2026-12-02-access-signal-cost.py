import mmap, time, os
N = 512 << 20
m = mmap.mmap(-1, N, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
C = 512 << 10
split = os.environ.get("SPLIT", "1") == "1"
if split:
    for off in range(C, N, 2 * C):
        m.madvise(mmap.MADV_RANDOM, off, C)
res = int(os.environ.get("RES_MIB", "128")) << 20
for off in range(0, N, 4096 * (N // res)):
    m[off] = 1
def t(f, n=5):
    best = 1e9
    for _ in range(n):
        s = time.perf_counter(); f(); best = min(best, time.perf_counter() - s)
    return best * 1e3
def clear():
    with open("/proc/self/clear_refs", "w") as f: f.write("2")
def smaps():
    with open("/proc/self/smaps", "rb") as f: return len(f.read())
def rollup():
    with open("/proc/self/smaps_rollup", "rb") as f: return len(f.read())
def maps():
    with open("/proc/self/maps", "rb") as f: return len(f.read())
print(f"split={split} res={res>>20}MiB vmas={maps() and open('/proc/self/maps').read().count(chr(10))} clear {t(clear):.2f} ms smaps {t(smaps):.2f} ms ({smaps()} B) rollup {t(rollup):.2f} ms maps {t(maps):.2f} ms")
