/* SPDX-License-Identifier: MIT */
/*
 * mpi/symmetric.c -- the symmetric distributed self-join (the all-kNN graph).
 *
 * Rank r owns slice r. Every distance d(i, j) serves both i and j, so each unordered
 * pair of rows is evaluated exactly once, by one rank, with xknn_search_pair. Which
 * pair each rank computes in each step, the rows that balance the ranks' work to within
 * a row, and the pieces of P = 2's last pair are the schedule (ring_schedule.c). In step
 * s = 0 .. S, S = floor(P/2), rank r holds slice (r + s) mod P: for step s + 1 it
 * receives from rank r + 1 the slice that rank held, while it sends its own to rank
 * r - 1 (every rank relays, also one with an empty slice).
 *
 * Lists. A rank ends step s >= 1 with k-best lists of the held slice's rows. Each slice
 * is held by one rank a step, so its owner receives one list set a step, during the next
 * step's compute, and folds it into an accumulator with the search's pairwise merge
 * (xknn__merge_rows: (distance, id), padding last); after the last step it merges the
 * accumulator with its own lists. The ranks' pairs partition all pairs, so this gives
 * the plain self-join's ids and distance bits.
 *
 * Overlap. Open MPI has no progress thread: a posted transfer moves only inside MPI
 * calls. Where MPI gives MPI_THREAD_FUNNELED or more, each step's compute runs in a
 * worker thread (xknn__sym_work, no MPI call) while the main thread completes the
 * transfers with MPI_Testall and merges what arrived; otherwise the compute runs inline
 * and the transfers follow it. Busy seconds are the compute's own; the transfers count
 * (as broadcast; the last exchange as reduce) only where they outlast it.
 *
 * Bounds (l2/euclidean). After step 0 the ranks share each row's k-th value
 * (MPI_Allgatherv). A held slice's lists start from padding that carries the owner's
 * value in its last entry: xknn_search_pair may leave out whatever lies beyond it, since
 * the owner's final lists hold k references at or below it.
 *
 * The tail. P = 2 runs its last pair in pieces: after each piece its rows' lists are
 * final on that side; they travel, are merged and go to the sink while the next piece
 * computes, so nothing moves after the last step.
 *
 * Device (CUDA backend). One context for all the steps; the own slice and the held one
 * are kept on the device (each row crosses once a step, not once a call), and so are
 * the running lists: each set comes to the host once, at the end of its last step, or
 * piece by piece in the context's copier thread beside the next piece.
 *
 * Memory per rank, in list sets of (largest slice) x k x 12 bytes: the own lists, one or
 * two held slices' and the accumulator's: 4 (P = 2), 3 (P = 3) or 6 (P >= 4); plus two
 * slices of rows (and n floats with bounds). The ring's buffers, and a CUDA context it
 * made itself, are released in a thread of their own (xknn__mpi_later) after the results
 * are delivered; device copies on a caller's context before the return.
 *
 * Options from the environment give the same results (xknn__ring_options; BOUNDS and
 * PIECES hold only where every rank has them): XKNN_MPI_SYM_THREAD=0, _PIECES,
 * _BOUNDS=0, _DEVICE_LISTS=0, _MERGE_THREADS, _BLOCK_ROWS; _TRACE=1 prints each rank's
 * timeline on stderr (docs/DESIGN.md, section 10).
 */
#define _GNU_SOURCE /* sched_yield, clock_gettime */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "impl.h"
#include "ring_schedule.h"
#include "xknn/impl/knobs.h"

#ifdef XKNN_MPI_HAVE_CUDA
#include "xknn/cuda.h"
#include "xknn/impl/cuda_internal.h"
#endif

/* The worker's news to the main thread: rows [0, rows) of a list set are final on this
 * rank's side and on the host (P = 2's last pair in pieces: slice 1's rows, the held
 * set's on rank 0, the own set's on rank 1; and in rows2 slice 0's, the own set's on
 * rank 0, the held set's on rank 1) */
#define XKNN__SYM_QUEUE 40
typedef struct xknn__sym_ready {
    pthread_mutex_t mu;
    int64_t rows;  /* the set told by w->pub                                           */
    int64_t rows2; /* P = 2's pieces, the other set (w->pub2): rank 0's own set's rows,
                    * rank 1's held set's (slice 0's rows)                              */
    int done;      /* the worker's step is over                                         */
    /* the worker's copies to the host still running (xknn_cuda_copy_lists_start), in
     * order, for rows (set 0) and rows2 (set 1): the rows each ends and its ticket; the
     * rows are told once the copy is over (the main thread asks, xknn__sym_news) */
    void *kctx;
    int64_t qhi[2][XKNN__SYM_QUEUE], qtk[2][XKNN__SYM_QUEUE];
    int qh[2], qt[2];
} xknn__sym_ready;

/* The copies of rd's queues that are over (the oldest first): their rows are told.
 * Under rd's mutex (it does not wait). Returns 0, or -1 where a copy failed (its rows
 * and the ones after are not told). */
static int xknn__sym_landed(xknn__sym_ready *rd)
{
    int i;
    for (i = 0; i < 2; i++) {
        while (rd->qh[i] < rd->qt[i]) {
            int over = 1;
#ifdef XKNN_MPI_HAVE_CUDA
            xknn_error e;
            const int64_t ticket = rd->qtk[i][rd->qh[i] % XKNN__SYM_QUEUE];
            if (xknn_cuda_copy_lists_test((xknn_cuda_context *)rd->kctx, ticket, 0, &over, &e) != XKNN_SUCCESS)
                return -1;
#endif
            if (!over) break;
            *(i == 0 ? &rd->rows : &rd->rows2) = rd->qhi[i][rd->qh[i] % XKNN__SYM_QUEUE];
            rd->qh[i]++;
        }
    }
    return 0;
}

/* The worker's news, read under its mutex (rows2 may be NULL). */
static void xknn__sym_news(xknn__sym_ready *rd, int64_t *rows, int64_t *rows2, int *done)
{
    pthread_mutex_lock(&rd->mu);
    (void)xknn__sym_landed(rd);
    *rows = rd->rows;
    if (rows2) *rows2 = rd->rows2;
    *done = rd->done;
    pthread_mutex_unlock(&rd->mu);
}

/* Rows [r0, r0 + rows) of m, as a matrix of their own. */
static xknn_matrix xknn__sym_rows(const xknn_matrix *m, int64_t r0, int64_t rows)
{
    const int64_t elems = xknn_row_elems(m->dtype, m->cols);
    xknn_matrix v = *m;
    v.data = (const unsigned char *)m->data + r0 * (m->ld ? m->ld : elems) * (xknn_row_bytes(m->dtype, m->cols) / elems);
    v.rows = rows;
    return v;
}

/* One step's compute (its blocks: xknn__sym_step_rects), run by a worker
 * thread while the main thread moves slices and lists, or inline. No MPI call in here
 * (MPI_THREAD_FUNNELED is enough). */
typedef struct xknn__sym_step {
    const xknn_params *p;
    const xknn_matrix *ref;     /* own rows (NULL for an empty slice)                  */
    const unsigned char *cur;   /* the slice held in this step, dense                  */
    const int64_t *m;           /* every slice's rows                                  */
    const int64_t *half, *cut;  /* the plan                                            */
    int64_t k, d, nloc, r0;     /* own rows, their first global id                    */
    int64_t mj, j0;             /* the held slice's rows and first global id           */
    int64_t *l0, *lj;           /* lists: own rows, the held slice's (step >= 1)       */
    float *d0, *dj;
    xknn_dtype dtype;
    int s, P, S, rank, neg;
    int prepadded; /* the held slice's lists are padding already (the main thread's), or
                    * kept on the device (their host arrays unread)                       */
    int own_dev;   /* the own lists are kept on the device (their host arrays unread)   */
    void *kctx;    /* where (the CUDA context) lists are kept                            */
    int fetch_held, fetch_own; /* the held slice's / the own lists to the host after the calls */
    int64_t held_from; /* ... of the held slice's, only rows [held_from, mj) (the others
                        * are padding: P = 2's last pair, on rank 1)                      */
    xknn__sym_ready *rd; /* P = 2's pieces: the rows final so far (NULL: none told)       */
    int64_t pub, pub2; /* ... the rows told so far (rows, rows2)                         */
    int own_dropped; /* P = 2's pieces: the own lists' device copy is freed (every row
                      * came to the host before)                                        */
    int pieces;    /* P = 2's last pair in pieces of slice 1's rows (0: in one call)     */
    const void *forget[2]; /* kept rows to forget after the step (xknn_cuda_forget_rows)  */
    int hparts;    /* P = 2's pieces, rank 0: the last piece in parts of the own rows, each
                    * ending their lists (told in rows2; the sink takes any order)        */
    int64_t last_ticket; /* the last such copy started (0: none)                       */
    /* out */
    int64_t nev;
    xknn_status st;
    xknn_error e;
    double t0, t1; /* monotonic seconds: start and end of the compute */
    double mark[16]; /* XKNN_MPI_SYM_TRACE: when the lists' padding and each call ended */
    int nmark;
    double tf0, tf1; /* the kept lists' fetch */
} xknn__sym_step;

static double xknn__sym_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void xknn__sym_mark(xknn__sym_step *w)
{
    if (w->nmark < 16) w->mark[w->nmark++] = xknn__sym_now();
}

/* One side of a pair call: its rows, their first global id, and the lists of the whole
 * slice (ld = k). rows is NULL for an empty slice. */
typedef struct xknn__ring_side {
    const xknn_matrix *rows;
    int64_t id0;
    int64_t *ids;
    float *dist;
} xknn__ring_side;

/* Rows [a0, a0 + ra) of side a against rows [b0, b0 + rb) of side b, or (b NULL) among
 * themselves; adds the distance evaluations to w->nev (an error to w->e) and marks its
 * end. Nothing to do for an empty side, so an empty slice's NULL rows are never read. */
static xknn_status xknn__sym_call(xknn__sym_step *w, const xknn__ring_side *a, int64_t a0, int64_t ra,
                                  const xknn__ring_side *b, int64_t b0, int64_t rb)
{
    const int64_t k = w->k;
    xknn_matrix va, vb;
    xknn_status st;
    if (ra <= 0 || (b && rb <= 0)) return XKNN_SUCCESS;
    va = xknn__sym_rows(a->rows, a0, ra);
    if (b) vb = xknn__sym_rows(b->rows, b0, rb);
    w->nev += b ? ra * rb : xknn__sym_tri(ra);
    st = xknn_search_pair(w->p, &va, a->id0 + a0, b ? &vb : NULL, b ? b->id0 + b0 : 0, k, a->ids + a0 * k,
                          a->dist + a0 * k, b ? b->ids + b0 * k : NULL, b ? b->dist + b0 * k : NULL, &w->e);
    xknn__sym_mark(w);
    return st;
}

/* count entries of padding (xknn__lists_pad), spread over threads (OpenMP; <= 0: all):
 * the first touch of a fresh list set, millions of pages, is no work for one core */
