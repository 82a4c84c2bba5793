/* Fills and verifies heap memory from several threads, through every member
 * of the malloc family; exits 0 when every byte read back is the byte
 * written, 1 otherwise. Usage: fill MIB THREADS PASSES */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t per_thread;
static int passes;
static long bad_total;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* Text-like bytes: words of a small vocabulary picked by a xorshift
 * generator seeded from (thread, block, pass), so pages compress about as
 * well as program data does, and each page differs. */
static const char *words[] = {"the ", "page ", "swap ", "cache ", "memory ", "of ",
                              "and ", "pool ", "zsmalloc ", "fault ", "region ", "42 ",
                              "\n", "{\"k\": ", "0x7f3a, ", "return "};

static uint64_t next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void fill(unsigned char *p, size_t n, uint64_t seed) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    size_t i = 0;
    while (i < n) {
        const char *w = words[next(&s) & 15];
        while (*w && i < n)
            p[i++] = (unsigned char)*w++;
    }
}

static long check(const unsigned char *p, size_t n, uint64_t seed) {
    unsigned char buf[4096];
    long bad = 0;
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    size_t i = 0, k = 0;
    /* regenerate in chunks */
    while (i < n) {
        const char *w = words[next(&s) & 15];
        while (*w && i < n) {
            buf[k++] = (unsigned char)*w++;
            i++;
            if (k == sizeof buf) {
                if (memcmp(buf, p + i - k, k) != 0)
                    bad++;
                k = 0;
            }
        }
    }
    if (k && memcmp(buf, p + i - k, k) != 0)
        bad++;
    return bad;
}

struct blk {
    unsigned char *p;
    size_t n;
};

static void *worker(void *arg) {
    long t = (long)arg;
    size_t nblk = 0, cap = 1024, used = 0;
    struct blk *b = malloc(cap * sizeof *b);
    uint64_t s = 77 + (uint64_t)t;
    /* Sizes from 24 bytes to 2 MiB, through every allocation call. */
    while (used < per_thread) {
        size_t r = next(&s);
        size_t n = (r & 3) == 0 ? (1 << 20) + (r >> 40) % (1 << 20) : 24 + (r >> 32) % 6000;
        void *p;
        switch ((r >> 8) % 5) {
        case 0: p = malloc(n); break;
        case 1: p = calloc(1, n); break;
        case 2: if (posix_memalign(&p, 64, n)) p = NULL; break;
        case 3: p = aligned_alloc(4096, (n + 4095) & ~(size_t)4095); break;
        default: p = realloc(malloc(n / 2 + 1), n); break;
        }
        if (!p) {
            fprintf(stderr, "fill: out of memory\n");
            exit(2);
        }
        if (nblk == cap) {
            cap *= 2;
            b = realloc(b, cap * sizeof *b);
        }
        b[nblk].p = p;
        b[nblk].n = n;
        nblk++;
        used += n;
    }
    long bad = 0;
    for (int pass = 0; pass < passes; pass++) {
        for (size_t i = 0; i < nblk; i++)
            fill(b[i].p, b[i].n, ((uint64_t)t << 40) ^ (i << 8) ^ (uint64_t)pass);
        for (size_t i = 0; i < nblk; i++)
            bad += check(b[i].p, b[i].n, ((uint64_t)t << 40) ^ (i << 8) ^ (uint64_t)pass);
        /* Grow a tenth of the blocks in place or by moving; contents kept. */
        for (size_t i = 0; i < nblk; i += 10) {
            unsigned char *q = realloc(b[i].p, b[i].n + 4096);
            if (!q) exit(2);
            bad += check(q, b[i].n, ((uint64_t)t << 40) ^ (i << 8) ^ (uint64_t)pass);
            b[i].p = q;
        }
    }
    for (size_t i = 0; i < nblk; i++)
        free(b[i].p);
    free(b);
    pthread_mutex_lock(&lock);
    bad_total += bad;
    pthread_mutex_unlock(&lock);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: fill MIB THREADS PASSES\n");
        return 2;
    }
    size_t mib = strtoul(argv[1], 0, 10);
    int threads = atoi(argv[2]);
    passes = atoi(argv[3]);
    per_thread = (mib << 20) / threads;
    pthread_t th[64];
    for (long t = 0; t < threads; t++)
        pthread_create(&th[t], NULL, worker, (void *)t);
    for (int t = 0; t < threads; t++)
        pthread_join(th[t], NULL);
    printf("fill: %zu MiB, %d threads, %d passes, %ld bad chunks\n", mib, threads, passes,
           bad_total);
    return bad_total ? 1 : 0;
}
