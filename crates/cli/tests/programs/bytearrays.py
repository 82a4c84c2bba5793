"""Builds MIB distinct 1 MiB bytearrays, then reads them all back three
times, checking each against its CRC-32.

usage: bytearrays.py MIB

Each 4 KiB page of a block is 1.5 KiB of seeded random bytes followed by
text, so pages compress to about 40 %: under a budget a third of the data,
the pool fills and the backing file is written to. Prints "ok MIB" and
exits 0 only if every block checks out.
"""
import random
import sys
import zlib


def block(i):
    r = random.Random(i)
    page = lambda: r.randbytes(1536) + b"uzswap " * 365 + b"u"
    return bytearray(b"".join(page() for _ in range(256)))


def main():
    mib = int(sys.argv[1])
    blocks, sums = [], []
    for i in range(mib):
        b = block(i)
        blocks.append(b)
        sums.append(zlib.crc32(b))
    for _ in range(3):
        for i, b in enumerate(blocks):
            if zlib.crc32(b) != sums[i]:
                sys.exit(f"block {i} changed")
    print("ok", mib)


main()