static void xknn__sym_pad(int64_t *ids, float *dist, int64_t count, int neg, int threads)
{
    const int64_t grain = INT64_C(1) << 18;
    const int64_t parts = (count + grain - 1) / grain;
    int64_t i;
    (void)threads;
#ifdef _OPENMP
    if (threads <= 0) threads = xknn_thread_budget();
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && parts > 1)
#endif
    for (i = 0; i < parts; i++) {
        const int64_t o = i * grain;
        xknn__lists_pad(ids + o, dist + o, count - o < grain ? count - o : grain, neg);
    }
}

/* A copy of the worker's lists to the host failed: its error (DEVICE) into w->e. */
static xknn_status xknn__sym_copy_failed(xknn__sym_step *w)
{
    w->e.status = XKNN_ERROR_DEVICE;
    snprintf(w->e.message, sizeof w->e.message, "the copy of a piece's lists to the host failed");
    return w->e.status;
}

/* Rows [0, hi) of the list set ids (kept on the device: dev) are final on this rank's
 * side: rows [*pub, hi) come to the host (from the device where kept there) and the main
 * thread is told (w->rd's rows, or rows2 with two: the count w->pub or w->pub2; without
 * w->rd, the main thread reads the count after the join). */
static xknn_status xknn__sym_publish(xknn__sym_step *w, int two, const int64_t *ids, int dev, int64_t hi)
{
    int64_t *pub = two ? &w->pub2 : &w->pub;
    (void)ids;
    (void)dev;
    if (hi <= *pub) return XKNN_SUCCESS;
#ifdef XKNN_MPI_HAVE_CUDA
    if (dev && w->rd) {
        /* the copy runs beside the next call (xknn_cuda_copy_lists_start: the context's
         * copier thread, on its own stream), and the main thread is told once it is over
         * (xknn__sym_news) */
        xknn__sym_ready *rd = w->rd;
        xknn_error fe;
        int64_t ticket = 0, oldest = 0;
        int bad = 0, over = 0;
        pthread_mutex_lock(&rd->mu);
        if (rd->qt[two] - rd->qh[two] >= XKNN__SYM_QUEUE) oldest = rd->qtk[two][rd->qh[two] % XKNN__SYM_QUEUE];
        pthread_mutex_unlock(&rd->mu);
        if (oldest > 0) {
            /* the queue is full: its oldest copy over first (waited for outside the mutex
             * the main thread reads its news under), then told */
            bad = xknn_cuda_copy_lists_test((xknn_cuda_context *)w->kctx, oldest, 1, &over, &fe) != XKNN_SUCCESS;
            pthread_mutex_lock(&rd->mu);
            bad = xknn__sym_landed(rd) != 0 || bad;
            pthread_mutex_unlock(&rd->mu);
        }
        if (bad) return xknn__sym_copy_failed(w);
        if (xknn_cuda_copy_lists_start((xknn_cuda_context *)w->kctx, ids, *pub, hi - *pub, &ticket, &fe) !=
            XKNN_SUCCESS) {
            w->e = fe;
            return fe.status;
        }
        pthread_mutex_lock(&rd->mu);
        rd->qhi[two][rd->qt[two] % XKNN__SYM_QUEUE] = hi;
        rd->qtk[two][rd->qt[two] % XKNN__SYM_QUEUE] = ticket;
        rd->qt[two]++;
        pthread_mutex_unlock(&rd->mu);
        *pub = hi;
        w->last_ticket = ticket;
        return XKNN_SUCCESS;
    }
    if (dev) {
        xknn_error fe;
        if (xknn_cuda_copy_lists((xknn_cuda_context *)w->kctx, ids, *pub, hi - *pub, &fe) != XKNN_SUCCESS) {
            w->e = fe;
            return fe.status;
        }
    }
#endif
    *pub = hi;
    if (!w->rd) return XKNN_SUCCESS;
    pthread_mutex_lock(&w->rd->mu);
    if (two)
        w->rd->rows2 = hi;
    else
        w->rd->rows = hi;
    pthread_mutex_unlock(&w->rd->mu);
    return XKNN_SUCCESS;
}

/* P = 2's last pair in pieces (no cut rows in slice 0; g = m_0 - half[0]): rank 0
 * computes its rows [g, m_0) against slice 1, rank 1 slice 0's rows [0, g) against its
 * own, both in pieces of slice 1's rows (xknn__sym_slice1). After piece q its rows'
 * lists are final on this side (rank 0: the held set's, rank 1: the own set's): to the
 * host and told (rows) while the next piece computes. Rank 1's last piece runs in
 * pieces of slice 0's rows, each ending their held lists (rows2). Rank 0 tells rows2 of
 * its own set: rows [0, g), final since step 0, first; the rest at the end, or (hparts)
 * part by part in its last piece. */
static xknn_status xknn__sym_work_pieces(xknn__sym_step *w, const xknn__ring_side *own, const xknn__ring_side *held)
{
    const int np = w->pieces, rank = w->rank;
    const int64_t m1 = rank == 0 ? w->mj : w->nloc, m0 = rank == 0 ? w->nloc : w->mj, g = m0 - w->half[0];
    xknn_status ss = XKNN_SUCCESS;
    int q, i;
    if (rank == 0) ss = xknn__sym_publish(w, 1, w->l0, w->own_dev, g);
    for (q = 0; q < np && ss == XKNN_SUCCESS; q++) {
        const int64_t a = xknn__sym_slice1(m1, np, q), b = xknn__sym_slice1(m1, np, q + 1);
        if (rank == 0) {
            /* (with hparts the last piece in parts of rows [g, m_0), each final after its part) */
            const int parts = q == np - 1 && w->hparts ? np : 1;
            for (i = 0; i < parts && ss == XKNN_SUCCESS; i++) {
                const int64_t ha = g + xknn__sym_piece(m0 - g, parts, i);
                const int64_t hb = g + xknn__sym_piece(m0 - g, parts, i + 1);
                ss = xknn__sym_call(w, own, ha, hb - ha, held, a, b - a);
                if (ss == XKNN_SUCCESS && parts > 1) ss = xknn__sym_publish(w, 1, w->l0, w->own_dev, hb);
            }
        } else {
            for (i = 0; i < (q < np - 1 ? 1 : np) && ss == XKNN_SUCCESS; i++) {
                const int64_t ga = q < np - 1 ? 0 : xknn__sym_piece(g, np, i);
                const int64_t gb = q < np - 1 ? g : xknn__sym_piece(g, np, i + 1);
                ss = xknn__sym_call(w, held, ga, gb - ga, own, a, b - a);
                if (ss == XKNN_SUCCESS && q == np - 1) ss = xknn__sym_publish(w, 1, w->lj, w->fetch_held, gb);
            }
        }
        if (ss == XKNN_SUCCESS)
            ss = rank == 0 ? xknn__sym_publish(w, 0, w->lj, w->fetch_held, b)
                           : xknn__sym_publish(w, 0, w->l0, w->own_dev, b);
    }
    if (rank == 0 && ss == XKNN_SUCCESS) ss = xknn__sym_publish(w, 1, w->l0, w->own_dev, m0);
    return ss;
}

/* Steps 0 .. S: the step's blocks of the schedule (xknn__sym_step_rects); with pieces,
 * the pair runs in pieces. */
static xknn_status xknn__sym_work_step(xknn__sym_step *w, const xknn__ring_side *own, const xknn__ring_side *held)
{
    xknn__sym_rect blk[3];
    const int nb = xknn__sym_step_rects(w->P, w->rank, w->s, w->m, w->half, w->cut, w->pieces > 0, blk);
    xknn_status ss = XKNN_SUCCESS;
    int i;
    for (i = 0; i < nb && ss == XKNN_SUCCESS; i++) {
        const xknn__sym_rect *b = &blk[i];
        if (w->pieces > 0 && xknn__sym_is_pair(b)) continue;
        ss = xknn__sym_call(w, b->a == XKNN__SYM_OWN ? own : held, b->a0, b->a1 - b->a0,
                            b->b == XKNN__SYM_NONE ? NULL : b->b == XKNN__SYM_OWN ? own : held, b->b0, b->b1 - b->b0);
    }
    if (ss == XKNN_SUCCESS && w->pieces > 0) ss = xknn__sym_work_pieces(w, own, held);
    return ss;
}

/* After the calls: the copies started by publish over, and the lists kept on the device
 * whose last step this is brought to the host (or dropped after a failure). Returns the
 * step's status (ss, or the first failure of these). */
static xknn_status xknn__sym_work_fetch(xknn__sym_step *w, xknn_status ss)
{
    if (w->last_ticket > 0) {
        /* the copier runs them in order: waiting for the last, without the mutex the main
         * thread reads its news under; their rows are told (all of them, unless one failed) */
        int bad = 0, over = 0;
#ifdef XKNN_MPI_HAVE_CUDA
        xknn_error ce;
        bad = xknn_cuda_copy_lists_test((xknn_cuda_context *)w->kctx, w->last_ticket, 1, &over, &ce) != XKNN_SUCCESS;
#endif
        (void)over;
        pthread_mutex_lock(&w->rd->mu);
        bad = xknn__sym_landed(w->rd) != 0 || bad;
        pthread_mutex_unlock(&w->rd->mu);
        if (bad && ss == XKNN_SUCCESS) ss = xknn__sym_copy_failed(w);
    }
#ifdef XKNN_MPI_HAVE_CUDA
    {
        /* here, with the calls' threads: the held slice's lists travel to their owner
         * next; the own rows' wait for the others' */
        xknn_cuda_context *kc = (xknn_cuda_context *)w->kctx;
        xknn_error fe;
        if (w->pieces > 0) {
            /* every row of both sets came to the host piece by piece (or the step failed):
             * the device copies go */
            if (w->fetch_held) (void)xknn_cuda_fetch_lists(kc, w->lj, 0, &fe);
            if (w->own_dev) {
                (void)xknn_cuda_fetch_lists(kc, w->l0, 0, &fe);
                w->own_dropped = 1;
            }
        } else if (w->fetch_held && w->held_from > 0 && ss == XKNN_SUCCESS) {
            xknn_error de;
            const xknn_status fs = xknn_cuda_copy_lists(kc, w->lj, w->held_from, w->mj - w->held_from, &fe);
            (void)xknn_cuda_fetch_lists(kc, w->lj, 0, &de);
            if (fs != XKNN_SUCCESS) {
                ss = fe.status;
                w->e = fe;
            }
        } else if (w->fetch_held && xknn_cuda_fetch_lists(kc, w->lj, ss == XKNN_SUCCESS, &fe) != XKNN_SUCCESS &&
                   ss == XKNN_SUCCESS) {
            ss = fe.status;
            w->e = fe;
        }
        if (w->fetch_own && xknn_cuda_fetch_lists(kc, w->l0, ss == XKNN_SUCCESS, &fe) != XKNN_SUCCESS &&
            ss == XKNN_SUCCESS) {
            ss = fe.status;
            w->e = fe;
        }
    }
#endif
    return ss;
}

