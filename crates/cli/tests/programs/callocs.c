/* calloc under uzswap: every block reads as zeros, also where it reuses
 * memory the program wrote and uzswap evicted; and a large block reusing
 * written memory holds only the pages the program touches.
 *
 * usage: callocs ROUNDS LIVE_MIB
 *   ROUNDS times: calloc a block of 4 KiB to 2 MiB (sizes from a fixed
 *   generator, most of them 64 KiB or more), check that every byte is
 *   zero, fill it, keep it among LIVE_MIB MiB of live blocks (freeing the
 *   oldest), and check every live block's bytes at the end. Then the
 *   sparse check: fill and free 64 blocks of 1 MiB, calloc 64 blocks of
 *   1 MiB (which reuse that memory), write one byte of each, and report
 *   RssAnon. Prints "ok ROUNDS rss_anon_kib=N" and exits 0 only if every
 *   check passed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>

static uint64_t state = 88172645463325252ull;
static uint64_t next(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
}

static unsigned char tag(size_t i) { return (unsigned char)(i * 131 + 7) | 1; }

static long rss_anon_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "RssAnon: %ld", &v) == 1)
            break;
    if (f)
        fclose(f);
    return v;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: callocs ROUNDS LIVE_MIB\n");
        return 2;
    }
    long rounds = atol(argv[1]);
    size_t live = (size_t)atol(argv[2]) << 20;
    enum { SLOTS = 4096 };
    static unsigned char *blk[SLOTS];
    static size_t len[SLOTS], id[SLOTS];
    size_t head = 0, tail = 0, held = 0;
    for (long r = 0; r < rounds; r++) {
        size_t n = next() % 8 == 0 ? 4096 + next() % 65536 : 65536 + next() % (2u << 20);
        unsigned char *p = calloc(n, 1);
        if (!p) {
            fprintf(stderr, "calloc(%zu) failed\n", n);
            return 1;
        }
        for (size_t i = 0; i < n; i++)
            if (p[i]) {
                fprintf(stderr, "round %ld: byte %zu of %zu is %d, not zero\n", r, i, n, p[i]);
                return 1;
            }
        memset(p, tag((size_t)r), n);
        blk[head % SLOTS] = p, len[head % SLOTS] = n, id[head % SLOTS] = (size_t)r;
        head++, held += n;
        while (held > live || head - tail == SLOTS) {
            size_t k = tail++ % SLOTS;
            for (size_t i = 0; i < len[k]; i += 997)
                if (blk[k][i] != tag(id[k])) {
                    fprintf(stderr, "block %zu changed at %zu\n", id[k], i);
                    return 1;
                }
            free(blk[k]);
            held -= len[k];
        }
    }
    for (size_t t = tail; t < head; t++) {
        size_t k = t % SLOTS;
        for (size_t i = 0; i < len[k]; i++)
            if (blk[k][i] != tag(id[k])) {
                fprintf(stderr, "block %zu changed at %zu\n", id[k], i);
                return 1;
            }
        free(blk[k]);
    }
    /* Sparse: calloc'd blocks reusing written memory. */
    static unsigned char *big[64];
    for (int i = 0; i < 64; i++) {
        big[i] = malloc(1 << 20);
        if (!big[i])
            return 1;
        memset(big[i], 0x5a, 1 << 20);
    }
    for (int i = 0; i < 64; i++)
        free(big[i]);
    for (int i = 0; i < 64; i++) {
        big[i] = calloc(1 << 20, 1);
        if (!big[i])
            return 1;
        big[i][(size_t)i * 4096 % (1 << 20)] = 1;
    }
    long rss = rss_anon_kib();
    for (int i = 0; i < 64; i++)
        for (size_t j = 0; j < (1 << 20); j += 4096)
            if (big[i][j] != (j == (size_t)i * 4096 % (1 << 20))) {
                fprintf(stderr, "sparse block %d: byte %zu is %d\n", i, j, big[i][j]);
                return 1;
            }
    printf("ok %ld rss_anon_kib=%ld\n", rounds, rss);
    return 0;
}
