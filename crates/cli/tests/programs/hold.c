/* Allocates MIB of heap memory, writes every page (a counter and a
 * repeated word, so pages compress as program data does and each differs),
 * says "ready" on stdout, then holds it for SECONDS, touching a page now
 * and then so that faults keep coming. Usage: hold MIB SECONDS */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: hold MIB SECONDS\n");
        return 2;
    }
    size_t n = (size_t)atol(argv[1]) << 20;
    long seconds = atol(argv[2]);
    unsigned char *p = malloc(n);
    if (!p) {
        perror("malloc");
        return 1;
    }
    for (size_t i = 0; i < n; i += 4096) {
        size_t len = n - i < 4096 ? n - i : 4096;
        memset(p + i, 'a' + (int)(i / 4096 % 26), len);
        memcpy(p + i, &i, sizeof i);
    }
    printf("ready\n");
    fflush(stdout);
    time_t end = time(NULL) + seconds;
    size_t at = 0;
    unsigned long sum = 0;
    while (time(NULL) < end) {
        sum += p[at];
        at = (at + 4096 * 97) % n;
        usleep(10000);
    }
    return sum == 1; /* keeps the reads */
}