/* One step's compute: the lists' padding, the calls, the lists to the host; then the
 * device rows whose last step this is are freed, beside the main thread's merges and
 * writes, and the main thread is told the step is over. */
static void *xknn__sym_work(void *arg)
{
    xknn__sym_step *w = (xknn__sym_step *)arg;
    const xknn_matrix cm = XKNN_MATRIX_TYPED(w->cur, w->mj, w->d, w->dtype);
    const xknn__ring_side own = {w->ref, w->r0, w->l0, w->d0}, held = {&cm, w->j0, w->lj, w->dj};
    xknn_status ss;
    w->t0 = xknn__sym_now();
    w->e.message[0] = '\0';
    /* this step's lists start as padding (first touch here, beside the transfers), on the
     * host unless they are kept on the device */
    if (w->s == 0 && !w->own_dev)
        xknn__sym_pad(w->l0, w->d0, w->nloc * w->k, w->neg, w->p->num_threads);
    else if (w->s >= 1 && w->s <= w->S && !w->prepadded)
        xknn__sym_pad(w->lj, w->dj, w->mj * w->k, w->neg, w->p->num_threads);
    xknn__sym_mark(w);
    ss = xknn__sym_work_step(w, &own, &held);
    w->tf0 = xknn__sym_now();
    ss = xknn__sym_work_fetch(w, ss);
    w->tf1 = xknn__sym_now();
    w->st = ss;
    w->t1 = xknn__sym_now();
#ifdef XKNN_MPI_HAVE_CUDA
    {
        /* (cudaFree of a gigabyte is no small wait: off the main thread's path) */
        int i;
        for (i = 0; i < 2; i++)
            if (w->forget[i]) xknn_cuda_forget_rows((xknn_cuda_context *)w->kctx, w->forget[i]);
    }
#endif
    if (w->rd) {
        pthread_mutex_lock(&w->rd->mu);
        w->rd->done = 1;
        pthread_mutex_unlock(&w->rd->mu);
    }
    return NULL;
}

/* Rows [lo, hi) of the k-wide list sets a and b merged into those of out
 * (xknn__merge_rows' order), rows spread over threads (OpenMP; 1: the calling thread
 * only). */
static void xknn__sym_merge(const xknn__cands *a, const xknn__cands *b, const xknn__cands *out, int64_t lo, int64_t hi,
                            int64_t k, int neg, int threads)
{
    const int64_t grain = 4096, rows = hi - lo;
    const int64_t parts = (rows + grain - 1) / grain;
    int64_t i;
    (void)threads;
#ifdef _OPENMP
    if (threads <= 0) threads = xknn_thread_budget();
#pragma omp parallel for schedule(dynamic, 4) num_threads(threads) if (threads > 1 && parts > 1)
#endif
    for (i = 0; i < parts; i++) {
        const int64_t r0 = lo + i * grain, nr = hi - r0 < grain ? hi - r0 : grain;
        xknn__cands ea, eb, eo;
        ea.ids = a->ids + r0 * k;
        ea.dist = a->dist + r0 * k;
        eb.ids = b->ids + r0 * k;
        eb.dist = b->dist + r0 * k;
        eo.ids = out->ids + r0 * k;
        eo.dist = out->dist + r0 * k;
        xknn__merge_rows(&ea, &eb, &eo, nr, k, neg);
    }
}

/* Completes the posted requests of a round (the slice for the next step, the lists of
 * the previous one): with poll (a worker computes meanwhile) by MPI_Testall in a loop, so
 * that the transfers progress (Open MPI has no progress thread); else MPI_Waitall.
 * Returns an MPI return code. */
static int xknn__sym_wait(int n, MPI_Request *req, int poll)
{
    int flag = 0, rc;
    if (!poll) return MPI_Waitall(n, req, MPI_STATUSES_IGNORE);
    for (;;) {
        rc = MPI_Testall(n, req, &flag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS || flag) return rc;
        sched_yield();
    }
}

/* The ring's state on one rank, from its set-up to its release. */
typedef struct xknn__ring {
    xknn_mpi_context *ctx;
    const xknn_matrix *ref; /* own rows (NULL for an empty slice)                       */
    const int64_t *row0s, *rowss;
    const xknn_mpi_output *out;
    xknn_mpi_timings *tm;
    xknn_error *lerr;
    xknn_status st;
    int64_t k, d, ref_offset, row_bytes, nloc, maxrows, n;
    xknn_dtype dtype;
    xknn_metric metric;
    int rank, P, S, neg, left, right;
    int nvis; /* list sets of visited slices: the current and the one in flight         */
    int nacc; /* accumulator, receive buffer, merge output (P = 2 in pieces: 2)        */
    xknn_params p, pw; /* pw: the worker's (one core fewer: the main thread polls)    */
    /* options, agreed: see xknn__ring_options */
    int threaded, bounds, pieces;
    /* buffers */
    int64_t *plan, *half, *cut; /* the plan: half, cut, scratch (P + 1)                */
    int64_t *allev;             /* rank 0: every rank's distance evaluations           */
    double *all;                /* rank 0: every rank's busy seconds                   */
    unsigned char *slice[2];
    const unsigned char *ownrows; /* the own slice as it travels: ref's rows, or a dense copy */
    int64_t *lid;                 /* own lists, nvis visited sets, nacc accumulation sets */
    float *ldist;
    xknn__cands own, vis[2], acc[3];
    xknn__cands fin;   /* the final lists of the own rows                               */
    xknn__cands spare; /* where the final lists go (with nrecv > 0)                     */
    float *bnd;        /* bounds: every row's k-th value after step 0, slices in rank order */
    int *bcnt;         /* bounds: counts and displacements of the slices                */
    MPI_Datatype rowtype, idtype, dtype_k;
    /* progress */
    int nrecv;         /* list sets of the own rows received so far                     */
    int padded_next;   /* the next step's list set is padding already                   */
    int64_t fdone, sunk; /* own rows final so far (in fin), and given to the sink       */
    int64_t lfrom;     /* P = 2: the first row of slice 0 whose lists rank 1 sends back  */
    int64_t pg;        /* P = 2 in pieces: g = m_0 - half[0], rank 0 computes rows [g, m_0) */
    int64_t nev, owned, done_q;
    int broken;        /* an MPI call failed: no more communication                     */
    xknn__sym_ready rd; /* the worker's news of final rows (P = 2's pieces)            */
    int rd_made;
    xknn__sym_step base; /* the fields every step's compute shares                     */
#ifdef XKNN_MPI_HAVE_CUDA
    xknn_cuda_context *cuctx; /* the rank's own, for all its steps                     */
    xknn_cuda_context *kctx;  /* where the rows are kept on the device                 */
    const void *kept[3];      /* kept blocks: own rows, the slice buffers              */
#endif
    int dlists;   /* running lists kept on the device (xknn_cuda_keep_lists)           */
    int own_dev;  /* the own lists are there now                                        */
    int held_dev; /* the held slice's lists of this step are there                      */
    double tdl;   /* seconds of the lists' moves between host and device after a step  */
    /* XKNN_MPI_SYM_TRACE=1 (a diagnostic, any rank): this rank's timeline on stderr,
     * seconds from tr0; trr, trw: tm's reduce and write seconds at the last line */
    int trace;
    double tr0, trr, trw;
} xknn__ring;

/* One round of the ring: step s's compute and the transfers beside it. */
typedef struct xknn__ring_round {
    int s, jown, jnext, t; /* the slice held, the one needed next, the step whose lists move */
    const unsigned char *cur;
    unsigned char *nxt;
    MPI_Request req[6], preq[64]; /* preq: P = 2's pieces, 2 a piece: slice 1's, slice 0's */
    xknn__cands *into; /* where this round's received lists land */
    xknn__sym_step w;
    pthread_t th;
    int worker, joined, compute, rc;
    double tw, tc, ta, tu;
} xknn__ring_round;

/* Own rows [a, b) to the sink (global rows row0 + a ..), its seconds counted as write;
 * a failure's message into lerr. */
static xknn_status xknn__ring_sink(xknn__ring *R, int64_t row0, int64_t a, int64_t b, const xknn__cands *fin)
{
    const xknn_mpi_output *out = R->out;
    const int64_t k = R->k;
    xknn_error e;
    xknn_status ss;
    const double t0 = MPI_Wtime();
    e.status = XKNN_SUCCESS;
    e.message[0] = '\0';
    ss = out->sink(out->sink_user, row0 + a, b - a, k, fin->ids + a * k, fin->dist + a * k, &e);
    R->tm->write += MPI_Wtime() - t0;
    if (ss == XKNN_SUCCESS) return ss;
    return e.message[0] ? xknn__mpi_fail(R->lerr, ss, "rank %d: %s", R->rank, e.message)
                        : xknn__mpi_fail(R->lerr, ss, "rank %d: result sink failed on rows %lld..%lld: %s", R->rank,
                                         (long long)(row0 + a), (long long)(row0 + b - 1), xknn_status_string(ss));
}

/* Own rows [a, b) final: their lists merged with the accumulator into fin (merge; else
 * fin is the own set), the seconds counted as reduce. */
static void xknn__ring_final(xknn__ring *R, int merge, int64_t a, int64_t b, int threads)
{
    const double t0 = MPI_Wtime();
    if (!merge || b <= a) return;
    xknn__sym_merge(&R->own, &R->acc[0], &R->fin, a, b, R->k, R->neg, threads);
    R->tm->reduce += MPI_Wtime() - t0;
}

/* xknn__mpi_check on the ring: a failed call's message into lerr, and no more
 * communication. */
static int xknn__ring_mpi_check(xknn__ring *R, int rc, const char *what)
{
    return xknn__mpi_check(rc, R->rank, &R->st, R->lerr, &R->broken, what);
}

/* The options (the same results with any of them): where the compute runs, and how
 * P = 2's last pair and the bounds go. Read from the environment here; bounds and
 * pieces hold only where every rank has them (xknn__ring_agree). */
