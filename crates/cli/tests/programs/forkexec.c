/* fork and exec under a budget. The parent fills MIB of heap; each of
 * CHILDREN forked children checks the inherited copy, overwrites it (its
 * copy only), then execs this program in "child" mode, which fills and
 * checks MIB of its own. The parent then checks its data is unchanged.
 * Usage: forkexec MIB CHILDREN STATUS; exits STATUS when every check
 * passed, 1 otherwise. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PG 4096

static void stamp(unsigned char **pg, size_t n, uint64_t tag) {
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < PG; j += 8) {
            uint64_t v = ((tag << 40) ^ (i * 977 + j)) & 0x0f0f0f0f0f0f0f0full;
            memcpy(pg[i] + j, &v, 8);
        }
}

static long check(unsigned char **pg, size_t n, uint64_t tag) {
    long bad = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < PG; j += 8) {
            uint64_t v = ((tag << 40) ^ (i * 977 + j)) & 0x0f0f0f0f0f0f0f0full;
            if (memcmp(pg[i] + j, &v, 8) != 0) {
                bad++;
                break;
            }
        }
    return bad;
}

static unsigned char **alloc_pages(size_t n) {
    unsigned char **pg = malloc(n * sizeof *pg);
    for (size_t i = 0; i < n; i++)
        pg[i] = malloc(PG);
    return pg;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "child") == 0) {
        size_t n = (strtoul(argv[2], 0, 10) << 20) / PG;
        unsigned char **pg = alloc_pages(n);
        stamp(pg, n, 9);
        long bad = check(pg, n, 9);
        return bad ? 1 : 0;
    }
    if (argc != 4) {
        fprintf(stderr, "usage: forkexec MIB CHILDREN STATUS\n");
        return 2;
    }
    size_t n = (strtoul(argv[1], 0, 10) << 20) / PG;
    int children = atoi(argv[2]);
    unsigned char **pg = alloc_pages(n);
    stamp(pg, n, 1);
    long bad = 0;
    for (int c = 0; c < children; c++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 2;
        }
        if (pid == 0) {
            if (check(pg, n, 1))
                _exit(11); /* the inherited copy is wrong */
            stamp(pg, n, 2 + c);
            if (check(pg, n, 2 + c))
                _exit(12);
            execl("/proc/self/exe", argv[0], "child", argv[1], (char *)0);
            _exit(13);
        }
        int st;
        waitpid(pid, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "forkexec: child %d ended with status 0x%x\n", c, st);
            bad++;
        }
        bad += check(pg, n, 1);
    }
    printf("forkexec: %zu pages, %d children, %ld bad\n", n, children, bad);
    return bad ? 1 : atoi(argv[3]);
}
