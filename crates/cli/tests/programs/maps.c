/* Anonymous mappings the program manages itself: mmap, write, munmap part,
 * mremap (grow in place or moved), madvise(MADV_DONTNEED). Pages must keep
 * what was written, and a discarded page must read as zeros.
 * Usage: maps MIB ROUNDS; exits 0 when all holds, 1 otherwise. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define PG 4096
static long bad;

static void stamp(unsigned char *p, size_t pages, uint64_t tag) {
    for (size_t i = 0; i < pages; i++) {
        unsigned char *q = p + i * PG;
        for (size_t j = 0; j < PG; j += 8) {
            uint64_t v = (tag << 32) ^ (i * 131 + j / 8) * 2654435761u;
            v &= 0x00ff00ff00ff00ffull; /* compressible, never uniform */
            memcpy(q + j, &v, 8);
        }
    }
}

static void expect(const unsigned char *p, size_t pages, uint64_t tag, size_t first) {
    unsigned char want[PG];
    for (size_t i = 0; i < pages; i++) {
        for (size_t j = 0; j < PG; j += 8) {
            uint64_t v = (tag << 32) ^ ((first + i) * 131 + j / 8) * 2654435761u;
            v &= 0x00ff00ff00ff00ffull;
            memcpy(want + j, &v, 8);
        }
        if (memcmp(want, p + i * PG, PG) != 0)
            bad++;
    }
}

static void zeros(const unsigned char *p, size_t pages) {
    for (size_t i = 0; i < pages * PG; i++)
        if (p[i]) {
            bad++;
            return;
        }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: maps MIB ROUNDS\n");
        return 2;
    }
    size_t pages = (strtoul(argv[1], 0, 10) << 20) / PG;
    int rounds = atoi(argv[2]);
    for (int r = 0; r < rounds; r++) {
        unsigned char *a = mmap(0, pages * PG, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        unsigned char *b = mmap(0, pages * PG, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (a == MAP_FAILED || b == MAP_FAILED) {
            perror("mmap");
            return 2;
        }
        stamp(a, pages, 1 + r);
        stamp(b, pages, 100 + r);
        expect(a, pages, 1 + r, 0);
        /* Discard the middle half of a: zeros there, data around it. */
        size_t q = pages / 4;
        madvise(a + q * PG, 2 * q * PG, MADV_DONTNEED);
        zeros(a + q * PG, 2 * q * PG / PG);
        expect(a, q, 1 + r, 0);
        expect(a + 3 * q * PG, pages - 3 * q, 1 + r, 3 * q);
        /* Unmap b's first quarter, then map fresh memory there. */
        munmap(b, q * PG);
        unsigned char *c = mmap(b, q * PG, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        if (c != b) {
            perror("mmap fixed");
            return 2;
        }
        zeros(c, q);
        expect(b + q * PG, pages - q, 100 + r, q);
        /* Grow the rest of b (may move): old contents follow, new tail zero. */
        unsigned char *d = mremap(b + q * PG, (pages - q) * PG, 2 * pages * PG, MREMAP_MAYMOVE);
        if (d == MAP_FAILED) {
            perror("mremap");
            return 2;
        }
        expect(d, pages - q, 100 + r, q);
        zeros(d + (pages - q) * PG, pages + q);
        /* Shrink a in place. */
        unsigned char *e = mremap(a, pages * PG, q * PG, 0);
        if (e != a) {
            perror("mremap shrink");
            return 2;
        }
        expect(a, q, 1 + r, 0);
        munmap(a, q * PG);
        munmap(c, q * PG);
        munmap(d, 2 * pages * PG);
    }
    printf("maps: %d rounds, %ld bad pages\n", rounds, bad);
    return bad ? 1 : 0;
}