static void xknn__ring_options(xknn__ring *R, const xknn_params *params)
{
    const char *env;
    int lvl = MPI_THREAD_SINGLE, is_main = 0;
    R->pieces = 4;
    /* The compute runs in a worker thread while this (the main) thread moves the data,
     * where MPI allows it: MPI_THREAD_FUNNELED or more, called from the main thread.
     * XKNN_MPI_SYM_THREAD=0: inline (a diagnostic). */
    env = xknn__knob(XKNN__KNOB_MPI_SYM_THREAD);
    if (MPI_Query_thread(&lvl) == MPI_SUCCESS && MPI_Is_thread_main(&is_main) == MPI_SUCCESS)
        R->threaded = R->P > 1 && lvl >= MPI_THREAD_FUNNELED && is_main && !(env && env[0] == '0');
    /* XKNN_MPI_SYM_PIECES (P = 2, default 4, 0 to 16): the last pair in that many
     * pieces, whose lists travel, are merged and go to the sink while the next piece
     * computes (see the opening comment); 0: in one call each, the lists after it. Not
     * with cut rows in slice 0. */
    env = xknn__knob(XKNN__KNOB_MPI_SYM_PIECES);
    if (env && env[0] >= '0' && env[0] <= '9' && atoi(env) >= 0 && atoi(env) <= 16) R->pieces = atoi(env);
    if (R->P != 2) R->pieces = 0;
    if (R->pieces > 0) R->nacc = 2; /* (the final lists of the own rows, made while the held set is in use) */
    /* Bounds (see the opening comment): on unless XKNN_MPI_SYM_BOUNDS=0; l2/euclidean
     * only, and n within an int count. */
    env = xknn__knob(XKNN__KNOB_MPI_SYM_BOUNDS);
    R->bounds = !(env && env[0] == '0');
    R->bounds = R->bounds && R->P > 1 && R->n <= INT_MAX &&
                (params->metric == XKNN_METRIC_L2 || params->metric == XKNN_METRIC_EUCLIDEAN);
    R->pw = R->p;
    if (R->threaded) {
        int nt = R->p.num_threads;
#ifdef _OPENMP
        if (nt <= 0) nt = xknn_thread_budget();
#endif
        R->pw.num_threads = nt > 1 ? nt - 1 : 1;
    }
}

/* The host buffers: list sets, two slices of rows, the plan, rank 0's balance table,
 * the bounds. Returns 1 when every one was allocated. */
static int xknn__ring_alloc(xknn__ring *R)
{
    const size_t set = (size_t)(R->maxrows * R->k);
    const int sets = 1 + R->nvis + R->nacc, P = R->P;
    int j;
    R->lid = (int64_t *)malloc(set * (size_t)sets * sizeof(int64_t) + 1);
    R->ldist = (float *)malloc(set * (size_t)sets * sizeof(float) + 1);
    if (R->lid && R->ldist) {
        R->own.ids = R->lid;
        R->own.dist = R->ldist;
        for (j = 0; j < R->nvis; j++) {
            R->vis[j].ids = R->lid + (size_t)(1 + j) * set;
            R->vis[j].dist = R->ldist + (size_t)(1 + j) * set;
        }
        for (j = 0; j < R->nacc; j++) {
            R->acc[j].ids = R->lid + (size_t)(1 + R->nvis + j) * set;
            R->acc[j].dist = R->ldist + (size_t)(1 + R->nvis + j) * set;
        }
        /* the final lists: into the accumulation set the last merge leaves free, or
         * (one accumulator) a visited slice's set, no longer needed by then */
        R->spare = R->nacc > 1 ? R->acc[1] : R->nacc == 1 ? R->vis[0] : R->own;
    }
    R->slice[0] = (unsigned char *)malloc((size_t)(R->maxrows * R->row_bytes) + 1);
    R->slice[1] = (unsigned char *)malloc((size_t)(R->maxrows * R->row_bytes) + 1);
    R->plan = (int64_t *)malloc((size_t)(3 * P + 1) * sizeof(int64_t));
    if (R->rank == 0) {
        R->all = (double *)malloc((size_t)P * sizeof(double));
        R->allev = (int64_t *)malloc((size_t)P * sizeof(int64_t));
    }
    if (R->bounds) {
        R->bnd = (float *)malloc((size_t)R->n * sizeof(float) + 1);
        R->bcnt = (int *)malloc((size_t)(2 * P) * sizeof(int));
        if (R->bcnt) {
            int64_t at = 0;
            for (j = 0; j < P; j++) {
                R->bcnt[j] = (int)R->rowss[j];
                R->bcnt[P + j] = (int)at;
                at += R->rowss[j];
            }
        }
    }
    return R->lid && R->ldist && R->slice[0] && R->slice[1] && R->plan && (R->rank != 0 || (R->all && R->allev)) &&
           (!R->bounds || (R->bnd && R->bcnt));
}

/* Every rank learns whether all could allocate before anything travels; a rank that
 * could not carries the message to the caller's final agreement. The options read from
 * the environment hold only where every rank has them (the steps and collectives must
 * match). Returns 0 when the ring goes on. */
static int xknn__ring_agree(xknn__ring *R, int have_all)
{
    int have[3], every[3] = {0, 0, 0}, rc;
    have[0] = have_all;
    have[1] = R->bounds;
    have[2] = R->pieces;
    if (!have[0])
        R->st = xknn__mpi_fail(R->lerr, XKNN_ERROR_OUT_OF_MEMORY,
                               "rank %d: out of memory for the symmetric self-join (%d list sets of %lld rows, k=%lld)",
                               R->rank, 1 + R->nvis + R->nacc, (long long)R->maxrows, (long long)R->k);
    rc = MPI_Allreduce(have, every, 3, MPI_INT, MPI_MIN, R->ctx->comm);
    if (xknn__ring_mpi_check(R, rc, "MPI_Allreduce")) return -1;
    if (!every[0]) return -1;
    R->bounds = every[1];
    /* (no piece without a row) */
    R->pieces = R->P != 2 ? 0 : every[2] < R->rowss[1] ? every[2] : (int)R->rowss[1];
    return 0;
}

/* The plan (ring_schedule.c), the same on every rank, and what follows from it. */
static void xknn__ring_plan(xknn__ring *R)
{
    R->half = R->plan;
    R->cut = R->plan + R->P;
    xknn__sym_plan(R->P, R->rowss, R->half, R->cut, R->plan + 2 * R->P);
    /* P = 2: rank 1's last pair holds rows [half[0], m_0) of slice 0; only their lists
     * travel back (the others are padding), unless it also computes slice 0's first cut
     * rows (step 1 of the plan), whose rectangle reaches every row */
    R->lfrom = R->P == 2 && R->cut[0] == 0 ? R->half[0] : 0;
    if (R->cut[0] != 0) R->pieces = 0;
    if (R->pieces > 0) R->pg = R->rowss[0] - R->half[0];
}

#ifdef XKNN_MPI_HAVE_CUDA
/* The device side, where the backend is CUDA: one context for all the steps, the rows
 * and the running lists kept on the device. */
static void xknn__ring_device(xknn__ring *R, const xknn_params *params)
{
    xknn_params *p = &R->p;
    /* One CUDA context for all the steps of a rank on a GPU: its memory pool keeps the
     * device buffers between the pairs and its pinned staging moves the rows. Where it
     * cannot be made, each call makes its own (and reports what stands in the way). */
    if (!p->cuda_context && R->dtype == XKNN_DTYPE_F32 && p->device >= 0 &&
        (p->backend == XKNN_BACKEND_CUDA || p->backend == XKNN_BACKEND_AUTO)) {
        xknn_error ce;
        if (xknn_cuda_context_create(p->device, &R->cuctx, &ce) == XKNN_SUCCESS)
            p->cuda_context = R->pw.cuda_context = R->cuctx;
    }
    /* Rows kept on the device (xknn_cuda_keep_rows): the own slice, uploaded by the first
     * part that reads it, and each held slice, uploaded by the main thread as soon as it
     * has arrived (while the step before computes), so that no part of a step uploads
     * rows again. XKNN_CUDA_KEEP=0 (a diagnostic) keeps none. */
    if (p->cuda_context && R->dtype == XKNN_DTYPE_F32 && R->nloc > 0 &&
        xknn_search_pair_why_not(p, R->dtype, R->d) == NULL) {
        const char *env = xknn__knob(XKNN__KNOB_CUDA_KEEP);
        if (!(env && env[0] == '0')) {
            xknn_error ke;
            R->kctx = (xknn_cuda_context *)p->cuda_context;
            if (xknn_cuda_keep_rows(R->kctx, R->ref, 0, &ke) == XKNN_SUCCESS)
                R->kept[0] = R->ref->data;
            else if (R->ctx->config.verbose)
                fprintf(stderr, "xknn_mpi: rank %d: own rows not kept on the device: %s\n", R->rank, ke.message);
        }
    }
    /* Running lists kept on the device (xknn_cuda_keep_lists): the own rows' for all the
     * steps (padding made there), each held slice's for its step (padding and bounds made
     * there); a step's pairs merge into them on the device, and each set crosses to the
     * host once, when its last step is done. XKNN_MPI_SYM_DEVICE_LISTS=0 (a diagnostic)
     * keeps them on the host. */
    if (R->kctx) {
        const char *env = xknn__knob(XKNN__KNOB_MPI_SYM_DEVICE_LISTS);
        R->dlists = !(env && env[0] == '0');
    }
    if (R->dlists) {
        xknn_error ke;
        /* (their host arrays' first touch here, on all threads, not in the fetch at the
         * end of the last step: the device keeps them, the host's pages stay untouched
         * until then) */
        xknn__sym_pad(R->own.ids, R->own.dist, R->nloc * R->k, R->neg, p->num_threads);
        if (xknn_cuda_keep_lists(R->kctx, params->metric, R->own.ids, R->own.dist, R->nloc, R->k,
                                 XKNN_CUDA_LISTS_PADDING, NULL, &ke) == XKNN_SUCCESS)
            R->own_dev = 1;
        else if (R->ctx->config.verbose)
            fprintf(stderr, "xknn_mpi: rank %d: own lists not kept on the device: %s\n", R->rank, ke.message);
    }
}
#endif

/* The MPI types of a row of the slice and of a row of lists (k ids, k distances: counts
 * in rows keep large lists in int), the own slice as the first travelling buffer, and
 * what every step's compute shares. Returns 0, or -1 after an MPI failure. */
static int xknn__ring_start(xknn__ring *R)
{
    xknn__sym_step *b = &R->base;
    int rc = MPI_Type_contiguous((int)R->row_bytes, MPI_BYTE, &R->rowtype);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&R->rowtype);
    if (rc == MPI_SUCCESS) rc = MPI_Type_contiguous((int)R->k, MPI_INT64_T, &R->idtype);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&R->idtype);
    if (rc == MPI_SUCCESS) rc = MPI_Type_contiguous((int)R->k, MPI_FLOAT, &R->dtype_k);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&R->dtype_k);
    if (xknn__ring_mpi_check(R, rc, "MPI_Type_contiguous")) return -1;
    if (R->nloc > 0) {
        /* ref's rows themselves when they are dense, else a packed copy */
        const int64_t elems = xknn_row_elems(R->dtype, R->d);
        const int64_t ld_bytes = (R->ref->ld ? R->ref->ld : elems) * (R->row_bytes / elems);
        int64_t i;
        R->ownrows = (const unsigned char *)R->ref->data;
        if (ld_bytes != R->row_bytes) {
            for (i = 0; i < R->nloc; i++)
                memcpy(R->slice[0] + i * R->row_bytes, (const unsigned char *)R->ref->data + i * ld_bytes,
                       (size_t)R->row_bytes);
            R->ownrows = R->slice[0];
        }
    }
    {
        /* (the worker's params: pw; inline: p; every other field zero) */
        const xknn__sym_step base = {
            .p = &R->pw, .ref = R->ref, .m = R->rowss, .half = R->half, .cut = R->cut, .k = R->k, .d = R->d,
            .nloc = R->nloc, .r0 = R->ref_offset, .l0 = R->own.ids, .d0 = R->own.dist, .dtype = R->dtype,
            .P = R->P, .S = R->S, .rank = R->rank, .neg = R->neg};
        *b = base;
    }
    memset(&R->rd, 0, sizeof R->rd);
    R->rd_made = pthread_mutex_init(&R->rd.mu, NULL) == 0; /* (else no news: rows final after the loop) */
    return 0;
}

