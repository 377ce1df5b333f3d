/* SPDX-License-Identifier: MIT */
#define _POSIX_C_SOURCE 200809L
#include "tap.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void free_all(void *const *p, int n)
{
    int i;
    for (i = 0; i < n; i++) free(p[i]);
}

static int tap_planned = -1, tap_run = 0, tap_failed = 0;

void plan(int n)
{
    tap_planned = n;
    printf("1..%d\n", n);
    fflush(stdout);
}

static int tap_vresult(int cond, const char *fmt, va_list ap)
{
    tap_run++;
    if (!cond) tap_failed++;
    printf("%sok %d - ", cond ? "" : "not ", tap_run);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    return cond;
}

int ok(int cond, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tap_vresult(cond, fmt, ap);
    va_end(ap);
    return cond;
}

int is_int(long long got, long long want, const char *fmt, ...)
{
    va_list ap;
    int r;
    va_start(ap, fmt);
    r = tap_vresult(got == want, fmt, ap);
    va_end(ap);
    if (!r) diag("got %lld, want %lld", got, want);
    return r;
}

int is_double(double got, double want, double tol, const char *fmt, ...)
{
    va_list ap;
    int r;
    va_start(ap, fmt);
    r = tap_vresult(fabs(got - want) <= tol, fmt, ap);
    va_end(ap);
    if (!r) diag("got %.17g, want %.17g (tolerance %g)", got, want, tol);
    return r;
}

int is_string(const char *got, const char *want, const char *fmt, ...)
{
    va_list ap;
    int r;
    va_start(ap, fmt);
    r = tap_vresult(got && want && strcmp(got, want) == 0, fmt, ap);
    va_end(ap);
    if (!r) diag("got \"%s\", want \"%s\"", got ? got : "(null)", want ? want : "(null)");
    return r;
}

void diag(const char *fmt, ...)
{
    va_list ap;
    printf("# ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

void skip(int n, const char *fmt, ...)
{
    int i;
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    for (i = 0; i < n; i++) printf("ok %d # SKIP %s\n", ++tap_run, buf);
    fflush(stdout);
}

void skip_all(const char *fmt, ...)
{
    va_list ap;
    printf("1..0 # SKIP ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    exit(0);
}

void bail(const char *fmt, ...)
{
    va_list ap;
    printf("Bail out! ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    exit(1);
}

int tap_done(void)
{
    if (tap_planned >= 0 && tap_run != tap_planned) {
        diag("planned %d tests but ran %d", tap_planned, tap_run);
        return 1;
    }
    return tap_failed ? 1 : 0;
}

static uint32_t tap_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

int is_knn_equal(const int64_t *ids, const float *dist, const int64_t *want_ids, const float *want_dist,
                 int64_t nq, int64_t k, const char *fmt, ...)
{
    int64_t i, j, bad_q = -1, bad_j = -1, nbad = 0;
    va_list ap;
    int r;
    for (i = 0; i < nq; i++)
        for (j = 0; j < k; j++) {
            int64_t o = i * k + j;
            int same = ids[o] == want_ids[o];
            if (dist && want_dist) same = same && tap_bits(dist[o]) == tap_bits(want_dist[o]);
            if (!same) {
                if (bad_q < 0) {
                    bad_q = i;
                    bad_j = j;
                }
                nbad++;
            }
        }
    va_start(ap, fmt);
    r = tap_vresult(nbad == 0, fmt, ap);
    va_end(ap);
    if (!r) {
        int64_t lo = bad_j > 3 ? bad_j - 3 : 0, hi = bad_j + 4 < k ? bad_j + 4 : k;
        diag("%lld of %lld entries differ; first at query %lld, rank %lld", (long long)nbad,
             (long long)(nq * k), (long long)bad_q, (long long)bad_j);
        for (j = lo; j < hi; j++) {
            int64_t o = bad_q * k + j;
            diag("  rank %lld: got id %lld dist %.9g (0x%08x), want id %lld dist %.9g (0x%08x)%s", (long long)j,
                 (long long)ids[o], dist ? (double)dist[o] : 0.0, dist ? (unsigned)tap_bits(dist[o]) : 0u,
                 (long long)want_ids[o], want_dist ? (double)want_dist[o] : 0.0,
                 want_dist ? (unsigned)tap_bits(want_dist[o]) : 0u, j == bad_j ? "  <--" : "");
        }
    }
    return r;
}
