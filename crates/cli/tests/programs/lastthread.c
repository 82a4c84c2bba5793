/* A process whose program threads all end by pthread_exit must end, as
 * the C library ends it when its last thread exits (exit(0)), whatever
 * helper threads a preloaded runtime runs in it.
 *
 * Usage: lastthread main-exits MIB   main() calls pthread_exit; a second
 *                                     thread stamps MIB MiB, checks them
 *                                     and returns: the process exits 0.
 *        lastthread fork-thread MIB  a second thread stamps MIB MiB and
 *                                     forks; in the child it is the only
 *                                     program thread (and the process's
 *                                     leader): it checks the copy, then
 *                                     calls pthread_exit. The
 *                                     parent waits for the child (at most
 *                                     60 s) and exits with its status.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static size_t mib;

static uint64_t *p;

static void stamp(void)
{
    size_t n = mib << 20;
    p = malloc(n);
    if (!p)
        exit(2);
    for (size_t i = 0; i < n / 8; i++)
        p[i] = i * 0x9e3779b97f4a7c15ull;
}

static int check(void)
{
    size_t n = mib << 20;
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < n / 8; i++)
            if (p[i] != i * 0x9e3779b97f4a7c15ull) {
                fprintf(stderr, "word %zu wrong\n", i);
                return 1;
            }
    return 0;
}

static void *worker(void *arg)
{
    (void)arg;
    stamp();
    int rc = check();
    if (rc)
        exit(rc);
    return NULL;
}

static void *forker(void *arg)
{
    (void)arg;
    stamp();
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        exit(2);
    }
    if (pid == 0) {
        int rc = check();
        if (rc)
            exit(rc);
        pthread_exit(NULL); /* the child's last program thread */
    }
    for (int i = 0; i < 600; i++) {
        int status;
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
                printf("ok: the child ended\n");
                exit(0);
            }
            fprintf(stderr, "child ended with status %#x\n", status);
            exit(1);
        }
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "the child did not end within 60 s\n");
    exit(1);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s main-exits|fork-thread MIB\n", argv[0]);
        return 2;
    }
    mib = strtoul(argv[2], NULL, 10);
    pthread_t t;
    if (strcmp(argv[1], "main-exits") == 0) {
        if (pthread_create(&t, NULL, worker, NULL))
            return 2;
        pthread_exit(NULL);
    }
    if (strcmp(argv[1], "fork-thread") == 0) {
        if (pthread_create(&t, NULL, forker, NULL))
            return 2;
        pthread_join(t, NULL);
        return 0;
    }
    fprintf(stderr, "unknown mode %s\n", argv[1]);
    return 2;
}