/* Posts round s's transfers: slice jnext from the right while the held slice goes to the
 * left (every rank works with the slice it holds in every step, even P's last included;
 * every rank relays, also one with an empty slice); step t = s - 1's lists, the held
 * slice's to its owner and the own rows' from the rank that held them; P = 2 in pieces,
 * the partner's lists of the own rows piece by piece. Returns 0, or -1 after an MPI
 * failure (the receives cancelled). */
static int xknn__ring_post(xknn__ring *R, xknn__ring_round *o)
{
    const int rank = R->rank, P = R->P, S = R->S, s = o->s, t = o->t;
    const int64_t k = R->k;
    MPI_Comm comm = R->ctx->comm;
    const double t0 = MPI_Wtime();
    int rc = MPI_SUCCESS, r;
    if (s < S && P > 1) {
        if (R->rowss[o->jnext] > 0)
            rc = MPI_Irecv(o->nxt, (int)R->rowss[o->jnext], R->rowtype, R->right, XKNN__TAG_SLICE, comm, &o->req[0]);
        if (rc == MPI_SUCCESS && R->rowss[o->jown] > 0)
            rc = MPI_Isend(o->cur, (int)R->rowss[o->jown], R->rowtype, R->left, XKNN__TAG_SLICE, comm, &o->req[1]);
    }
    if (rc == MPI_SUCCESS && t >= 1 && !(R->pieces > 0 && s == S + 1)) {
        /* the first set lands in the accumulator itself (P = 2 in pieces: nothing moves
         * after the last step, its lists moved during it) */
        const int jt = xknn__sym_held(P, rank, t), from = xknn__sym_holder(P, rank, t);
        const xknn__cands *v = &R->vis[t % R->nvis];
        /* (P = 2: rank 1's set holds rows [lfrom, m_0) of slice 0, padding before) */
        const int64_t so = rank == 1 ? R->lfrom : 0, ro = rank == 0 ? R->lfrom : 0;
        const int64_t mt = R->rowss[jt] - so;
        if (mt > 0) {
            rc = MPI_Isend(v->ids + so * k, (int)mt, R->idtype, jt, XKNN__TAG_LIST_IDS, comm, &o->req[2]);
            if (rc == MPI_SUCCESS)
                rc = MPI_Isend(v->dist + so * k, (int)mt, R->dtype_k, jt, XKNN__TAG_LIST_DIST, comm, &o->req[3]);
        }
        if (rc == MPI_SUCCESS && R->nloc - ro > 0) {
            o->into = R->nrecv == 0 ? &R->acc[0] : &R->acc[1];
            rc = MPI_Irecv(o->into->ids + ro * k, (int)(R->nloc - ro), R->idtype, from, XKNN__TAG_LIST_IDS, comm,
                           &o->req[4]);
            if (rc == MPI_SUCCESS)
                rc = MPI_Irecv(o->into->dist + ro * k, (int)(R->nloc - ro), R->dtype_k, from, XKNN__TAG_LIST_DIST,
                               comm, &o->req[5]);
        }
    }
    if (rc == MPI_SUCCESS && R->pieces > 0 && s == S) {
        /* straight into the accumulator (the only set this rank receives): rank 1 gets
         * slice 1's pieces (preq 0 ..), rank 0 slice 0's rows [0, g) in pieces (preq 2
         * pieces ..); rank 0's rows [g, m_0) take nothing (padding) */
        const int64_t m = rank == 0 ? R->pg : R->nloc;
        const int np = R->pieces, at = rank == 0 ? 2 * np : 0;
        int q;
        for (q = 0; q < np && rc == MPI_SUCCESS; q++) {
            const int64_t a = xknn__sym_at(rank == 1, m, np, q), b = xknn__sym_at(rank == 1, m, np, q + 1);
            if (b == a) continue;
            rc = MPI_Irecv(R->acc[0].ids + a * k, (int)(b - a), R->idtype, 1 - rank, XKNN__TAG_LIST_IDS, comm,
                           &o->preq[at + 2 * q]);
            if (rc == MPI_SUCCESS)
                rc = MPI_Irecv(R->acc[0].dist + a * k, (int)(b - a), R->dtype_k, 1 - rank, XKNN__TAG_LIST_DIST, comm,
                               &o->preq[at + 2 * q + 1]);
        }
        R->nrecv = 1; /* (rank 0's rows [g, m_0) become padding once the worker runs) */
    }
    R->tm->broadcast += MPI_Wtime() - t0;
    if (!xknn__ring_mpi_check(R, rc, "MPI_Isend/MPI_Irecv (reference slice or lists)")) return 0;
    for (r = 0; r < 6; r += (r == 0 ? 4 : 1)) /* the receives: 0, 4, 5 */
        if (o->req[r] != MPI_REQUEST_NULL) MPI_Cancel(&o->req[r]);
    for (r = 0; r < 64; r++)
        if (o->preq[r] != MPI_REQUEST_NULL) MPI_Cancel(&o->preq[r]);
    MPI_Waitall(6, o->req, MPI_STATUSES_IGNORE);
    MPI_Waitall(64, o->preq, MPI_STATUSES_IGNORE);
    return -1;
}

/* The held slice's lists before step s computes: kept on the device (padding and bounds
 * made there), or on the host starting from its owner's k-th values after step 0 in
 * their last entry (id -1): what lies beyond cannot enter the owner's lists. */
static void xknn__ring_held_lists(xknn__ring *R, const xknn__ring_round *o)
{
    const int s = o->s, jown = o->jown, P = R->P;
    const int64_t k = R->k;
#ifdef XKNN_MPI_HAVE_CUDA
    if (R->dlists && o->compute && s >= 1 && s <= R->S && R->rowss[jown] > 0) {
        const xknn__cands *v = &R->vis[s % R->nvis];
        xknn_error ke;
        const double tk = xknn__sym_now();
        if (xknn_cuda_keep_lists(R->kctx, R->metric, v->ids, v->dist, R->rowss[jown], k, XKNN_CUDA_LISTS_PADDING,
                                 R->bounds ? R->bnd + R->bcnt[P + jown] : NULL, &ke) == XKNN_SUCCESS)
            R->held_dev = 1;
        else if (R->ctx->config.verbose)
            fprintf(stderr, "xknn_mpi: rank %d: slice %d's lists not kept on the device: %s\n", R->rank, jown,
                    ke.message);
        R->tdl += xknn__sym_now() - tk;
    }
#endif
    if (R->bounds && s >= 1 && s <= R->S && R->rowss[jown] > 0 && !R->held_dev) {
        const xknn__cands *v = &R->vis[s % R->nvis];
        const float *bj = R->bnd + R->bcnt[P + jown];
        int64_t i;
        if (!R->padded_next) xknn__lists_pad(v->ids, v->dist, R->rowss[jown] * k, R->neg);
        R->padded_next = 1;
        for (i = 0; i < R->rowss[jown]; i++) v->dist[i * k + k - 1] = bj[i];
    }
}

/* Step s's compute (xknn__sym_work) in the worker thread, or inline where there is none. */
static void xknn__ring_launch(xknn__ring *R, xknn__ring_round *o)
{
    xknn__sym_step *w = &o->w;
    const int s = o->s, S = R->S;
    const xknn_mpi_output *out = R->out;
    w->cur = o->cur;
    w->mj = R->rowss[o->jown];
    w->j0 = R->row0s[o->jown];
    if (s >= 1 && s <= S) {
        w->lj = R->vis[s % R->nvis].ids;
        w->dj = R->vis[s % R->nvis].dist;
    }
    w->s = s;
    w->prepadded = s >= 1 && s <= S && (R->padded_next || R->held_dev);
    w->own_dev = R->own_dev;
#ifdef XKNN_MPI_HAVE_CUDA
    w->kctx = R->kctx;
#endif
    w->fetch_held = R->held_dev;
    w->held_from = s == S && R->P == 2 && R->rank == 1 ? R->lfrom : 0;
    /* (pieces: the worker brings them piece by piece) */
    w->fetch_own = R->own_dev && s == S && R->pieces == 0;
#ifdef XKNN_MPI_HAVE_CUDA
    if (s == S) {
        /* (the last step that reads the own rows and the held slice) */
        w->forget[0] = R->kept[0];
        w->forget[1] = s >= 1 ? R->kept[1 + (s & 1)] : NULL;
    }
#endif
    w->pieces = s == S ? R->pieces : 0;
    /* (rank 0's own rows [g, m_0) go to the sink as they end: sink-only, any order) */
    w->hparts = s == S && R->pieces > 0 && R->rank == 0 && out->sink && out->gather_root < 0 && out->any_order;
    if (s == S && R->pieces > 0 && R->rd_made) {
        xknn__sym_ready *rd = &R->rd;
        rd->rows = 0;
        rd->rows2 = 0;
        rd->done = 0;
        rd->qh[0] = rd->qh[1] = rd->qt[0] = rd->qt[1] = 0;
#ifdef XKNN_MPI_HAVE_CUDA
        rd->kctx = R->kctx;
#endif
        w->rd = rd;
    }
    o->worker = R->threaded && pthread_create(&o->th, NULL, xknn__sym_work, w) == 0;
    if (!o->worker) {
        w->p = &R->p;
        xknn__sym_work(w);
    }
}

/* P = 2, the last exchange without pieces: the partner's last pair held rows [lfrom, m)
 * of slice 0 (lfrom = half[0]; no cut rows), so rank 0's rows [0, lfrom) take nothing
 * from the lists now on their way: they are final, and go to the sink while the
 * exchange runs, in blocks (xknn__sym_block), its requests tested between them. */
static void xknn__ring_early_sink(xknn__ring *R, xknn__ring_round *o)
{
    const int64_t piece = xknn__sym_block(R->k), lfrom = R->lfrom;
    int flag = 0;
    while (R->sunk < lfrom) {
        const int64_t b = lfrom - R->sunk < piece ? lfrom : R->sunk + piece;
        if ((R->st = xknn__ring_sink(R, R->ref_offset, R->sunk, b, &R->own)) != XKNN_SUCCESS) break;
        R->owned++;
        R->sunk = b;
        (void)MPI_Testall(6, o->req, &flag, MPI_STATUSES_IGNORE);
    }
    R->fdone = R->sunk; /* (fin holds rows [sunk, nloc) only: no gather here) */
    if (R->trace)
        fprintf(stderr, "xknn_mpi: trace rank %d: rows 0..%lld final and written %.3f\n", R->rank,
                (long long)R->sunk - 1, xknn__sym_now() - R->tr0);
}

