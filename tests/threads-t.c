/* SPDX-License-Identifier: MIT */
/* threads-t: the thread policy (xknn_thread_budget). The library never runs more CPU
 * threads than the process may use: under an affinity mask of one CPU a search with the
 * default thread count leaves the process with its one thread, and gives the same bytes
 * as a search on more threads. Linux (sched_setaffinity, /proc/self/status). TAP. */
#if defined(__linux__)
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap/tap.h"
#include "xknn.h"

#if defined(__linux__)
#include <sched.h>
#include <unistd.h>

/* Threads of this process now (the OpenMP pool stays alive after a parallel region). */
static int threads_now(void)
{
    char line[256];
    int n = -1;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "Threads:", 8)) n = atoi(line + 8);
    fclose(f);
    return n;
}

static void search(int threads, int64_t *ids, float *dist)
{
    enum { N = 20000, D = 32, NQ = 300, K = 8 };
    static float ref[N * D], qry[NQ * D];
    xknn_params p = XKNN_PARAMS_INIT;
    xknn_matrix r = XKNN_MATRIX_F32(ref, N, D), q = XKNN_MATRIX_F32(qry, NQ, D);
    xknn_error err;
    unsigned s = 7;
    int i;
    for (i = 0; i < N * D; i++) ref[i] = (float)((s = s * 1103515245u + 12345u) >> 16 & 63);
    for (i = 0; i < NQ * D; i++) qry[i] = (float)((s = s * 1103515245u + 12345u) >> 16 & 63);
    p.backend = XKNN_BACKEND_CPU;
    p.num_threads = threads;
    if (xknn_search(&p, &r, &q, K, ids, dist, &err) != XKNN_SUCCESS) bail("search: %s", err.message);
}

/* Child: runs under the one-CPU mask its parent set before exec (OpenMP reads the mask
 * when it starts, so the mask must be in place before the program does). */
static int child(void)
{
    static int64_t ids[300 * 8], ids2[300 * 8];
    static float dist[300 * 8], dist2[300 * 8];
    plan(3);
    is_int(xknn_thread_budget(), 1, "one-CPU mask: xknn_thread_budget() is 1");
    search(0, ids, dist);
    is_int(threads_now(), 1, "one-CPU mask: a search on the default count leaves one thread");
    search(3, ids2, dist2);
    ok(!memcmp(ids, ids2, sizeof ids) && !memcmp(dist, dist2, sizeof dist),
       "the same ids and distance bits on 1 and 3 threads");
    return tap_done();
}

int main(int argc, char **argv)
{
    cpu_set_t set;
    int cpus;
    if (argc > 1 && !strcmp(argv[1], "--one-cpu")) return child();
    plan(2);
    if (sched_getaffinity(0, sizeof set, &set) != 0) bail("sched_getaffinity failed");
    cpus = CPU_COUNT(&set);
    ok(xknn_thread_budget() >= 1 && (getenv("OMP_NUM_THREADS") || xknn_thread_budget() <= cpus),
       "xknn_thread_budget() = %d, within the %d CPUs of the affinity mask", xknn_thread_budget(), cpus);
    {
        /* the child's TAP lines come back as diagnostics; its verdict is one test here */
        char cmd[4096], line[512];
        int i, passed = 0, failed = 0;
        FILE *f;
        for (i = 0; i < CPU_SETSIZE && !CPU_ISSET(i, &set); i++) {
        }
        CPU_ZERO(&set);
        CPU_SET(i, &set);
        if (sched_setaffinity(0, sizeof set, &set) != 0) bail("sched_setaffinity failed");
        snprintf(cmd, sizeof cmd, "env -u OMP_NUM_THREADS '%s' --one-cpu", argv[0]);
        if (!(f = popen(cmd, "r"))) bail("cannot run %s", cmd);
        while (fgets(line, sizeof line, f)) {
            line[strcspn(line, "\n")] = '\0';
            diag("child: %s", line);
            if (!strncmp(line, "ok ", 3)) passed++;
            if (!strncmp(line, "not ok", 6)) failed++;
        }
        ok(pclose(f) == 0 && passed == 3 && failed == 0, "under a one-CPU mask: %d of 3 child tests passed", passed);
    }
    return tap_done();
}
#else
int main(void)
{
    skip_all("the thread policy test needs Linux");
    return 0;
}
#endif
