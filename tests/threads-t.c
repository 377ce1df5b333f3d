/* SPDX-License-Identifier: MIT */
/* threads-t: the thread policy (xknn_thread_budget, the host steps' threads). The library
 * never runs more CPU threads than the process may use: under an affinity mask of one CPU
 * (also with OMP_NUM_THREADS=4, and a mask narrowed while the process runs) the budget is
 * 1, a search with the default thread count leaves the process with its one thread and
 * gives the bytes of the unrestricted search; OMP_NUM_THREADS caps the budget. The input
 * scan names the first NaN/Inf in row-major order whatever the threads that scan a large
 * matrix. Linux (sched_setaffinity, /proc/self/status). TAP. */
#if defined(__linux__)
#define _GNU_SOURCE
#endif
#include <math.h>
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

/* FNV-1a of a search's ids and distance bits */
static unsigned long long bits_of(const int64_t *ids, const float *dist, size_t count)
{
    const unsigned char *b[2];
    size_t len[2], i;
    unsigned long long h = 1469598103934665603ull;
    int t;
    b[0] = (const unsigned char *)ids;
    b[1] = (const unsigned char *)dist;
    len[0] = count * sizeof *ids;
    len[1] = count * sizeof *dist;
    for (t = 0; t < 2; t++)
        for (i = 0; i < len[t]; i++) h = (h ^ b[t][i]) * 1099511628211ull;
    return h;
}

/* Child: runs under the one-CPU mask its parent set before exec (OpenMP reads the mask
 * when it starts, so the mask must be in place before the program does); want: the bits
 * of the parent's unrestricted search. */
static int child(const char *want)
{
    static int64_t ids[300 * 8], ids2[300 * 8];
    static float dist[300 * 8], dist2[300 * 8];
    plan(4);
    is_int(xknn_thread_budget(), 1, "one-CPU mask (OMP_NUM_THREADS=%s): xknn_thread_budget() is 1",
           getenv("OMP_NUM_THREADS") ? getenv("OMP_NUM_THREADS") : "unset");
    search(0, ids, dist);
    is_int(threads_now(), 1, "one-CPU mask: a search on the default count leaves one thread");
    search(3, ids2, dist2);
    ok(!memcmp(ids, ids2, sizeof ids) && !memcmp(dist, dist2, sizeof dist),
       "the same ids and distance bits on 1 and 3 threads");
    ok(bits_of(ids, dist, 300 * 8) == strtoull(want, NULL, 16), "the bits of the unrestricted search");
    return tap_done();
}

/* Child with OMP_NUM_THREADS=2 and the parent's mask: the budget is at most 2 */
static int child_omp2(void)
{
    plan(1);
    ok(xknn_thread_budget() >= 1 && xknn_thread_budget() <= 2, "OMP_NUM_THREADS=2: xknn_thread_budget() = %d",
       xknn_thread_budget());
    return tap_done();
}

/* Child without OMP_NUM_THREADS: ranks sharing the node (xknn_thread_share) take their
 * share while the mask holds every online CPU; a narrower mask is already a share */
static int child_share(void)
{
    cpu_set_t set;
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    const int full = xknn_thread_budget();
    int share;
    plan(3);
    if (sched_getaffinity(0, sizeof set, &set) != 0) bail("sched_getaffinity failed");
    xknn_thread_share(2);
    share = xknn_thread_budget();
    if (CPU_COUNT(&set) == online) {
        const int want = online / 2 < full ? (int)(online / 2) : full;
        is_int(share, want > 0 ? want : 1, "2 ranks on %ld unbound CPUs: each takes its share", online);
    } else {
        is_int(share, full, "2 ranks, a mask of %d of %ld CPUs: the mask is the share", CPU_COUNT(&set), online);
    }
    xknn_thread_share((int)online * 4);
    ok(xknn_thread_budget() >= 1, "more ranks than CPUs: still one thread each (%d)", xknn_thread_budget());
    xknn_thread_share(1);
    is_int(xknn_thread_budget(), full, "no sharing again: the whole budget");
    return tap_done();
}

/* Runs cmd; its TAP lines come back as diagnostics, its verdict as one test here. */
static void run_child(const char *cmd, int tests, const char *what)
{
    char line[512];
    int passed = 0, failed = 0;
    FILE *f = popen(cmd, "r");
    if (!f) bail("cannot run %s", cmd);
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        diag("child: %s", line);
        if (!strncmp(line, "ok ", 3)) passed++;
        if (!strncmp(line, "not ok", 6)) failed++;
    }
    ok(pclose(f) == 0 && passed == tests && failed == 0, "%s: %d of %d child tests passed", what, passed, tests);
}