/* Once round 0's transfers are over, while step 0 computes: the first touch of the
 * accumulator sets (first written by the receives of round 2 and on; for P = 2 only by
 * the last exchange, after the compute) and of the visited sets whose lists the device
 * keeps (first written by the copies to the host), so that their page faults are off
 * the later steps' path and after the next slice's upload, which they would delay. */
static void xknn__ring_first_touch(xknn__ring *R)
{
    const size_t set = (size_t)(R->maxrows * R->k);
    int j;
    for (j = 0; j < R->nacc; j++) {
        memset(R->acc[j].ids, 0, set * sizeof(int64_t));
        memset(R->acc[j].dist, 0, set * sizeof(float));
    }
    for (j = 0; j < R->nvis && R->dlists; j++) {
        memset(R->vis[j].ids, 0, set * sizeof(int64_t));
        memset(R->vis[j].dist, 0, set * sizeof(float));
    }
}

/* The lists received this round folded into the accumulator (one thread while the
 * worker has the others). */
static void xknn__ring_fold(xknn__ring *R, const xknn__ring_round *o)
{
    if (R->nrecv > 0) {
        xknn__cands tmp;
        xknn__sym_merge(&R->acc[0], &R->acc[1], &R->acc[2], 0, R->nloc, R->k, R->neg, o->worker ? 1 : R->p.num_threads);
        tmp = R->acc[0];
        R->acc[0] = R->acc[2];
        R->acc[2] = tmp;
    }
    R->nrecv++;
}

/* P = 2's last exchange in pieces, as the main thread drives it. */
typedef struct xknn__ring_pcs {
    int64_t g;     /* rank 0 computes its rows [g, m_0)                               */
    int64_t ms;    /* the sent set's rows: rank 0, slice 1's; rank 1, slice 0's [0, g) */
    int64_t mr;    /* the received pieces' rows: rank 0, [0, g); rank 1, its own      */
    int64_t hs, hr; /* rows told by the worker: of the sent set, of the own set       */
    int64_t hsunk; /* rank 0, rows [g, hsunk) given to the sink (any order)           */
    int64_t rcur;  /* the next row of the received piece qr to merge (-1: not here)   */
    int64_t blk;   /* rows merged and given to the sink at a time                     */
    const xknn__cands *v; /* the held set                                            */
    int so, ro;    /* the first sent and received request in preq                     */
    int qs, qr;    /* pieces sent, pieces received and merged                          */
    int mt;        /* threads of a merge while the worker computes                     */
    int over;      /* the worker is done                                               */
} xknn__ring_pcs;

/* Sends the held set's pieces the worker has told (all of them once it is done).
 * Returns whether one was sent. */
static int xknn__ring_pieces_send(xknn__ring *R, xknn__ring_round *o, xknn__ring_pcs *c)
{
    const int rank = R->rank, np = R->pieces;
    const int64_t k = R->k;
    int moved = 0;
    while (c->qs < np && o->rc == MPI_SUCCESS) {
        /* (rank 0 sends slice 1's pieces, rank 1 the parts of slice 0's rows [0, g)) */
        const int64_t a = xknn__sym_at(rank == 0, c->ms, np, c->qs);
        const int64_t b = xknn__sym_at(rank == 0, c->ms, np, c->qs + 1);
        if (b > c->hs && !c->over) break;
        if (b > a) {
            o->rc = MPI_Isend(c->v->ids + a * k, (int)(b - a), R->idtype, 1 - rank, XKNN__TAG_LIST_IDS, R->ctx->comm,
                              &o->preq[c->so + 2 * c->qs]);
            if (o->rc == MPI_SUCCESS)
                o->rc = MPI_Isend(c->v->dist + a * k, (int)(b - a), R->dtype_k, 1 - rank, XKNN__TAG_LIST_DIST,
                                  R->ctx->comm, &o->preq[c->so + 2 * c->qs + 1]);
            if (R->trace)
                fprintf(stderr, "xknn_mpi: trace rank %d: piece %d of slice %d's lists (rows %lld..%lld) sent %.3f\n",
                        rank, c->qs, 1 - rank, (long long)a, (long long)b - 1, xknn__sym_now() - R->tr0);
        }
        c->qs++;
        moved = 1;
    }
    return moved;
}

/* Merges each received piece with the own rows once it is here and they are told (rank
 * 0: its rows [0, g); rank 1: the piece's own rows), a block at a time, and gives it to
 * the sink (rows in increasing order). Returns whether anything moved. */
static int xknn__ring_pieces_merge(xknn__ring *R, xknn__ring_round *o, xknn__ring_pcs *c)
{
    const int rank = R->rank, np = R->pieces;
    int moved = 0, flag = 0;
    while (c->qr < np && o->rc == MPI_SUCCESS) {
        const int64_t a = xknn__sym_at(rank == 1, c->mr, np, c->qr);
        const int64_t b = xknn__sym_at(rank == 1, c->mr, np, c->qr + 1);
        const int64_t need = rank == 0 ? c->g : b; /* the own rows it merges with, told */
        if (c->hr < need && !c->over) break;
        if (c->rcur < 0) {
            o->rc = MPI_Testall(2, o->preq + c->ro + 2 * c->qr, &flag, MPI_STATUSES_IGNORE);
            if (o->rc != MPI_SUCCESS || !flag) break;
            c->rcur = a;
        }
        if (b > a && c->hr >= need && R->st == XKNN_SUCCESS) {
            const int64_t e = b - c->rcur > c->blk ? c->rcur + c->blk : b;
            /* (all threads once the worker is done) */
            xknn__ring_final(R, 1, c->rcur, e, c->over ? R->p.num_threads : c->mt);
            R->fdone = e;
            if (R->out->sink && (R->st = xknn__ring_sink(R, R->ref_offset, c->rcur, e, &R->fin)) == XKNN_SUCCESS) {
                R->sunk = e;
                R->owned++;
            }
            if (R->trace && e == b) {
                fprintf(stderr,
                        "xknn_mpi: trace rank %d: piece %d, own rows %lld..%lld final%s %.3f (merge %.1f ms, "
                        "sink %.1f ms)\n",
                        rank, c->qr, (long long)a, (long long)b - 1, R->out->sink ? " and written" : "",
                        xknn__sym_now() - R->tr0, 1e3 * (R->tm->reduce - R->trr), 1e3 * (R->tm->write - R->trw));
                R->trr = R->tm->reduce;
                R->trw = R->tm->write;
            }
            c->rcur = e;
        } else {
            c->rcur = b;
        }
        moved = 1;
        if (c->rcur < b) break; /* (one block a round: the sends first) */
        c->qr++;
        c->rcur = -1;
    }
    return moved;
}

/* Rank 0's rows [g, m_0) take nothing from rank 1: with hparts, final once told, given
 * to the sink as they come. Returns whether any went. */
static int xknn__ring_pieces_hparts(xknn__ring *R, const xknn__ring_round *o, xknn__ring_pcs *c)
{
    if (o->rc != MPI_SUCCESS || !o->w.hparts || c->hr <= c->hsunk || R->st != XKNN_SUCCESS) return 0;
    if ((R->st = xknn__ring_sink(R, R->ref_offset, c->hsunk, c->hr, &R->own)) == XKNN_SUCCESS) R->owned++;
    if (R->trace) {
        fprintf(stderr, "xknn_mpi: trace rank 0: own rows %lld..%lld final and written %.3f (sink %.1f ms)\n",
                (long long)c->hsunk, (long long)c->hr - 1, xknn__sym_now() - R->tr0, 1e3 * (R->tm->write - R->trw));
        R->trw = R->tm->write;
    }
    c->hsunk = c->hr;
    return 1;
}

/* The threads of a merge while the worker computes (all of them once it is done): one
 * where the worker computes on the CPU with the others; half where it waits on a GPU.
 * XKNN_MPI_SYM_MERGE_THREADS=N (a diagnostic) sets it. */
static int xknn__ring_merge_threads(const xknn__ring *R)
{
    const char *menv = xknn__knob(XKNN__KNOB_MPI_SYM_MERGE_THREADS);
    int mt = 1;
#if defined(XKNN_MPI_HAVE_CUDA) && defined(_OPENMP)
    if (R->kctx) mt = (R->p.num_threads > 0 ? R->p.num_threads : xknn_thread_budget()) / 2;
#endif
    (void)R;
    if (menv && atoi(menv) > 0) mt = atoi(menv);
    return mt < 1 ? 1 : mt;
}

/* P = 2, the last pair in pieces (see the worker), two streams a rank, driven by the
 * worker's news: each piece of the held set's lists goes to the partner once told
 * (rank 0: slice 1's pieces, rows; rank 1: slice 0's rows [0, g), rows2), and each
 * piece of the partner's is merged with the own rows and goes to the sink. Every piece
 * travels, also after a failed step (the partner's receives are posted); only the
 * merges wait on the news. */
