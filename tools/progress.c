/* SPDX-License-Identifier: MIT */
/*
 * tools/progress.c -- knn_mpi's progress lines (tools/progress.h).
 */
#define _POSIX_C_SOURCE 200809L
#include "progress.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static double knn__progress_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* With p->mu held: one line of the latest counters. */
static void knn__progress_print(knn_progress *p, double now)
{
    const double el = now - p->t_start;
    const double rate = el > 0 ? (double)p->done / el : 0.0;
    char eta[32];
    if (p->done > 0 && rate > 0)
        snprintf(eta, sizeof eta, "ETA %.0f s", (double)(p->total - p->done) / rate);
    else
        snprintf(eta, sizeof eta, "ETA unknown");
    fprintf(stderr, "%sknn_mpi: %lld/%lld %s (%.1f%%), %.0f %s/s, %s, %.0f s elapsed%s", p->tty ? "\r" : "",
            (long long)p->done, (long long)p->total, p->unit,
            p->total > 0 ? 100.0 * (double)p->done / (double)p->total : 0.0, rate, p->unit, eta, el,
            p->tty ? "   " : "\n");
    fflush(stderr);
    p->last_print = now;
}

static void *knn__progress_main(void *arg)
{
    knn_progress *p = (knn_progress *)arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += (time_t)KNN_PROGRESS_PERIOD;
        if (pthread_cond_timedwait(&p->cv, &p->mu, &ts) == ETIMEDOUT && !p->stop)
            knn__progress_print(p, knn__progress_now());
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int knn_progress_start(knn_progress *p, int64_t total, const char *unit, int tty)
{
    memset(p, 0, sizeof *p);
    p->total = total;
    p->unit = unit;
    p->tty = tty;
    p->t_start = p->last_print = knn__progress_now();
    if (pthread_mutex_init(&p->mu, NULL) != 0) return -1;
    if (pthread_cond_init(&p->cv, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        return -1;
    }
    if (pthread_create(&p->thread, NULL, knn__progress_main, p) != 0) {
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        return -1;
    }
    p->running = 1;
    return 0;
}

void knn_progress_update(void *user, int64_t done, int64_t total)
{
    knn_progress *p = (knn_progress *)user;
    double now;
    if (!p->running) return;
    now = knn__progress_now();
    pthread_mutex_lock(&p->mu);
    p->done = done;
    p->total = total;
    /* a terminal also gets the line as blocks complete (at most twice a second) */
    if (p->tty && done < total && now - p->last_print >= 0.5) knn__progress_print(p, now);
    pthread_mutex_unlock(&p->mu);
}

void knn_progress_stop(knn_progress *p)
{
    if (!p->running) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    if (p->tty) {
        fprintf(stderr, "\r%100s\r", "");
        fflush(stderr);
    }
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    p->running = 0;
}