/* The input scan on a matrix of 12 MiB (several threads at the default count): a NaN at
 * (r, c) and an Inf after it in row-major order; the NaN is named, row and column. */
static void scan_message(int threads, int64_t r, int64_t c)
{
    enum { N = 24576, D = 128 };
    static float ref[(size_t)N * D];
    float qry[D];
    int64_t ids[1];
    float dist[1];
    char want[128];
    xknn_params p = XKNN_PARAMS_INIT;
    xknn_matrix mr = XKNN_MATRIX_F32(ref, N, D), mq = XKNN_MATRIX_F32(qry, 1, D);
    xknn_error err;
    xknn_status st;
    memset(ref, 0, sizeof ref);
    memset(qry, 0, sizeof qry);
    ref[r * D + c] = NAN;
    if (c + 1 < D) ref[r * D + c + 1] = INFINITY;
    ref[(size_t)N * D - 1] = INFINITY;
    p.backend = XKNN_BACKEND_CPU;
    p.num_threads = threads;
    st = xknn_search(&p, &mr, &mq, 1, ids, dist, &err);
    snprintf(want, sizeof want, "reference row %lld column %lld is NaN", (long long)r, (long long)c);
    ok(st == XKNN_ERROR_INVALID_VALUE && !strcmp(err.message, want), "%d threads, NaN at (%lld, %lld): '%s'",
       threads, (long long)r, (long long)c, err.message);
}

int main(int argc, char **argv)
{
    static int64_t ids[300 * 8];
    static float dist[300 * 8];
    cpu_set_t set, all;
    char cmd[4096];
    int cpus, i;
    if (argc > 2 && !strcmp(argv[1], "--one-cpu")) return child(argv[2]);
    if (argc > 1 && !strcmp(argv[1], "--omp2")) return child_omp2();
    if (argc > 1 && !strcmp(argv[1], "--share")) return child_share();
    plan(10);
    if (sched_getaffinity(0, sizeof set, &set) != 0) bail("sched_getaffinity failed");
    all = set;
    cpus = CPU_COUNT(&set);
    ok(xknn_thread_budget() >= 1 && (getenv("OMP_NUM_THREADS") || xknn_thread_budget() <= cpus),
       "xknn_thread_budget() = %d, within the %d CPUs of the affinity mask", xknn_thread_budget(), cpus);
    scan_message(0, 0, 0);
    scan_message(0, 24576 / 2 + 5, 77);
    scan_message(0, 24576 - 1, 126);
    scan_message(3, 24576 * 3 / 4, 5);
    search(0, ids, dist);
    snprintf(cmd, sizeof cmd, "env OMP_NUM_THREADS=2 '%s' --omp2", argv[0]);
    run_child(cmd, 1, "OMP_NUM_THREADS=2");
    snprintf(cmd, sizeof cmd, "env -u OMP_NUM_THREADS '%s' --share", argv[0]);
    run_child(cmd, 3, "ranks sharing the node");
    {
        const unsigned long long bits = bits_of(ids, dist, 300 * 8);
        for (i = 0; i < CPU_SETSIZE && !CPU_ISSET(i, &set); i++) {
        }
        CPU_ZERO(&set);
        CPU_SET(i, &set);
        if (sched_setaffinity(0, sizeof set, &set) != 0) bail("sched_setaffinity failed");
#if defined(__GNUC__) && !defined(__clang__)
        /* libgomp reads the mask on every omp_get_num_procs() (libomp: at start only) */
        is_int(xknn_thread_budget(), 1, "a mask narrowed to one CPU while running: xknn_thread_budget() is 1");
#else
        skip(1, "libomp sees the mask of its start only");
#endif
        snprintf(cmd, sizeof cmd, "env -u OMP_NUM_THREADS '%s' --one-cpu %llx", argv[0], bits);
        run_child(cmd, 4, "one-CPU mask");
        snprintf(cmd, sizeof cmd, "env OMP_NUM_THREADS=4 '%s' --one-cpu %llx", argv[0], bits);
        run_child(cmd, 4, "one-CPU mask, OMP_NUM_THREADS=4");
        if (sched_setaffinity(0, sizeof all, &all) != 0) bail("sched_setaffinity failed");
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