static void xknn__ring_pieces(xknn__ring *R, xknn__ring_round *o)
{
    const int rank = R->rank;
    /* (a piece is merged and given to the sink in blocks of about 8 MiB of lists, or
     * XKNN_MPI_SYM_BLOCK_ROWS rows (a test hook), the sends checked between them) */
    const char *benv = xknn__knob(XKNN__KNOB_MPI_SYM_BLOCK_ROWS);
    xknn__ring_pcs c;
    int flag = 0;
    memset(&c, 0, sizeof c);
    c.g = R->pg;
    c.ms = rank == 0 ? R->rowss[1] : c.g;
    c.mr = rank == 0 ? c.g : R->nloc;
    c.v = &R->vis[R->S % R->nvis];
    c.so = rank == 0 ? 0 : 2 * R->pieces;
    c.ro = rank == 0 ? 2 * R->pieces : 0;
    c.hsunk = c.g;
    c.rcur = -1;
    c.blk = benv && atoll(benv) > 0 ? (int64_t)atoll(benv) : xknn__sym_block(R->k);
    c.mt = xknn__ring_merge_threads(R);
    R->fin = R->spare;
    while ((c.qs < R->pieces || c.qr < R->pieces) && o->rc == MPI_SUCCESS) {
        int moved;
        c.hs = c.hr = 0;
        c.over = 1;
        if (o->compute && o->worker && R->rd_made) {
            /* (rank 0 sends slice 1's rows, rows; rank 1 slice 0's, rows2) */
            xknn__sym_news(&R->rd, rank == 0 ? &c.hs : &c.hr, rank == 0 ? &c.hr : &c.hs, &c.over);
        } else if (o->compute) {
            /* (inline, the step is over; no news without the mutex: after the join) */
            if (o->worker && !o->joined) pthread_join(o->th, NULL);
            o->joined = o->worker;
            c.hs = rank == 0 ? o->w.pub : o->w.pub2;
            c.hr = rank == 0 ? o->w.pub2 : o->w.pub;
        }
        moved = xknn__ring_pieces_send(R, o, &c);
        moved |= xknn__ring_pieces_merge(R, o, &c);
        moved |= xknn__ring_pieces_hparts(R, o, &c);
        if (o->rc == MPI_SUCCESS && !moved) {
            /* (progress for what is posted; Open MPI moves data only inside MPI calls) */
            const struct timespec nap = {0, 100000};
            o->rc = MPI_Testall(64, o->preq, &flag, MPI_STATUSES_IGNORE);
            nanosleep(&nap, NULL);
        }
    }
    if (o->rc == MPI_SUCCESS) o->rc = xknn__sym_wait(64, o->preq, o->worker && !o->joined);
    if (o->rc == MPI_SUCCESS && rank == 0 && o->compute && R->st == XKNN_SUCCESS && R->out->sink &&
        R->out->gather_root < 0 && R->fdone == c.g && R->sunk == c.g) {
        /* rows [g, m_0) take nothing from rank 1: final in the own set once the worker has
         * brought them all, given after rows [0, g) (any order: those left); fin holds rows
         * [0, g) only: no gather here */
        if (o->worker && !o->joined) pthread_join(o->th, NULL);
        o->joined = o->worker;
        if (o->w.st == XKNN_SUCCESS && o->w.pub2 == R->nloc) {
            if (R->nloc > c.hsunk &&
                (R->st = xknn__ring_sink(R, R->ref_offset, c.hsunk, R->nloc, &R->own)) == XKNN_SUCCESS) {
                R->owned++;
                if (R->trace)
                    fprintf(stderr, "xknn_mpi: trace rank 0: own rows %lld..%lld final and written %.3f\n",
                            (long long)c.hsunk, (long long)R->nloc - 1, xknn__sym_now() - R->tr0);
            }
            if (R->st == XKNN_SUCCESS) R->sunk = R->fdone = R->nloc;
        }
    }
}

/* The trace's line of a round. */
static void xknn__ring_trace_round(const xknn__ring *R, const xknn__ring_round *o)
{
    const xknn__sym_step *w = &o->w;
    const double tr0 = R->tr0;
    char line[512];
    int at = 0, i;
    at += snprintf(line + at, sizeof line - (size_t)at, "xknn_mpi: trace rank %d step %d:", R->rank, o->s);
    if (o->compute) {
        at += snprintf(line + at, sizeof line - (size_t)at, " compute %.3f..%.3f, marks", w->t0 - tr0, w->t1 - tr0);
        for (i = 0; i < w->nmark && at < (int)sizeof line - 16; i++)
            at += snprintf(line + at, sizeof line - (size_t)at, " %.3f", w->mark[i] - tr0);
        if (w->fetch_held || w->fetch_own)
            at += snprintf(line + at, sizeof line - (size_t)at, ", lists to the host %.3f..%.3f", w->tf0 - tr0,
                           w->tf1 - tr0);
        at += snprintf(line + at, sizeof line - (size_t)at, ";");
    }
    snprintf(line + at, sizeof line - (size_t)at,
             " transfers done %.3f, held slice on the device %.3f, moves done %.3f, joined %.3f\n", o->ta - tr0,
             o->tu - tr0, o->tc - tr0, xknn__sym_now() - tr0);
    fputs(line, stderr);
}

/* The end of a round: the worker joined, the device's kept rows and lists accounted,
 * the compute's seconds and evaluations counted. Busy seconds are the compute's own;
 * the moves count where they outlast it: the slices' (and lists') as broadcast time,
 * the last step's lists (round S + 1) as reduce time. */
static void xknn__ring_join(xknn__ring *R, xknn__ring_round *o)
{
    const xknn__sym_step *w = &o->w;
    const int s = o->s;
    o->tc = xknn__sym_now();
    if (o->worker && !o->joined) pthread_join(o->th, NULL);
#ifdef XKNN_MPI_HAVE_CUDA
    if (o->compute && w->forget[0]) R->kept[0] = NULL; /* (the worker forgot them) */
    if (o->compute && w->forget[1]) R->kept[1 + (s & 1)] = NULL;
    if (s >= 1 && R->kept[1 + (s & 1)]) {
        /* the held slice's buffer receives another slice later */
        xknn_cuda_forget_rows(R->kctx, R->kept[1 + (s & 1)]);
        R->kept[1 + (s & 1)] = NULL;
    }
    if (o->compute) {
        /* (the worker fetched them; a failed step drops them) */
        if (w->fetch_held) R->held_dev = 0;
        if (w->fetch_own || w->own_dropped) R->own_dev = 0;
        R->tdl += w->tf1 - w->tf0;
    }
#endif
    if (R->trace) xknn__ring_trace_round(R, o);
    if (o->compute) {
        R->tm->search += w->t1 - w->t0;
        R->nev += w->nev;
        if (w->st != XKNN_SUCCESS) R->st = xknn__mpi_fail(R->lerr, w->st, "rank %d: %s", R->rank, w->e.message);
    }
    if (s <= R->S)
        R->tm->broadcast += o->worker ? (o->tc > w->t1 ? o->tc - w->t1 : 0.0) : o->tc - o->tw;
    else
        R->tm->reduce += o->worker ? (o->tc > w->t1 ? o->tc - w->t1 : 0.0) : o->tc - o->tw;
    xknn__ring_mpi_check(R, o->rc, "MPI_Waitall (reference slice or lists)");
}

/* Bounds, after step 0: every row's k-th value (+inf where its list is not full yet), to
 * every rank (MPI_Allgatherv): the bounds of the slices it will hold. */
static void xknn__ring_bounds(xknn__ring *R)
{
    float *mine = R->bnd + R->bcnt[R->P + R->rank];
    const int64_t k = R->k;
    int64_t i;
    int have_kth = 0, rc;
    const double t0 = MPI_Wtime();
#ifdef XKNN_MPI_HAVE_CUDA
    if (R->own_dev) {
        /* (from the lists on the device; where that fails, they come to the host) */
        xknn_error ke;
        have_kth = xknn_cuda_lists_kth(R->kctx, R->own.ids, mine, &ke) == XKNN_SUCCESS;
        if (!have_kth) {
            if (xknn_cuda_fetch_lists(R->kctx, R->own.ids, 1, &ke) != XKNN_SUCCESS && R->st == XKNN_SUCCESS)
                R->st = xknn__mpi_fail(R->lerr, ke.status, "rank %d: %s", R->rank, ke.message);
            R->own_dev = 0;
        }
    }
#endif
    if (!have_kth)
        for (i = 0; i < R->nloc; i++)
            mine[i] = R->own.ids[i * k + k - 1] >= 0 ? R->own.dist[i * k + k - 1] : INFINITY;
    rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, R->bnd, R->bcnt, R->bcnt + R->P, MPI_FLOAT, R->ctx->comm);
    R->tm->broadcast += MPI_Wtime() - t0;
    if (R->trace) fprintf(stderr, "xknn_mpi: trace rank %d: bounds shared %.3f\n", R->rank, xknn__sym_now() - R->tr0);
    xknn__ring_mpi_check(R, rc, "MPI_Allgatherv (bounds)");
}

/* Round s: its transfers posted, step s's compute started, the transfers completed
 * beside it (the slice for step s + 1, uploaded to the device as it lands, and step
 * s - 1's lists, folded into the accumulator), the rows that became final merged and
 * given to the sink, the compute joined. Returns 0, or -1 when the ring stops. */
static int xknn__ring_round_run(xknn__ring *R, int s)
{
    const int rank = R->rank, P = R->P, S = R->S;
    xknn__ring_round o;
    int r;
    memset(&o, 0, sizeof o);
    o.s = s;
    o.jown = xknn__sym_held(P, rank, s);
    o.jnext = xknn__sym_held(P, rank, s + 1);
    o.t = s - 1;
    o.cur = s == 0 ? R->ownrows : R->slice[s & 1];
    o.nxt = R->slice[(s + 1) & 1];
    o.compute = R->st == XKNN_SUCCESS && s <= S;
    for (r = 0; r < 6; r++) o.req[r] = MPI_REQUEST_NULL;
    for (r = 0; r < 64; r++) o.preq[r] = MPI_REQUEST_NULL;
    o.w = R->base;
    if (xknn__ring_post(R, &o) != 0) return -1;
    xknn__ring_held_lists(R, &o);
    if (o.compute) xknn__ring_launch(R, &o);
    if (s == S && R->pieces > 0 && rank == 0) {
        /* (rows [g, m_0) of the accumulator take nothing: padding, while the step computes) */
        xknn__lists_pad(R->acc[0].ids + R->pg * R->k, R->acc[0].dist + R->pg * R->k, (R->nloc - R->pg) * R->k,
                        R->neg);
    }
    if (s == S && P == 2 && rank == 0 && R->lfrom > 0 && R->pieces == 0) {
        /* (its partner sends the lists of rows [lfrom, m) of this slice: the rows before
         * take padding, while this step computes) */
        xknn__lists_pad(R->acc[0].ids, R->acc[0].dist, R->lfrom * R->k, R->neg);
    }
    o.tw = xknn__sym_now();
    if (s == S + 1 && P == 2 && rank == 0 && R->lfrom > 0 && R->pieces == 0 && R->out->sink &&
        R->out->gather_root < 0 && R->st == XKNN_SUCCESS && !R->own_dev)
        xknn__ring_early_sink(R, &o);
    o.rc = xknn__sym_wait(6, o.req, o.worker);
    o.ta = xknn__sym_now();
#ifdef XKNN_MPI_HAVE_CUDA
    if (o.rc == MPI_SUCCESS && R->kctx && s < S && R->rowss[o.jnext] > 0 && !R->broken) {
        /* the slice of step s + 1 is here: onto the device now (step s still computes) */
        const xknn_matrix nm = XKNN_MATRIX_TYPED(o.nxt, R->rowss[o.jnext], R->d, R->dtype);
        xknn_error ke;
        if (xknn_cuda_keep_rows(R->kctx, &nm, 1, &ke) == XKNN_SUCCESS)
            R->kept[1 + ((s + 1) & 1)] = o.nxt;
        else if (R->ctx->config.verbose)
            fprintf(stderr, "xknn_mpi: rank %d: slice %d not kept on the device: %s\n", rank, o.jnext, ke.message);
    }
#endif
    o.tu = xknn__sym_now();
    if (o.worker && s == 0) xknn__ring_first_touch(R);
    if (o.rc == MPI_SUCCESS && o.into) xknn__ring_fold(R, &o);
    R->padded_next = 0;
    if (o.rc == MPI_SUCCESS && o.worker && s + 1 <= S) {
        /* the next step's list set (its send, if any, completed above) becomes padding
         * while the worker is still busy: its first touch off the compute's path */
        const xknn__cands *v = &R->vis[(s + 1) % R->nvis];
        xknn__lists_pad(v->ids, v->dist, R->rowss[xknn__sym_held(P, rank, s + 1)] * R->k, R->neg);
        R->padded_next = 1;
    }
    if (o.rc == MPI_SUCCESS && R->pieces > 0 && s == S) xknn__ring_pieces(R, &o);
    xknn__ring_join(R, &o);
    if (R->bounds && s == 0 && !R->broken) xknn__ring_bounds(R);
    return 0;
}

