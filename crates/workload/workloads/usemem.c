/* usemem, after the workload of the zswap mails (seeds 000 and 002), in C
 * so that the same unmodified binary runs under `uzswap run` and under a
 * memory cgroup with the kernel's zswap.
 *
 * usemem CORPUS MIB PASSES seq|skewed [CGROUP_TASKS]
 *
 * The page contents come from CORPUS (a file of whole pages, mapped
 * read-only and read in before the measurement; file pages are not what
 * either side manages). With CGROUP_TASKS the program writes its pid there
 * once the corpus is in, so only the workload's memory is charged. It then
 * fills MIB of heap with corpus pages, and makes PASSES passes that read
 * and check a page, and rewrite its first 8 bytes with a new stamp one time
 * in five. Heap page i holds corpus page i % CORPUS_PAGES; beyond the first
 * cycle through the corpus, its first 8 bytes are XORed with the cycle
 * number unless it is one repeated 8-byte word (zero and same-filled pages
 * stay so), so that the cycles are not copies of each other while the
 * corpus's own copies stay copies within a cycle: the mix's share of
 * duplicate pages is the corpus's, whatever MIB is (the same rule as
 * uzswap's Rust usemem, crates/workload/src/usemem.rs). It prints one JSON line
 * (the fields of uzswap's usemem report), then waits for stdin to close
 * before it exits, so that its memory can still be measured. Exit status 0 when no page came back wrong. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PG 4096

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int one_word(const unsigned char *p) {
    for (size_t o = 8; o < PG; o += 8)
        if (memcmp(p, p + o, 8) != 0)
            return 0;
    return 1;
}

/* The first 8 bytes of heap page i as filled (see the header). */
static uint64_t head_of(const unsigned char *corpus, size_t corpus_pages,
                        const unsigned char *same, size_t i) {
    size_t c = i % corpus_pages;
    uint64_t head;
    memcpy(&head, corpus + c * PG, 8);
    if (!same[c])
        head ^= (uint64_t)(i / corpus_pages);
    return head;
}

static uint64_t rng = 1;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

int main(int argc, char **argv) {
    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: usemem CORPUS MIB PASSES seq|skewed [CGROUP_TASKS]\n");
        return 2;
    }
    int fd = open(argv[1], O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_size < PG) {
        perror(argv[1]);
        return 2;
    }
    size_t corpus_pages = st.st_size / PG;
    const unsigned char *corpus =
        mmap(0, corpus_pages * PG, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (corpus == MAP_FAILED) {
        perror("mmap corpus");
        return 2;
    }
    size_t n = (strtoull(argv[2], 0, 10) << 20) / PG;
    unsigned passes = (unsigned)atoi(argv[3]);
    int skewed = strcmp(argv[4], "skewed") == 0;
    if (argc == 6) {
        FILE *t = fopen(argv[5], "w");
        if (!t || fprintf(t, "%d\n", getpid()) < 0 || fclose(t) != 0) {
            perror(argv[5]);
            return 2;
        }
    }
    /* Page aligned: each workload page is one page of the machine, so a
       random access touches one page, not two (as it would at malloc's
       16-byte offset). */
    unsigned char *mem = aligned_alloc(PG, n * PG);
    uint64_t *stamps = calloc(n, sizeof *stamps);
    unsigned char *same = malloc(corpus_pages);
    if (!mem || !stamps || !same) {
        fprintf(stderr, "usemem: out of memory\n");
        return 2;
    }
    for (size_t c = 0; c < corpus_pages; c++)
        same[c] = (unsigned char)one_word(corpus + c * PG);
    double t0 = now();
    for (size_t i = 0; i < n; i++) {
        memcpy(mem + i * PG, corpus + (i % corpus_pages) * PG, PG);
        uint64_t head = head_of(corpus, corpus_pages, same, i);
        memcpy(mem + i * PG, &head, 8);
    }
    double fill_s = now() - t0;

    uint64_t corrupt = 0, touched = 0;
    size_t hot = n / 5 ? n / 5 : 1;
    t0 = now();
    for (unsigned pass = 0; pass < passes; pass++) {
        for (size_t k = 0; k < n; k++) {
            size_t i = k;
            if (skewed) {
                uint64_t r = next();
                if (r % 10 < 8)
                    i = (r >> 8) % hot;
                else
                    i = hot + (r >> 8) % (n > hot ? n - hot : 1);
                if (i >= n)
                    i = n - 1;
            }
            unsigned char *page = mem + i * PG;
            const unsigned char *want = corpus + (i % corpus_pages) * PG;
            uint64_t head;
            memcpy(&head, page, 8);
            uint64_t want_head =
                stamps[i] ? stamps[i] : head_of(corpus, corpus_pages, same, i);
            if (head != want_head || memcmp(page + 8, want + 8, PG - 8) != 0)
                corrupt++;
            if (next() % 5 == 0) {
                uint64_t s = ((uint64_t)(pass + 1) << 32) | k | (1ull << 63);
                stamps[i] = s;
                memcpy(page, &s, 8);
            }
            touched++;
        }
    }
    double pass_s = now() - t0;
    printf("{\"fill_kbps\":%.1f,\"pass_kbps\":%.1f,\"corrupt_pages\":%llu,\"pages\":%zu,"
           "\"passes\":%u}\n",
           n * 4.0 / (fill_s > 1e-9 ? fill_s : 1e-9),
           touched * 4.0 / (pass_s > 1e-9 ? pass_s : 1e-9), (unsigned long long)corrupt, n,
           passes);
    fflush(stdout);
    char sink[64];
    while (read(0, sink, sizeof sink) > 0) {
    }
    free(mem);
    free(stamps);
    free(same);
    return corrupt ? 1 : 0;
}