/* Delivery, slice by slice in rank order: gathered on the gather root, given to the
 * sink by the owner (the rows not given during the steps). */
static void xknn__ring_deliver(xknn__ring *R)
{
    const xknn_mpi_output *out = R->out;
    const int rank = R->rank;
    const int64_t k = R->k;
    int j;
    for (j = 0; j < R->P && !R->broken; j++) {
        const int64_t rows = R->rowss[j], m = rows * k, row0 = R->row0s[j];
        const double t0 = MPI_Wtime();
        int rc = MPI_SUCCESS;
        if (rows == 0) continue; /* the same on every rank */
        if (out->gather_root >= 0) {
            if (rank == j && j == out->gather_root) {
                memcpy(out->ids + row0 * k, R->fin.ids, (size_t)m * sizeof(int64_t));
                if (out->dist) memcpy(out->dist + row0 * k, R->fin.dist, (size_t)m * sizeof(float));
            } else if (rank == j) {
                rc = xknn__mpi_send_cands(R->ctx, &R->fin, rows, k, NULL, out->gather_root, XKNN__TAG_GATHER);
            } else if (rank == out->gather_root) {
                xknn__cands g;
                g.ids = out->ids + row0 * k;
                /* (no distances wanted: received into the accumulator, free by now) */
                g.dist = out->dist ? out->dist + row0 * k : R->acc[0].dist;
                rc = xknn__mpi_recv_cands(R->ctx, &g, rows, k, NULL, j, XKNN__TAG_GATHER);
            }
        }
        R->tm->reduce += MPI_Wtime() - t0;
        if (xknn__ring_mpi_check(R, rc, "MPI_Send/MPI_Recv (candidate lists)")) break;
        if (rank == j) {
            if (!out->sink || R->sunk < rows) R->owned++; /* (blocks given during the steps counted there) */
            if (out->sink && R->st == XKNN_SUCCESS && R->sunk < rows) {
                R->st = xknn__ring_sink(R, row0, R->sunk, rows, &R->fin);
                if (R->trace) fprintf(stderr, "xknn_mpi: trace rank %d: written %.3f\n", rank, xknn__sym_now() - R->tr0);
            }
        }
        R->done_q += rows;
        if (out->progress) out->progress(out->progress_user, R->done_q, R->n);
    }
}

/* Balance: every rank's distance evaluations and busy (compute) seconds, printed by rank
 * 0 with verbose (gathered always: verbose need not agree). */
static void xknn__ring_balance(xknn__ring *R)
{
    double busy = R->tm->search;
    int rc = MPI_Gather(&R->nev, 1, MPI_INT64_T, R->allev, 1, MPI_INT64_T, 0, R->ctx->comm), j;
    if (rc == MPI_SUCCESS) rc = MPI_Gather(&busy, 1, MPI_DOUBLE, R->all, 1, MPI_DOUBLE, 0, R->ctx->comm);
    if (rc == MPI_SUCCESS && R->rank == 0 && R->ctx->config.verbose) {
        fprintf(stderr, "xknn_mpi: symmetric ring: %d steps, %lld distance evaluations over %d ranks (compute %s)\n",
                R->S + 1, (long long)xknn__sym_tri(R->n), R->P,
                R->threaded ? "in a worker thread, transfers overlapped" : "inline, transfers after it");
        for (j = 0; j < R->P; j++)
            fprintf(stderr, "xknn_mpi: rank %d: distance_evals=%lld busy=%.3f s\n", j, (long long)R->allev[j],
                    R->all[j]);
    }
    xknn__ring_mpi_check(R, rc, "MPI_Gather (busy times)");
}

/* What the ring releases at its end (xknn__sym_release, through xknn__mpi_later). */
typedef struct xknn__sym_rel {
    void *host[9];
    int heap; /* the struct itself is malloc'd */
#ifdef XKNN_MPI_HAVE_CUDA
    xknn_cuda_context *cuctx; /* the ring's own (never the caller's) */
#endif
} xknn__sym_rel;

static void xknn__sym_release(void *arg)
{
    xknn__sym_rel *r = (xknn__sym_rel *)arg;
    int j;
#ifdef XKNN_MPI_HAVE_CUDA
    xknn_cuda_context_destroy(r->cuctx);
#endif
    for (j = 0; j < 9; j++) free(r->host[j]);
    if (r->heap) free(r);
}

/* Teardown: the MPI types; device copies on a context that may be the caller's, here,
 * before the return; what is the ring's alone (the context it made, gigabytes of list
 * sets and slices) released off the caller's path (xknn__mpi_later). */
static void xknn__ring_teardown(xknn__ring *R)
{
    xknn__sym_rel stack, *rl;
    xknn__sym_rel *r;
    if (R->rd_made) pthread_mutex_destroy(&R->rd.mu);
    if (R->dtype_k != MPI_DATATYPE_NULL) MPI_Type_free(&R->dtype_k);
    if (R->idtype != MPI_DATATYPE_NULL) MPI_Type_free(&R->idtype);
    if (R->rowtype != MPI_DATATYPE_NULL) MPI_Type_free(&R->rowtype);
#ifdef XKNN_MPI_HAVE_CUDA
    {
        xknn_error ke;
        int j;
        /* (a step failed: its lists are of no use) */
        if (R->own_dev) (void)xknn_cuda_fetch_lists(R->kctx, R->own.ids, 0, &ke);
        if (R->held_dev)
            for (j = 0; j < R->nvis; j++) (void)xknn_cuda_fetch_lists(R->kctx, R->vis[j].ids, 0, &ke);
        /* (the ring's own context frees its kept rows when it is destroyed, off the path) */
        for (j = 0; j < 3; j++)
            if (R->kept[j] && R->kctx != R->cuctx) xknn_cuda_forget_rows(R->kctx, R->kept[j]);
    }
#endif
    rl = (xknn__sym_rel *)malloc(sizeof *rl);
    r = rl ? rl : &stack;
    memset(r, 0, sizeof *r);
    r->heap = rl != NULL;
#ifdef XKNN_MPI_HAVE_CUDA
    r->cuctx = R->cuctx;
#endif
    r->host[0] = R->bcnt;
    r->host[1] = R->bnd;
    r->host[2] = R->allev;
    r->host[3] = R->all;
    r->host[4] = R->plan;
    r->host[5] = R->slice[1];
    r->host[6] = R->slice[0];
    r->host[7] = R->ldist;
    r->host[8] = R->lid;
    if (rl)
        xknn__mpi_later(R->ctx, xknn__sym_release, rl);
    else
        xknn__sym_release(r);
}

/* The ring's shape from the agreed arguments. */
static void xknn__ring_init(xknn__ring *R, xknn_mpi_context *ctx, const xknn__sym_job *job, xknn_mpi_timings *tm,
                            xknn_error *lerr)
{
    const char *trace_env = xknn__knob(XKNN__KNOB_MPI_SYM_TRACE);
    int j;
    memset(R, 0, sizeof *R);
    R->ctx = ctx;
    R->ref = job->ref;
    R->row0s = job->row0s;
    R->rowss = job->rowss;
    R->out = job->out;
    R->tm = tm;
    R->lerr = lerr;
    R->st = XKNN_SUCCESS;
    R->k = job->k;
    R->d = job->d;
    R->ref_offset = job->ref_offset;
    R->dtype = job->dtype;
    R->metric = job->params->metric;
    R->rank = ctx->rank;
    R->P = ctx->size;
    R->S = R->P / 2;
    R->neg = job->params->metric == XKNN_METRIC_IP;
    R->left = (R->rank - 1 + R->P) % R->P;
    R->right = (R->rank + 1) % R->P;
    R->nvis = R->S < 2 ? R->S : 2;
    R->nacc = R->S >= 2 ? 3 : R->S;
    R->row_bytes = xknn_row_bytes(job->dtype, job->d);
    R->nloc = job->rowss[R->rank];
    R->p = *job->params;
    R->rowtype = R->idtype = R->dtype_k = MPI_DATATYPE_NULL;
    R->trace = trace_env && trace_env[0] == '1';
    R->tr0 = xknn__sym_now();
    for (j = 0; j < R->P; j++) {
        if (job->rowss[j] > R->maxrows) R->maxrows = job->rowss[j];
        R->n += job->rowss[j];
    }
}

xknn_status xknn__sym_ring(xknn_mpi_context *ctx, const xknn__sym_job *job, xknn_mpi_timings *tm,
                           xknn__sym_tally *tally, xknn_error *lerr)
{
    xknn__ring ring, *R = &ring;
    int s, have;
    xknn__ring_init(R, ctx, job, tm, lerr);
    xknn__ring_options(R, job->params);
    have = xknn__ring_alloc(R);
    if (xknn__ring_agree(R, have) == 0) {
        xknn__ring_plan(R);
#ifdef XKNN_MPI_HAVE_CUDA
        xknn__ring_device(R, job->params);
#endif
        if (xknn__ring_start(R) == 0) {
            /* Steps s = 0 .. S: the own diagonal, the S slice pairs; round S + 1 moves
             * step S's lists. */
            if (R->trace) fprintf(stderr, "xknn_mpi: trace rank %d: set up %.3f\n", R->rank, xknn__sym_now() - R->tr0);
            for (s = 0; s <= R->S + 1 && !R->broken; s++)
                if (xknn__ring_round_run(R, s) != 0) break;
            /* the own rows' final lists: the own computations merged with what the others sent */
            R->fin = R->nrecv > 0 ? R->spare : R->own;
            if (!R->broken && R->st == XKNN_SUCCESS && R->fdone < R->nloc) {
                xknn__ring_final(R, R->nrecv > 0, R->fdone, R->nloc, R->p.num_threads);
                R->fdone = R->nloc;
            }
            if (R->trace)
                fprintf(stderr,
                        "xknn_mpi: trace rank %d: final lists %.3f (lists kept on the device: %s, %.3f s to keep and "
                        "fetch)\n",
                        R->rank, xknn__sym_now() - R->tr0, R->dlists ? "yes" : "no", R->tdl);
            xknn__ring_deliver(R);
            if (!R->broken) xknn__ring_balance(R);
            if (R->trace)
                fprintf(stderr, "xknn_mpi: trace rank %d: balance gathered %.3f\n", R->rank, xknn__sym_now() - R->tr0);
        }
    }
    xknn__ring_teardown(R);
    tally->owned += R->owned;
    tally->evals = R->nev;
    tally->mpi_broken = R->broken;
    return R->st;
}
