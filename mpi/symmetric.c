/*
 * mpi/symmetric.c -- the symmetric distributed self-join (the all-kNN graph).
 *
 * Rank r owns slice r (m_r rows). Every distance d(i, j) serves both i and j, so each
 * unordered pair of rows is evaluated exactly once, by one rank, with xknn_search_pair.
 * The ring schedule: in step s = 0 .. S, S = floor(P/2), rank r holds slice
 * (r + s) mod P (s = 0: its own) and works on the pair (slice r, slice (r + s) mod P).
 * With (b - a) mod P = s, the slice pair {a, b} is rank a's step s when s < P - s and
 * rank b's step P - s when s > P - s; only for even P is s = P - s = P/2 reached from
 * both ends, by rank r < P/2 and rank r + P/2 in step S, each holding the other's slice.
 *
 * Work is counted in distance evaluations: a rectangle of ra x rb rows is ra * rb, a
 * slice's diagonal (the slice with itself) is m(m-1)/2. What rank r computes:
 *   - step 0: the diagonal of slice r, except its first cut[r] rows (with
 *     XKNN_MPI_SYM_SPLIT=1 in parts: the triangle of its first rows in step 0, the rest
 *     in a step S + 1, whose parts end rows one after another, see xknn__sym_mid);
 *   - step 1 (P >= 2): the first cut[j] rows of slice j = r + 1's diagonal, i.e. the
 *     triangle of rows [0, cut[j]) and their rectangle against rows [cut[j], m_j)
 *     (top(m, c) = c(c-1)/2 + c(m-c) evaluations);
 *   - steps 1 <= s < P/2 (every s <= S for odd P): the full pair, m_r * m_(r+s);
 *   - step S of even P: the pair (a, a + P/2), a < P/2, split by rows of slice a: rows
 *     [0, half[a]) against slice a + P/2 on rank a, rows [half[a], m_a) on rank
 *     a + P/2 (a rectangle feeding both sides' k-best lists; the ring has brought each
 *     rank the other's slice by then), half[a] = floor(m_a / 2).
 * Balance. With equal slices m, before the cuts every rank does m(m-1)/2 + (P-1)/2 m^2
 * (odd P: (P-1)/2 full pairs; even P: P/2 - 1 full pairs and two halves of m^2/2), which
 * sums to N(N-1)/2, N = P m: the schedule itself is balanced (the old even-P schedule,
 * with the whole last pair on ranks r < P/2, gave those ranks m^2 more than the others:
 * at P = 2, 1.5 m^2 against 0.5 m^2). Unequal slices (n not a multiple of P; the
 * standard slicing differs by one row) leave rank r's base work B_r off the mean T/P by
 * a few rows' worth; the cuts move diagonal rows between neighbours to absorb that: with
 * g_r = P * top(m_r, cut[r]) the work rank r hands to rank r - 1 (scaled by P), rank r
 * does W_r = B_r - top_r + top_(r+1), and g_(r+1) = g_r - (P B_r - T) makes every
 * P W_r - T zero; g_r = G - sum_(j<r) (P B_j - T) with G the largest prefix keeps
 * g >= 0. cut[r] is the row count whose top() is nearest to g_r / P: top grows by at most
 * m_r - 1 per row, so each cut is off by at most (m_r - 1)/2 evaluations and
 * |W_r - T/P| <= (m_r - 1)/2 + (m_(r+1) - 1)/2 < the largest slice's row count -- one
 * row of work -- whenever the cuts fit in their diagonals (g_r <= P m_r(m_r-1)/2; with
 * the standard slicing, whenever every slice has more than 1.5 P rows, checked
 * exhaustively for P <= 64; tiny or skewed slices get the nearest fit). The plan is integer arithmetic on the agreed slice table, identical on
 * every rank; above P n^2 ~ 2^61 (n ~ 10^9 / sqrt(P)) it keeps cut = 0 rather than
 * overflow. Every rank's evaluations and busy seconds come back in xknn_mpi_stats
 * (distance_evals, local.search) and, with verbose, are printed by rank 0.
 *
 * Slices travel around the ring: in step s rank r holds slice (r + s) mod P, so for
 * step s + 1 it receives from rank r + 1 the slice that rank held in step s, while it
 * sends its own to rank r - 1 (every rank relays, also one with an empty slice).
 *
 * A rank ends step s >= 1 with k-best lists of the held slice's rows (the exact k best
 * of the pairs it evaluated for them; padding where none). Each slice is held by exactly
 * one rank in each step, so slice j's owner receives one list set a step, from rank
 * (j - s) mod P, and folds it into an accumulator with the search's pairwise merge
 * (xknn__merge_rows: (distance, id), padding last); after the last step it merges the
 * accumulator with its own lists. The ranks' pairs partition all pairs, so this gives
 * the plain self-join's ids and distance bits. Step s's lists travel in round s + 1,
 * while step s + 1 computes; only the last step's lists move after the compute. (The
 * binomial tree of the search reduces one block after its compute; here the list sets of
 * a slice come ready one step apart, so a chain along the steps hides the moves.)
 *
 * Overlap. Open MPI has no progress thread: a posted transfer moves only inside MPI
 * calls. Where MPI gives MPI_THREAD_FUNNELED or more (knn_mpi asks for it), each step's
 * compute runs in a worker thread (no MPI calls there) while the main thread completes
 * the posted slice and list transfers with MPI_Testall and merges the received lists;
 * otherwise (or with XKNN_MPI_SYM_THREAD=0) the compute runs inline and the transfers
 * follow it. Busy seconds are the compute's own; the transfers count (as broadcast
 * time) only where they outlast it, and the last step's list exchange and the final
 * merge count as reduce time.
 *
 * Bounds (l2/euclidean). After step 0 every rank's own lists hold k references a row
 * (where its diagonal had more than k rows), and the ranks share each row's k-th value
 * (MPI_Allgatherv, n floats). A held slice's lists then start from padding that carries
 * the owner's value in its last entry: xknn_search_pair may leave out whatever lies
 * beyond it, since the owner's final lists hold k references at or below it. On the CPU
 * the held side's scans start tight (the 50k graph on 2 ranks: 10-20 % less time); on
 * the GPU such a side needs no witnesses and gets far fewer candidates (the 4M graph on
 * 2 H100s: 6.91-7.05 s against 7.10-7.32 s without, same machine; 6.85-6.98 s once a
 * pair in parts keeps them for its second part). On by default; XKNN_MPI_SYM_BOUNDS=0
 * turns them off everywhere. Options read from the environment (SPLIT, BOUNDS) hold
 * only where every rank has them.
 *
 * Memory per rank, in list sets of (largest slice) x k x 12 bytes: own lists, one or
 * two held slices' (two when S >= 2: the one computing, the one in flight), and the
 * accumulator with its receive and merge buffers (one set when S = 1, two at P = 2 in
 * pieces): 4 (P = 2), 3 (P = 3) or 6 (P >= 4); plus two slices of rows (and n floats
 * with bounds). With the CUDA backend the
 * device keeps a copy of the own slice and of the held one (two while the next is in
 * flight, S >= 2): each row crosses to the device once a step, not once a part. It also
 * keeps the running lists (xknn_cuda_keep_lists): the own rows' from the first step to
 * the last (padding made there), the held slice's for its step (padding and bounds made
 * there); each set comes to the host once, fetched by the worker at the end of its last
 * step (XKNN_MPI_SYM_DEVICE_LISTS=0: on the host, the same bytes; the 4M graph on two
 * H100s measured no difference at P = 2, where a step's pairs are one or two calls).
 * XKNN_MPI_SYM_TRACE=1 prints each rank's timeline (steps, transfers, lists, write).
 *
 * The tail (what follows the last compute). P = 2 (no cut rows in slice 0), the last
 * pair in pieces (XKNN_MPI_SYM_PIECES, default 4): with g = m_0 - half[0], rank 0
 * computes its rows [g, m_0) against slice 1 and rank 1 slice 0's rows [0, g) against
 * its own, both piece by piece over slice 1's rows (the last piece half the others: what
 * is left after the compute is its lists' move, merge and write; on two H100s a median
 * of 73 ms against 101 ms with equal pieces). After each piece its rows' lists are final
 * on that side: rank 0's held ones go to rank 1 while the next piece computes, and rank
 * 1 merges them with its own rows' and gives them to the sink. Rank 1's last piece runs
 * in pieces of slice 0's rows [0, g), whose held lists go to rank 0 as each ends; rank 0
 * merges them with its own rows [0, g) (final since step 0, brought to the host first)
 * and gives them to the sink. Rank 0's rows [g, m_0) take nothing from rank 1: with a
 * sink that takes any order (xknn_mpi_output.any_order, knn_mpi) its last piece runs in
 * pieces of those rows, each given to the sink as it ends; else they go after rows
 * [0, g). So nothing moves after the last step, and what is left at its end is a piece
 * of each side. Each piece's lists come to the host in a copier thread of the CUDA
 * context (xknn_cuda_copy_lists_start) while the next piece computes; the main thread
 * moves them once the copy is over (XKNN_MPI_SYM_ASYNC=0, a diagnostic: the worker
 * copies them between its calls). (XKNN_MPI_SYM_PIECES=0: the last pair in one call
 * each; rank 1 then sends back only the lists of the rows [half, m) it held, and rank
 * 0's rows [0, half) go to the sink during that exchange.) The own lists' host arrays
 * are touched once at the set-up, the visited slices' (kept on the device) during step
 * 0, on all threads or beside the compute, so the copies to the host do not take their
 * page faults; the last step's kept rows are freed by the worker beside the main
 * thread's merges and writes. With split, the rows become final part by part in step S +
 * 1 (the worker tells the main thread, which merges them with the accumulator and gives
 * them to the sink while the next part computes). The ring's buffers (gigabytes of list
 * sets and slices, and a CUDA context it made itself) are freed in a thread of their own
 * (xknn__mpi_later) after the results are delivered; device copies on a caller's context
 * are released before the return. The 4M graph on two H100s: the ring ends with the last
 * write, and the tail from the end of the last call to the end of the ring went from
 * 0.57-0.60 s to 0.33-0.34 s (the one-call exchange above), then to about 0.1 s in
 * pieces.
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

#ifdef XKNN_MPI_HAVE_CUDA
#include "xknn/cuda.h"
#include "xknn/impl/cuda_internal.h"
#endif

/* Distance evaluations of a diagonal of m rows, and of its first h rows (their
 * triangle and their rectangle against the rows after them). */
static int64_t xknn__sym_tri(int64_t m)
{
    return m > 1 ? m * (m - 1) / 2 : 0;
}

static int64_t xknn__sym_top(int64_t m, int64_t h)
{
    return xknn__sym_tri(h) + h * (m - h);
}

/* Split (see xknn__sym_ring): the own diagonal of rows [c0, m) is computed in parts:
 * the triangle of rows [c0, mid) in step 0, mid - c0 = first (m - c0) (default 0.8:
 * about 64 % of the diagonal's work); after the last pair, the rectangle of rows
 * [c0, mid) against rows [mid, m), in parts of rows (each ends its rows), then the
 * triangle of rows [mid, m). */
static int64_t xknn__sym_mid(int64_t m, int64_t c0, double first)
{
    const int64_t r = m - c0;
    return r > 0 ? c0 + (int64_t)((double)r * first) : c0;
}

/* Part q of np equal parts of m rows: rows [xknn__sym_piece(m, np, q),
 * xknn__sym_piece(m, np, q + 1)) */
static int64_t xknn__sym_piece(int64_t m, int np, int q)
{
    return m / np * q + m % np * q / np;
}

/* P = 2's last pair in pieces (see xknn__sym_ring): piece q of np covers rows
 * [xknn__sym_slice1(m, np, q), xknn__sym_slice1(m, np, q + 1)) of slice 1 (m rows), the
 * last piece half as many as the others: its lists are the last to travel, and their
 * merge and write are what is left after the compute (2 np - 1 halves) */
static int64_t xknn__sym_slice1(int64_t m, int np, int q)
{
    return q >= np ? m : m / (2 * np - 1) * 2 * q + m % (2 * np - 1) * 2 * q / (2 * np - 1);
}

/* The first row of piece q of np of a set of m rows that travels piece by piece: slice
 * 1's (s1), or slice 0's rows [0, g) (m = g) in equal parts */
static int64_t xknn__sym_at(int s1, int64_t m, int np, int q)
{
    return s1 ? xknn__sym_slice1(m, np, q) : xknn__sym_piece(m, np, q);
}

/* Rows of k-wide lists (12 bytes an entry) in about 8 MiB: the block in which final rows
 * go to the sink while transfers are in flight, MPI_Testall between blocks (Open MPI
 * moves data only inside MPI calls) */
static int64_t xknn__sym_block(int64_t k)
{
    const int64_t rows = ((int64_t)8 << 20) / (k * 12);
    return rows > 0 ? rows : 1;
}

/* The worker's news to the main thread: rows [0, rows) of a list set are final on this
 * rank's side and on the host (split, after the last pair: the own rows'; P = 2's last
 * pair in pieces: slice 1's rows, the held set's on rank 0, the own set's on rank 1;
 * and in rows2 slice 0's, the own set's on rank 0, the held set's on rank 1) */
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

/* The plan (see the opening comment): half[a], a < P/2 (even P), and cut[j], from the
 * slice sizes m[0..P-1]; integer arithmetic only, so every rank computes the same.
 * g: scratch of P + 1 values. */
static void xknn__sym_plan(int P, const int64_t *m, int64_t *half, int64_t *cut, int64_t *g)
{
    const int S = P / 2;
    int64_t n = 0, T = 0, G = 0;
    int r, s;
    for (r = 0; r < P; r++) {
        half[r] = P % 2 == 0 && r < S ? m[r] / 2 : 0;
        cut[r] = 0;
        n += m[r];
    }
    if (P < 2 || n < 2) return;
    /* P * (prefix sums of P B_r - T) stays within 4 P T <= 2 P n^2 */
    if (n > INT64_C(2000000000) || n * n > INT64_MAX / 4 / P) return;
    for (r = 0; r < P; r++) {
        /* base work B_r, kept in g[r] for now */
        int64_t b = xknn__sym_tri(m[r]);
        for (s = 1; s <= S; s++) {
            const int j = (r + s) % P;
            if (s < P - s)
                b += m[r] * m[j];
            else if (r < S)
                b += half[r] * m[j];
            else
                b += (m[j] - half[j]) * m[r];
        }
        g[r] = b;
        T += b;
    }
    /* g[r] <- sum_(j<r) (P B_j - T) */
    {
        int64_t pre = 0;
        for (r = 0; r < P; r++) {
            const int64_t d = P * g[r] - T;
            g[r] = pre;
            pre += d;
            if (g[r] > G) G = g[r];
        }
    }
    for (r = 0; r < P; r++) {
        /* the cut whose P * top() is nearest to G - prefix: top() is nondecreasing */
        const int64_t want = G - g[r];
        int64_t lo = 0, hi = m[r];
        while (lo < hi) {
            const int64_t mid = lo + (hi - lo) / 2;
            if (P * xknn__sym_top(m[r], mid) >= want)
                hi = mid;
            else
                lo = mid + 1;
        }
        if (lo > 0 && want - P * xknn__sym_top(m[r], lo - 1) < P * xknn__sym_top(m[r], lo) - want) lo--;
        cut[r] = lo;
    }
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

/* One step's compute (the work of the opening comment for step s), run by a worker
 * thread while the main thread moves slices and lists, or inline. No MPI call in here
 * (MPI_THREAD_FUNNELED is enough). */
typedef struct xknn__sym_step {
    const xknn_params *p;
    const xknn_matrix *ref;     /* own rows (NULL for an empty slice)                  */
    const unsigned char *cur;   /* the slice held in this step, dense                  */
    const int64_t *half, *cut;  /* the plan                                            */
    int64_t k, d, nloc, r0;     /* own rows, their first global id                    */
    int64_t mj, j0;             /* the held slice's rows and first global id           */
    int64_t *l0, *lj;           /* lists: own rows, the held slice's (step >= 1)       */
    float *d0, *dj;
    xknn_dtype dtype;
    int s, P, S, rank, jown, neg;
    int prepadded; /* the held slice's lists are padding already (the main thread's), or
                    * kept on the device (their host arrays unread)                       */
    int own_dev;   /* the own lists are kept on the device (their host arrays unread)   */
    void *kctx;    /* where (the CUDA context) lists are kept                            */
    int fetch_held, fetch_own; /* the held slice's / the own lists to the host after the calls */
    int64_t held_from; /* ... of the held slice's, only rows [held_from, mj) (the others
                        * are padding: P = 2's last pair, on rank 1)                      */
    int split;     /* the own diagonal in parts (step 0 and step S + 1)                  */
    int parts;     /* split: the rectangle's parts in step S + 1                         */
    double first;  /* split: the share of the diagonal's rows in step 0's triangle       */
    xknn__sym_ready *rd; /* split, step S + 1: the rows final so far (NULL: none told)   */
    int64_t pub, pub2; /* ... the rows told so far (rows, rows2)                         */
    int own_dropped; /* split, step S + 1, or P = 2's pieces on rank 1: the own lists'
                      * device copy is freed (every row came to the host before)         */
    int pieces;    /* P = 2's last pair in pieces of slice 1's rows (0: in one call)     */
    const void *forget[2]; /* kept rows to forget after the step (xknn_cuda_forget_rows)  */
    int hparts;    /* P = 2's pieces, rank 0: the last piece in parts of the own rows, each
                    * ending their lists (told in rows2; the sink takes any order)        */
    int async;     /* the lists' copies to the host beside the next call (publish)      */
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

/* Rows [a0, a0 + ra) of slice a (global ids aid + row, lists aids/adist of the whole
 * slice, ld = k) against rows [b0, b0 + rb) of slice b, or (b NULL) among themselves
 * (callers never pass an empty slice's NULL matrix as b); adds the distance evaluations
 * to w->nev (an error to w->e) and marks its end. Nothing to do for an empty side. */
static xknn_status xknn__sym_call(const xknn_params *p, int64_t k, const xknn_matrix *a, int64_t a0, int64_t ra,
                                  int64_t aid, int64_t *aids, float *adist, const xknn_matrix *b, int64_t b0,
                                  int64_t rb, int64_t bid, int64_t *bids, float *bdist, xknn__sym_step *w)
{
    xknn_matrix va, vb;
    xknn_status st;
    if (ra <= 0 || (b && rb <= 0)) return XKNN_SUCCESS;
    va = xknn__sym_rows(a, a0, ra);
    if (b) vb = xknn__sym_rows(b, b0, rb);
    w->nev += b ? ra * rb : xknn__sym_tri(ra);
    st = xknn_search_pair(p, &va, aid + a0, b ? &vb : NULL, b ? bid + b0 : 0, k, aids + a0 * k, adist + a0 * k,
                            b ? bids + b0 * k : NULL, b ? bdist + b0 * k : NULL, &w->e);
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
    if (threads <= 0) threads = omp_get_max_threads();
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
    if (dev && w->rd && w->async) {
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

static void *xknn__sym_work(void *arg)
{
    xknn__sym_step *w = (xknn__sym_step *)arg;
    const int rank = w->rank, P = w->P, s = w->s;
    const int64_t k = w->k, mj = w->mj, j0 = w->j0, nloc = w->nloc, r0 = w->r0;
    const xknn_matrix cm = XKNN_MATRIX_TYPED(w->cur, mj, w->d, w->dtype);
    const int64_t c0 = w->cut[rank], mid = w->split ? xknn__sym_mid(nloc, c0, w->first) : nloc;
    xknn_status ss = XKNN_SUCCESS;
    w->t0 = xknn__sym_now();
    w->e.message[0] = '\0';
    /* this step's lists start as padding (first touch here, beside the transfers), on the
     * host unless they are kept on the device */
    if (s == 0 && !w->own_dev)
        xknn__sym_pad(w->l0, w->d0, nloc * k, w->neg, w->p->num_threads);
    else if (s >= 1 && s <= w->S && !w->prepadded)
        xknn__sym_pad(w->lj, w->dj, mj * k, w->neg, w->p->num_threads);
    xknn__sym_mark(w);
    if (s == 0) {
        /* the own diagonal, less its first cut rows (own rows are read from ref): the
         * triangle of rows [c0, mid); mid = nloc unless split */
        ss = xknn__sym_call(w->p, k, w->ref, c0, mid - c0, r0, w->l0, w->d0, NULL, 0, 0, 0, NULL, NULL, w);
    } else if (s == w->S + 1) {
        /* split: the rest of it, the rectangle of rows [c0, mid) against rows
         * [mid, nloc) in parts of rows [a, b), then the triangle of rows [mid, nloc)
         * (ref is NULL for an empty slice). Rows [0, c0) are final on this side now,
         * rows [a, b) after their part, rows [mid, nloc) at the end. */
        int part;
        ss = xknn__sym_publish(w, 0, w->l0, w->own_dev, c0);
        for (part = 0; part < w->parts && ss == XKNN_SUCCESS && nloc > 0; part++) {
            const int64_t a = c0 + (mid - c0) * part / w->parts, b = c0 + (mid - c0) * (part + 1) / w->parts;
            ss = xknn__sym_call(w->p, k, w->ref, a, b - a, r0, w->l0, w->d0, w->ref, mid, nloc - mid, r0, w->l0, w->d0,
                                w);
            if (ss == XKNN_SUCCESS) ss = xknn__sym_publish(w, 0, w->l0, w->own_dev, b);
        }
        if (ss == XKNN_SUCCESS && nloc > 0)
            ss = xknn__sym_call(w->p, k, w->ref, mid, nloc - mid, r0, w->l0, w->d0, NULL, 0, 0, 0, NULL, NULL, w);
        if (ss == XKNN_SUCCESS) ss = xknn__sym_publish(w, 0, w->l0, w->own_dev, nloc);
#ifdef XKNN_MPI_HAVE_CUDA
        if (w->own_dev) {
            /* every row came to the host above (or the step failed): the device copy goes */
            xknn_error fe;
            (void)xknn_cuda_fetch_lists((xknn_cuda_context *)w->kctx, w->l0, 0, &fe);
            w->own_dropped = 1;
        }
#endif
    } else {
        if (s == 1 && w->cut[w->jown] > 0) {
            /* the first cut rows of the next slice's diagonal */
            const int64_t c = w->cut[w->jown];
            ss = xknn__sym_call(w->p, k, &cm, 0, c, j0, w->lj, w->dj, NULL, 0, 0, 0, NULL, NULL, w);
            if (ss == XKNN_SUCCESS)
                ss = xknn__sym_call(w->p, k, &cm, 0, c, j0, w->lj, w->dj, &cm, c, mj - c, j0, w->lj, w->dj, w);
        }
        if (ss != XKNN_SUCCESS) {
            /* reported below */
        } else if (s < P - s) {
            ss = xknn__sym_call(w->p, k, w->ref, 0, nloc, r0, w->l0, w->d0, &cm, 0, mj, j0, w->lj, w->dj, w);
        } else if (w->pieces > 0) {
            /* P = 2 in pieces (no cut rows in slice 0; g = m_0 - half[0]): rank 0 computes
             * its rows [g, m_0) against slice 1, rank 1 slice 0's rows [0, g) against its
             * own, both in pieces of slice 1's rows. After piece q its rows' lists are
             * final on this side (rank 0: the held set's, rank 1: the own set's): to the
             * host and told (rows) while the next piece computes. Rank 1's last piece
             * runs in pieces of slice 0's rows, each ending their held lists (rows2).
             * Rank 0 tells rows2 of its own set: rows [0, g), final since step 0, first;
             * the rest at the end, or (hparts) part by part in its last piece. */
            const int np = w->pieces;
            const int64_t m1 = rank == 0 ? mj : nloc, m0 = rank == 0 ? nloc : mj, g = m0 - w->half[0];
            int q, i;
            if (rank == 0) ss = xknn__sym_publish(w, 1, w->l0, w->own_dev, g);
            for (q = 0; q < np && ss == XKNN_SUCCESS; q++) {
                const int64_t a = xknn__sym_slice1(m1, np, q), b = xknn__sym_slice1(m1, np, q + 1);
                if (rank == 0) {
                    /* (with hparts the last piece in parts of rows [g, m_0), each final after
                     * its part) */
                    const int parts = q == np - 1 && w->hparts ? np : 1;
                    for (i = 0; i < parts && ss == XKNN_SUCCESS; i++) {
                        const int64_t ha = g + xknn__sym_piece(m0 - g, parts, i);
                        const int64_t hb = g + xknn__sym_piece(m0 - g, parts, i + 1);
                        ss = xknn__sym_call(w->p, k, w->ref, ha, hb - ha, r0, w->l0, w->d0, &cm, a, b - a, j0, w->lj,
                                            w->dj, w);
                        if (ss == XKNN_SUCCESS && parts > 1) ss = xknn__sym_publish(w, 1, w->l0, w->own_dev, hb);
                    }
                } else {
                    for (i = 0; i < (q < np - 1 ? 1 : np) && ss == XKNN_SUCCESS; i++) {
                        const int64_t ga = q < np - 1 ? 0 : xknn__sym_piece(g, np, i);
                        const int64_t gb = q < np - 1 ? g : xknn__sym_piece(g, np, i + 1);
                        ss = xknn__sym_call(w->p, k, &cm, ga, gb - ga, j0, w->lj, w->dj, w->ref, a, b - a, r0, w->l0,
                                            w->d0, w);
                        if (ss == XKNN_SUCCESS && q == np - 1) ss = xknn__sym_publish(w, 1, w->lj, w->fetch_held, gb);
                    }
                }
                if (ss == XKNN_SUCCESS)
                    ss = rank == 0 ? xknn__sym_publish(w, 0, w->lj, w->fetch_held, b)
                                   : xknn__sym_publish(w, 0, w->l0, w->own_dev, b);
            }
            if (rank == 0 && ss == XKNN_SUCCESS) ss = xknn__sym_publish(w, 1, w->l0, w->own_dev, m0);
        } else if (rank < w->S) {
            /* even P, last step: the first half of the own rows against slice r + P/2 */
            ss = xknn__sym_call(w->p, k, w->ref, 0, w->half[rank], r0, w->l0, w->d0, &cm, 0, mj, j0, w->lj, w->dj,
                                w);
        } else if (nloc > 0) { /* (ref is NULL for an empty slice: not a triangle) */
            /* ... and the second half of slice r - P/2's rows against the own */
            ss = xknn__sym_call(w->p, k, &cm, w->half[w->jown], mj - w->half[w->jown], j0, w->lj, w->dj, w->ref, 0,
                                nloc, r0, w->l0, w->d0, w);
        }
    }
    w->tf0 = xknn__sym_now();
    if (w->last_ticket > 0) {
        /* the copies started by publish: over before the device lists go (the copier runs
         * them in order: waiting for the last, without the mutex the main thread reads its
         * news under); their rows are told (all of them, unless one failed) */
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
        /* lists kept on the device whose last step this is: to the host, here, with the
         * calls' threads (the held slice's travel to their owner next; the own rows' wait
         * for the others'); after a failed call they are dropped */
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
    w->tf1 = xknn__sym_now();
    w->st = ss;
    w->t1 = xknn__sym_now();
#ifdef XKNN_MPI_HAVE_CUDA
    {
        /* the rows kept on the device whose last step this is (the own slice's, the held
         * one's): freed here, beside the main thread's merges and writes (cudaFree of a
         * gigabyte is tens of milliseconds) */
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
    if (threads <= 0) threads = omp_get_max_threads();
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

/* Own rows [a, b) to the sink (global rows row0 + a ..), its seconds counted as write;
 * a failure's message into lerr. */
static xknn_status xknn__sym_sink(const xknn_mpi_output *out, int rank, int64_t row0, int64_t a, int64_t b, int64_t k,
                                  const xknn__cands *fin, xknn_mpi_timings *tm, xknn_error *lerr)
{
    xknn_error e;
    xknn_status ss;
    const double t0 = MPI_Wtime();
    e.status = XKNN_SUCCESS;
    e.message[0] = '\0';
    ss = out->sink(out->sink_user, row0 + a, b - a, k, fin->ids + a * k, fin->dist + a * k, &e);
    tm->write += MPI_Wtime() - t0;
    if (ss == XKNN_SUCCESS) return ss;
    return e.message[0] ? xknn__mpi_fail(lerr, ss, "rank %d: %s", rank, e.message)
                        : xknn__mpi_fail(lerr, ss, "rank %d: result sink failed on rows %lld..%lld: %s", rank,
                                         (long long)(row0 + a), (long long)(row0 + b - 1), xknn_status_string(ss));
}

/* Own rows [a, b) final: their lists merged with the accumulator into fin (merge; else
 * fin is the own set), the seconds counted as reduce. */
static void xknn__sym_final(const xknn__cands *own, const xknn__cands *acc0, const xknn__cands *fin, int merge,
                            int64_t a, int64_t b, int64_t k, int neg, int threads, xknn_mpi_timings *tm)
{
    const double t0 = MPI_Wtime();
    if (!merge || b <= a) return;
    xknn__sym_merge(own, acc0, fin, a, b, k, neg, threads);
    tm->reduce += MPI_Wtime() - t0;
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

xknn_status xknn__sym_ring(xknn_mpi_context *ctx, const xknn_params *params, const xknn_matrix *ref,
                           int64_t ref_offset, int64_t k, const int64_t *row0s, const int64_t *rowss, int64_t d,
                           xknn_dtype dtype, const xknn_mpi_output *out, xknn_mpi_timings *tm, int64_t *owned,
                           int64_t *evals, int *mpi_broken, xknn_error *lerr)
{
    const int rank = ctx->rank, P = ctx->size, S = P / 2;
    const int neg = params->metric == XKNN_METRIC_IP;
    const int64_t row_bytes = xknn_row_bytes(dtype, d), nloc = rowss[rank];
    const int left = (rank - 1 + P) % P, right = (rank + 1) % P;
    const int nvis = S < 2 ? S : 2; /* list sets of visited slices: the current and the one in flight */
    int nacc = S >= 2 ? 3 : S; /* accumulator, receive buffer, merge output (P = 2 in pieces: 2) */
    xknn_params p = *params, pw; /* pw: the worker's (one core fewer: the main thread polls) */
    xknn_status st = XKNN_SUCCESS;
    int64_t maxrows = 0, done_q = 0, n = 0, nev = 0;
    int64_t *plan = NULL, *half, *cut;   /* the plan: half, cut, scratch (P + 1)       */
    int64_t *allev = NULL;               /* rank 0: every rank's distance evaluations  */
    unsigned char *slice[2] = {NULL, NULL};
    int64_t *lid = NULL;  /* own lists, nvis visited sets, nacc accumulation sets */
    float *ldist = NULL;
    xknn__cands own, vis[2], acc[3], fin; /* fin: the final lists of the own rows */
    xknn__sym_step base;                  /* the fields every step shares             */
    int nrecv = 0;                        /* list sets of the own rows received so far */
    xknn__cands spare = {NULL, NULL};     /* where the final lists go (with nrecv > 0)  */
    int padded_next = 0;                  /* the next step's list set is padding already */
    const unsigned char *ownrows = NULL;  /* the own slice as it travels: ref's rows, or a dense copy */
    double *all = NULL; /* rank 0: every rank's busy seconds */
#ifdef XKNN_MPI_HAVE_CUDA
    xknn_cuda_context *cuctx = NULL; /* the rank's own, for all its steps */
    xknn_cuda_context *kctx = NULL;  /* where the rows are kept on the device */
    const void *kept[3] = {NULL, NULL, NULL}; /* kept blocks: own rows, the slice buffers */
#endif
    int dlists = 0;   /* running lists kept on the device (xknn_cuda_keep_lists)          */
    int own_dev = 0;  /* the own lists are there now                                       */
    int held_dev = 0; /* the held slice's lists of this step are there                     */
    double tdl = 0.0; /* seconds of the lists' moves between host and device after a step */
    MPI_Datatype rowtype = MPI_DATATYPE_NULL, idtype = MPI_DATATYPE_NULL, dtype_k = MPI_DATATYPE_NULL;
    float *bnd = NULL; /* bounds: every row's k-th value after step 0, slices in rank order */
    int *bcnt = NULL;  /* bounds: counts and displacements of the slices */
    int s, j, rc, threaded = 0, split = 0, bounds = 0, parts = 3;
    int pieces = 4; /* P = 2: the last pair in pieces (0: in one call; agreed, then 0 where off) */
    double first = 0.8;
    int64_t fdone = 0, sunk = 0; /* own rows final so far (in fin), and given to the sink */
    int rd_made = 0;
    int64_t lfrom = 0; /* P = 2: the first row of slice 0 whose lists rank 1 sends back */
    int64_t pg = 0;    /* P = 2 in pieces: g = m_0 - half[0], rank 0 computes rows [g, m_0) */
    xknn__sym_ready rd;          /* split: the worker's news of final rows in step S + 1 */
    double t0;
    /* XKNN_MPI_SYM_TRACE=1 (a diagnostic, any rank): this rank's timeline on stderr,
     * seconds from here */
    const char *trace_env = getenv("XKNN_MPI_SYM_TRACE");
    const int trace = trace_env && trace_env[0] == '1';
    const double tr0 = xknn__sym_now();
    double trr = 0.0, trw = 0.0; /* trace: tm's reduce and write seconds at the last line */

    for (j = 0; j < P; j++) {
        if (rowss[j] > maxrows) maxrows = rowss[j];
        n += rowss[j];
    }
    {
        /* The compute runs in a worker thread while this (the main) thread moves the
         * data, where MPI allows it: MPI_THREAD_FUNNELED or more, called from the main
         * thread. XKNN_MPI_SYM_THREAD=0: inline (a diagnostic; same results). */
        int lvl = MPI_THREAD_SINGLE, is_main = 0;
        const char *env = getenv("XKNN_MPI_SYM_THREAD");
        if (MPI_Query_thread(&lvl) == MPI_SUCCESS && MPI_Is_thread_main(&is_main) == MPI_SUCCESS)
            threaded = P > 1 && lvl >= MPI_THREAD_FUNNELED && is_main && !(env && env[0] == '0');
        /* XKNN_MPI_SYM_SPLIT=1 (the same results): the own diagonal in parts
         * (xknn__sym_mid), the triangle of the first XKNN_MPI_SYM_FIRST of its rows
         * (default 0.8) in step 0, the rest after the last pair, its rectangle in
         * XKNN_MPI_SYM_PARTS parts of rows (default 3, 1 to 16): the last pair's lists
         * travel while it computes, and the own rows' lists are final, merged and given
         * to the sink part by part while the next part computes. Off by default: on the
         * 4M graph on two H100s it ended the ring 0.3-0.4 s later (5.21-5.25 s against
         * 4.88-4.94 s): the parts of the diagonal compute slower than its one triangle,
         * and the held rows after the first triangle have no bounds for the last pair
         * (a bound from a 65536-row sample of the diagonal was not tight enough). */
        env = getenv("XKNN_MPI_SYM_SPLIT");
        split = P > 1 && env && env[0] == '1';
        env = getenv("XKNN_MPI_SYM_PARTS");
        if (env && atoi(env) >= 1 && atoi(env) <= 16) parts = atoi(env);
        env = getenv("XKNN_MPI_SYM_FIRST");
        if (env && atof(env) > 0.0 && atof(env) <= 1.0) first = atof(env);
        /* XKNN_MPI_SYM_PIECES (P = 2, default 4, 0 to 16; the same results): the last
         * pair in that many pieces, whose lists travel, are merged and go to the sink
         * while the next piece computes (see the opening comment); 0: in one call each,
         * the lists after it. Not with split, nor with cut rows in slice 0. */
        env = getenv("XKNN_MPI_SYM_PIECES");
        if (env && env[0] >= '0' && env[0] <= '9' && atoi(env) >= 0 && atoi(env) <= 16) pieces = atoi(env);
        if (P != 2 || split) pieces = 0;
        if (pieces > 0) nacc = 2; /* (the final lists of the own rows, made while the held set is in use) */

        /* Bounds (see the opening comment; the same results): on unless
         * XKNN_MPI_SYM_BOUNDS=0. l2/euclidean only, and n within an int count. */
        env = getenv("XKNN_MPI_SYM_BOUNDS");
        bounds = !(env && env[0] == '0');
        bounds = bounds && P > 1 && n <= INT_MAX &&
                 (params->metric == XKNN_METRIC_L2 || params->metric == XKNN_METRIC_EUCLIDEAN);
    }
    pw = p;
    if (threaded) {
        int nt = p.num_threads;
#ifdef _OPENMP
        if (nt <= 0) nt = omp_get_max_threads();
#endif
        pw.num_threads = nt > 1 ? nt - 1 : 1;
    }
    {
        const size_t set = (size_t)(maxrows * k);
        const int sets = 1 + nvis + nacc;
        lid = (int64_t *)malloc(set * (size_t)sets * sizeof(int64_t) + 1);
        ldist = (float *)malloc(set * (size_t)sets * sizeof(float) + 1);
        if (lid && ldist) {
            own.ids = lid;
            own.dist = ldist;
            for (j = 0; j < nvis; j++) {
                vis[j].ids = lid + (size_t)(1 + j) * set;
                vis[j].dist = ldist + (size_t)(1 + j) * set;
            }
            for (j = 0; j < nacc; j++) {
                acc[j].ids = lid + (size_t)(1 + nvis + j) * set;
                acc[j].dist = ldist + (size_t)(1 + nvis + j) * set;
            }
            /* the final lists: into the accumulation set the last merge leaves free, or
             * (one accumulator) a visited slice's set, no longer needed by then */
            spare = nacc > 1 ? acc[1] : nacc == 1 ? vis[0] : own;
        }
    }
    slice[0] = (unsigned char *)malloc((size_t)(maxrows * row_bytes) + 1);
    slice[1] = (unsigned char *)malloc((size_t)(maxrows * row_bytes) + 1);
    plan = (int64_t *)malloc((size_t)(3 * P + 1) * sizeof(int64_t));
    if (rank == 0) {
        all = (double *)malloc((size_t)P * sizeof(double));
        allev = (int64_t *)malloc((size_t)P * sizeof(int64_t));
    }
    if (bounds) {
        bnd = (float *)malloc((size_t)n * sizeof(float) + 1);
        bcnt = (int *)malloc((size_t)(2 * P) * sizeof(int));
        if (bcnt) {
            int64_t at = 0;
            for (j = 0; j < P; j++) {
                bcnt[j] = (int)rowss[j];
                bcnt[P + j] = (int)at;
                at += rowss[j];
            }
        }
    }
    {
        /* Every rank learns whether all could allocate before anything travels; a rank
         * that could not carries the message to the caller's final agreement. The
         * options read from the environment hold only where every rank has them (the
         * steps and collectives must match). */
        int have[4], every[4] = {0, 0, 0, 0};
        have[0] = lid && ldist && slice[0] && slice[1] && plan && (rank != 0 || (all && allev)) &&
                  (!bounds || (bnd && bcnt));
        have[1] = split;
        have[2] = bounds;
        have[3] = pieces;
        if (!have[0])
            st = xknn__mpi_fail(lerr, XKNN_ERROR_OUT_OF_MEMORY,
                                "rank %d: out of memory for the symmetric self-join (%d list sets of %lld rows, k=%lld)",
                                rank, 1 + nvis + nacc, (long long)maxrows, (long long)k);
        rc = MPI_Allreduce(have, every, 4, MPI_INT, MPI_MIN, ctx->comm);
        if (rc != MPI_SUCCESS) {
            st = xknn__mpi_error(rank, lerr, rc, "MPI_Allreduce");
            *mpi_broken = 1;
            goto done;
        }
        if (!every[0]) goto done;
        split = every[1];
        bounds = every[2];
        /* (with split somewhere, pieces is 0 there; no piece without a row) */
        pieces = split || P != 2 ? 0 : every[3] < rowss[1] ? every[3] : (int)rowss[1];
    }
    half = plan;
    cut = plan + P;
    xknn__sym_plan(P, rowss, half, cut, plan + 2 * P);
    /* P = 2: rank 1's last pair holds rows [half[0], m_0) of slice 0; only their lists
     * travel back (the others are padding), unless it also computes slice 0's first cut
     * rows (step 1 of the plan), whose rectangle reaches every row */
    lfrom = P == 2 && cut[0] == 0 ? half[0] : 0;
    if (cut[0] != 0) pieces = 0; /* (the plan is the same everywhere) */
    if (pieces > 0) pg = rowss[0] - half[0];
#ifdef XKNN_MPI_HAVE_CUDA
    /* One CUDA context for all the steps of a rank on a GPU: its memory pool keeps the
     * device buffers between the pairs and its pinned staging moves the rows (a temporary
     * context a call paid both each time). Where it cannot be made, each call makes its
     * own (and reports what stands in the way). */
    if (!p.cuda_context && dtype == XKNN_DTYPE_F32 && p.device >= 0 &&
        (p.backend == XKNN_BACKEND_CUDA || p.backend == XKNN_BACKEND_AUTO)) {
        xknn_error ce;
        if (xknn_cuda_context_create(p.device, &cuctx, &ce) == XKNN_SUCCESS) p.cuda_context = pw.cuda_context = cuctx;
    }
    /* Rows kept on the device (xknn_cuda_keep_rows): the own slice, uploaded by the first
     * part that reads it, and each held slice, uploaded by this thread as soon as it has
     * arrived (while the step before computes), so that no part of a step uploads rows
     * again (before, every pair uploaded both its sides). XKNN_CUDA_KEEP=0 (a diagnostic;
     * the same results) keeps none. */
    if (p.cuda_context && dtype == XKNN_DTYPE_F32 && nloc > 0 && xknn_search_pair_why_not(&p, dtype, d) == NULL) {
        const char *env = getenv("XKNN_CUDA_KEEP");
        if (!(env && env[0] == '0')) {
            xknn_error ke;
            kctx = (xknn_cuda_context *)p.cuda_context;
            if (xknn_cuda_keep_rows(kctx, ref, 0, &ke) == XKNN_SUCCESS)
                kept[0] = ref->data;
            else if (ctx->config.verbose)
                fprintf(stderr, "xknn_mpi: rank %d: own rows not kept on the device: %s\n", rank, ke.message);
        }
    }
    /* Running lists kept on the device (xknn_cuda_keep_lists): the own rows' for all the
     * steps (padding made there), each held slice's for its step (padding and bounds made
     * there); a step's pairs merge into them on the device, and each set crosses to the
     * host once, when its last step is done (before, every pair uploaded its sides' lists
     * and brought them back). XKNN_MPI_SYM_DEVICE_LISTS=0 (a diagnostic; the same results)
     * keeps them on the host. */
    if (kctx) {
        const char *env = getenv("XKNN_MPI_SYM_DEVICE_LISTS");
        dlists = !(env && env[0] == '0');
    }
    if (dlists) {
        xknn_error ke;
        /* (their host arrays' first touch here, on all threads, not in the fetch at the
         * end of the last step: the device keeps them, the host's pages stay untouched
         * until then) */
        xknn__sym_pad(own.ids, own.dist, nloc * k, neg, p.num_threads);
        if (xknn_cuda_keep_lists(kctx, params->metric, own.ids, own.dist, nloc, k, XKNN_CUDA_LISTS_PADDING, NULL, &ke) ==
            XKNN_SUCCESS)
            own_dev = 1;
        else if (ctx->config.verbose)
            fprintf(stderr, "xknn_mpi: rank %d: own lists not kept on the device: %s\n", rank, ke.message);
    }
#endif
    rc = MPI_Type_contiguous((int)row_bytes, MPI_BYTE, &rowtype);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&rowtype);
    /* a row of a list: k ids, k distances (counts in rows keep large lists in int) */
    if (rc == MPI_SUCCESS) rc = MPI_Type_contiguous((int)k, MPI_INT64_T, &idtype);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&idtype);
    if (rc == MPI_SUCCESS) rc = MPI_Type_contiguous((int)k, MPI_FLOAT, &dtype_k);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&dtype_k);
    if (rc != MPI_SUCCESS) {
        st = xknn__mpi_error(rank, lerr, rc, "MPI_Type_contiguous");
        *mpi_broken = 1;
        goto done;
    }
    if (nloc > 0) {
        /* own slice, dense, as the first travelling buffer: ref's rows themselves when
         * they are dense, else a packed copy */
        const int64_t ld_bytes = (ref->ld ? ref->ld : xknn_row_elems(dtype, d)) * (row_bytes / xknn_row_elems(dtype, d));
        int64_t i;
        ownrows = (const unsigned char *)ref->data;
        if (ld_bytes != row_bytes) {
            for (i = 0; i < nloc; i++)
                memcpy(slice[0] + i * row_bytes, (const unsigned char *)ref->data + i * ld_bytes, (size_t)row_bytes);
            ownrows = slice[0];
        }
    }

    /* what every step's compute shares (the worker's params: pw; inline: p) */
    memset(&base, 0, sizeof base);
    base.p = &pw;
    base.ref = ref;
    base.half = half;
    base.cut = cut;
    base.k = k;
    base.d = d;
    base.nloc = nloc;
    base.r0 = ref_offset;
    base.l0 = own.ids;
    base.d0 = own.dist;
    base.dtype = dtype;
    base.P = P;
    base.S = S;
    base.rank = rank;
    base.neg = neg;
    base.split = split;
    base.parts = parts;
    {
        /* XKNN_MPI_SYM_ASYNC=0 (a diagnostic; the same results): the worker copies each
         * piece's lists to the host itself, between its calls */
        const char *env = getenv("XKNN_MPI_SYM_ASYNC");
        base.async = !(env && env[0] == '0');
    }
    base.first = first;
    memset(&rd, 0, sizeof rd);
    rd_made = pthread_mutex_init(&rd.mu, NULL) == 0; /* (else no news: rows final after the loop) */

    /* Steps s = 0 .. S: the own diagonal (split: its first part), the S slice pairs;
     * round S + 1 moves step S's lists (split: while the rest of the own diagonal
     * computes). While step s computes, the main thread completes: the slice for step
     * s + 1 (posted here), and the exchange of step s - 1's lists: the held slice's lists
     * go to its owner (r + s - 1) mod P, the own rows' lists come from rank
     * (r - s + 1) mod P, the one that held this rank's slice in step s - 1. */
    if (trace) fprintf(stderr, "xknn_mpi: trace rank %d: set up %.3f\n", rank, xknn__sym_now() - tr0);
    for (s = 0; s <= S + 1 && !*mpi_broken; s++) {
        const int jown = (rank + s) % P;       /* the slice held in this step */
        const int jnext = (rank + s + 1) % P;  /* the one needed in step s + 1 */
        const int t = s - 1;                   /* the step whose lists move now */
        const unsigned char *cur = s == 0 ? ownrows : slice[s & 1];
        unsigned char *nxt = slice[(s + 1) & 1];
        MPI_Request req[6], preq[64]; /* preq: P = 2's pieces, 2 a piece: slice 1's, slice 0's */
        xknn__cands *into = NULL; /* where this round's received lists land */
        xknn__sym_step w;
        pthread_t th;
        int worker = 0, joined = 0, compute = st == XKNN_SUCCESS && (s <= S || split), r;
        double tw, tc, ta, tu;

        for (r = 0; r < 6; r++) req[r] = MPI_REQUEST_NULL;
        for (r = 0; r < 64; r++) preq[r] = MPI_REQUEST_NULL;
        w = base;
        t0 = MPI_Wtime();
        rc = MPI_SUCCESS;
        if (s < S && P > 1) {
            /* receive slice jnext from the right, send the held slice to the left: every
             * rank works with the slice it holds in every step (even P's last included) */
            if (rowss[jnext] > 0) rc = MPI_Irecv(nxt, (int)rowss[jnext], rowtype, right, XKNN__TAG_SLICE, ctx->comm, &req[0]);
            if (rc == MPI_SUCCESS && rowss[jown] > 0)
                rc = MPI_Isend(cur, (int)rowss[jown], rowtype, left, XKNN__TAG_SLICE, ctx->comm, &req[1]);
        }
        if (rc == MPI_SUCCESS && t >= 1 && !(pieces > 0 && s == S + 1)) {
            /* step t's lists: the held slice's to its owner, the own rows' from the rank
             * that held them; the first set lands in the accumulator itself (P = 2 in
             * pieces: nothing moves after the last step, its lists moved during it) */
            const int jt = (rank + t) % P, from = (rank - t + P) % P;
            const xknn__cands *v = &vis[t % nvis];
            /* (P = 2: rank 1's set holds rows [lfrom, m_0) of slice 0, padding before) */
            const int64_t so = rank == 1 ? lfrom : 0, ro = rank == 0 ? lfrom : 0;
            const int64_t mt = rowss[jt] - so;
            if (mt > 0) {
                rc = MPI_Isend(v->ids + so * k, (int)mt, idtype, jt, XKNN__TAG_LIST_IDS, ctx->comm, &req[2]);
                if (rc == MPI_SUCCESS)
                    rc = MPI_Isend(v->dist + so * k, (int)mt, dtype_k, jt, XKNN__TAG_LIST_DIST, ctx->comm, &req[3]);
            }
            if (rc == MPI_SUCCESS && nloc - ro > 0) {
                into = nrecv == 0 ? &acc[0] : &acc[1];
                rc = MPI_Irecv(into->ids + ro * k, (int)(nloc - ro), idtype, from, XKNN__TAG_LIST_IDS, ctx->comm,
                               &req[4]);
                if (rc == MPI_SUCCESS)
                    rc = MPI_Irecv(into->dist + ro * k, (int)(nloc - ro), dtype_k, from, XKNN__TAG_LIST_DIST, ctx->comm,
                                   &req[5]);
            }
        }
        if (rc == MPI_SUCCESS && pieces > 0 && s == S) {
            /* P = 2 in pieces: the partner's lists of the own rows, piece by piece, straight
             * into the accumulator (the only set this rank receives): rank 1 gets slice 1's
             * pieces (preq 0 ..), rank 0 slice 0's rows [0, g) in pieces (preq 2 pieces ..);
             * rank 0's rows [g, m_0) take nothing (padding) */
            const int64_t m = rank == 0 ? pg : nloc;
            const int o = rank == 0 ? 2 * pieces : 0;
            int q;
            for (q = 0; q < pieces && rc == MPI_SUCCESS; q++) {
                const int64_t a = xknn__sym_at(rank == 1, m, pieces, q), b = xknn__sym_at(rank == 1, m, pieces, q + 1);
                if (b == a) continue;
                rc = MPI_Irecv(acc[0].ids + a * k, (int)(b - a), idtype, 1 - rank, XKNN__TAG_LIST_IDS, ctx->comm,
                               &preq[o + 2 * q]);
                if (rc == MPI_SUCCESS)
                    rc = MPI_Irecv(acc[0].dist + a * k, (int)(b - a), dtype_k, 1 - rank, XKNN__TAG_LIST_DIST,
                                   ctx->comm, &preq[o + 2 * q + 1]);
            }
            nrecv = 1; /* (rank 0's rows [g, m_0) become padding once the worker runs) */
        }
        tm->broadcast += MPI_Wtime() - t0;
        if (rc != MPI_SUCCESS) {
            st = xknn__mpi_error(rank, lerr, rc, "MPI_Isend/MPI_Irecv (reference slice or lists)");
            *mpi_broken = 1;
            for (r = 0; r < 6; r += (r == 0 ? 4 : 1)) /* the receives: 0, 4, 5 */
                if (req[r] != MPI_REQUEST_NULL) MPI_Cancel(&req[r]);
            for (r = 0; r < 64; r++)
                if (preq[r] != MPI_REQUEST_NULL) MPI_Cancel(&preq[r]);
            MPI_Waitall(6, req, MPI_STATUSES_IGNORE);
            MPI_Waitall(64, preq, MPI_STATUSES_IGNORE);
            break;
        }

#ifdef XKNN_MPI_HAVE_CUDA
        if (dlists && compute && s >= 1 && s <= S && rowss[jown] > 0) {
            /* the held slice's lists: padding (with the bounds) made on the device */
            const xknn__cands *v = &vis[s % nvis];
            xknn_error ke;
            const double tk = xknn__sym_now();
            if (xknn_cuda_keep_lists(kctx, params->metric, v->ids, v->dist, rowss[jown], k, XKNN_CUDA_LISTS_PADDING,
                                     bounds ? bnd + bcnt[P + jown] : NULL, &ke) == XKNN_SUCCESS)
                held_dev = 1;
            else if (ctx->config.verbose)
                fprintf(stderr, "xknn_mpi: rank %d: slice %d's lists not kept on the device: %s\n", rank, jown,
                        ke.message);
            tdl += xknn__sym_now() - tk;
        }
#endif
        if (bounds && s >= 1 && s <= S && rowss[jown] > 0 && !held_dev) {
            /* the held slice's lists start from its owner's k-th values after step 0, in
             * their last entry (id -1): what lies beyond cannot enter the owner's lists */
            const xknn__cands *v = &vis[s % nvis];
            const float *bj = bnd + bcnt[P + jown];
            int64_t i;
            if (!padded_next) xknn__lists_pad(v->ids, v->dist, rowss[jown] * k, neg);
            padded_next = 1;
            for (i = 0; i < rowss[jown]; i++) v->dist[i * k + k - 1] = bj[i];
        }
        /* this step's work (see the opening comment), while the data moves */
        if (compute) {
            w.cur = cur;
            w.mj = rowss[jown];
            w.j0 = row0s[jown];
            if (s >= 1 && s <= S) {
                w.lj = vis[s % nvis].ids;
                w.dj = vis[s % nvis].dist;
            }
            w.s = s;
            w.jown = jown;
            w.prepadded = s >= 1 && s <= S && (padded_next || held_dev);
            w.own_dev = own_dev;
#ifdef XKNN_MPI_HAVE_CUDA
            w.kctx = kctx;
#endif
            w.fetch_held = held_dev;
            w.held_from = s == S && P == 2 && rank == 1 ? lfrom : 0;
            /* (split: the worker's step S + 1 brings them part by part) */
            w.fetch_own = own_dev && s == S && !split && pieces == 0; /* (pieces: piece by piece) */
#ifdef XKNN_MPI_HAVE_CUDA
            if (s == S && !split) {
                /* (the last step that reads the own rows and the held slice) */
                w.forget[0] = kept[0];
                w.forget[1] = s >= 1 ? kept[1 + (s & 1)] : NULL;
            }
#endif
            w.pieces = s == S ? pieces : 0;
            /* (rank 0's own rows [g, m_0) go to the sink as they end: sink-only, any order) */
            w.hparts = s == S && pieces > 0 && rank == 0 && out->sink && out->gather_root < 0 && out->any_order;
            if ((s == S + 1 || (s == S && pieces > 0)) && rd_made) {
                rd.rows = 0;
                rd.rows2 = 0;
                rd.done = 0;
                rd.qh[0] = rd.qh[1] = rd.qt[0] = rd.qt[1] = 0;
#ifdef XKNN_MPI_HAVE_CUDA
                rd.kctx = kctx;
#endif
                w.rd = &rd;
            }
            worker = threaded && pthread_create(&th, NULL, xknn__sym_work, &w) == 0;
            if (!worker) {
                w.p = &p;
                xknn__sym_work(&w);
            }
        }
        if (s == S && pieces > 0 && rank == 0) {
            /* (rows [g, m_0) of the accumulator take nothing: padding, while the step computes) */
            xknn__lists_pad(acc[0].ids + pg * k, acc[0].dist + pg * k, (nloc - pg) * k, neg);
        }
        if (s == S && P == 2 && rank == 0 && lfrom > 0 && pieces == 0) {
            /* (its partner sends the lists of rows [lfrom, m) of this slice: the rows
             * before take padding, while this step computes) */
            xknn__lists_pad(acc[0].ids, acc[0].dist, lfrom * k, neg);
        }
        t0 = MPI_Wtime();
        tw = xknn__sym_now();
        if (s == S + 1 && P == 2 && rank == 0 && lfrom > 0 && !split && pieces == 0 && out->sink &&
            out->gather_root < 0 &&
            st == XKNN_SUCCESS && !own_dev) {
            /* P = 2: the partner's last pair held rows [lfrom, m) of this slice (lfrom =
             * half[0]; no cut rows), so rows [0, lfrom) take nothing from the lists now on
             * their way: they are final, and go to the sink while the exchange runs, in
             * blocks (xknn__sym_block) */
            const int64_t piece = xknn__sym_block(k);
            int flag = 0;
            while (sunk < lfrom) {
                const int64_t b = lfrom - sunk < piece ? lfrom : sunk + piece;
                if ((st = xknn__sym_sink(out, rank, ref_offset, sunk, b, k, &own, tm, lerr)) != XKNN_SUCCESS) break;
                (*owned)++;
                sunk = b;
                (void)MPI_Testall(6, req, &flag, MPI_STATUSES_IGNORE);
            }
            fdone = sunk; /* (fin holds rows [sunk, nloc) only: no gather here) */
            if (trace)
                fprintf(stderr, "xknn_mpi: trace rank %d: rows 0..%lld final and written %.3f\n", rank,
                        (long long)sunk - 1, xknn__sym_now() - tr0);
        }
        rc = xknn__sym_wait(6, req, worker);
        ta = xknn__sym_now();
#ifdef XKNN_MPI_HAVE_CUDA
        if (rc == MPI_SUCCESS && kctx && s < S && rowss[jnext] > 0 && !*mpi_broken) {
            /* the slice of step s + 1 is here: onto the device now (step s still computes) */
            const xknn_matrix nm = XKNN_MATRIX_TYPED(nxt, rowss[jnext], d, dtype);
            xknn_error ke;
            if (xknn_cuda_keep_rows(kctx, &nm, 1, &ke) == XKNN_SUCCESS)
                kept[1 + ((s + 1) & 1)] = nxt;
            else if (ctx->config.verbose)
                fprintf(stderr, "xknn_mpi: rank %d: slice %d not kept on the device: %s\n", rank, jnext, ke.message);
        }
#endif
        tu = xknn__sym_now();
        if (worker && s == 0) {
            /* the accumulator sets are first written by the receives of round 2 and on
             * (for P = 2 only by the last exchange, after the compute): their first touch,
             * the page faults of a fresh allocation, happens here while step 0 computes
             * (the 4M graph on 2 H200s: reduce 0.16-0.20 s against 0.37-0.47 s), after
             * round 0's transfers and the next slice's upload, which it would delay (the
             * 4M graph on 2 H100s: the upload done at 0.9 s against 1.5 s) */
            for (j = 0; j < nacc; j++) {
                memset(acc[j].ids, 0, (size_t)(maxrows * k) * sizeof(int64_t));
                memset(acc[j].dist, 0, (size_t)(maxrows * k) * sizeof(float));
            }
            /* likewise the visited slices' sets where the device keeps their lists (their
             * host arrays are first written by the lists' copies to the host: P = 2 in
             * pieces, after each piece) */
            for (j = 0; j < nvis && dlists; j++) {
                memset(vis[j].ids, 0, (size_t)(maxrows * k) * sizeof(int64_t));
                memset(vis[j].dist, 0, (size_t)(maxrows * k) * sizeof(float));
            }
        }
        if (rc == MPI_SUCCESS && into) {
            /* fold the received lists into the accumulator (one thread: the worker has
             * the others) */
            if (nrecv > 0) {
                xknn__cands tmp;
                xknn__sym_merge(&acc[0], &acc[1], &acc[2], 0, nloc, k, neg, worker ? 1 : p.num_threads);
                tmp = acc[0];
                acc[0] = acc[2];
                acc[2] = tmp;
            }
            nrecv++;
        }
        padded_next = 0;
        if (rc == MPI_SUCCESS && worker && s + 1 <= S) {
            /* the next step's list set (its send, if any, completed above) becomes padding
             * while the worker is still busy: its first touch off the compute's path */
            const xknn__cands *v = &vis[(s + 1) % nvis];
            xknn__lists_pad(v->ids, v->dist, rowss[(rank + s + 1) % P] * k, neg);
            padded_next = 1;
        }
        if (rc == MPI_SUCCESS && pieces > 0 && s == S) {
            /* P = 2, the last pair in pieces (see the worker), two streams a rank, driven by
             * the worker's news: each piece of the held set's lists goes to the partner once
             * told (rank 0: slice 1's pieces, rows; rank 1: slice 0's rows [0, g), rows2),
             * and each piece of the partner's is merged with the own rows once it is here
             * and they are told (rank 0: its rows [0, g), rows2; rank 1: the piece's own
             * rows, rows) and goes to the sink (rows in increasing order). Every piece
             * travels, also after a failed step (the partner's receives are posted); only
             * the merges wait on the news. */
            const int64_t g = pg;
            const int64_t ms = rank == 0 ? rowss[1] : g; /* the sent set's rows   */
            const int64_t mr = rank == 0 ? g : nloc;     /* the received pieces' */
            const xknn__cands *v = &vis[S % nvis];
            const int so = rank == 0 ? 0 : 2 * pieces, ro = rank == 0 ? 2 * pieces : 0; /* in preq */
            int64_t hsunk = g; /* rank 0, rows [g, hsunk) given to the sink (any order) */
            int64_t rcur = -1; /* the next row of the received piece qr to merge (-1: not here) */
            /* (a piece is merged and given to the sink in blocks of about 8 MiB of lists, or
             * XKNN_MPI_SYM_BLOCK_ROWS rows (a test hook), the sends checked between them) */
            const char *benv = getenv("XKNN_MPI_SYM_BLOCK_ROWS");
            const int64_t blk = benv && atoll(benv) > 0 ? (int64_t)atoll(benv) : xknn__sym_block(k);
            int qs = 0, qr = 0, flag = 0;
            /* The threads of a merge while the worker computes (all of them once it is
             * done): one where the worker computes on the CPU with the others; half where
             * it waits on a GPU (two H200s, 16 threads a rank: the merges of rank 0's
             * last 1M rows took 120-130 ms on one thread, 63-82 ms on four, 72-78 ms on
             * eight; the tail after the compute 53-71 ms on one, 36-52 ms on four).
             * XKNN_MPI_SYM_MERGE_THREADS=N (a diagnostic) sets it. */
            const char *menv = getenv("XKNN_MPI_SYM_MERGE_THREADS");
            int mt = 1;
#if defined(XKNN_MPI_HAVE_CUDA) && defined(_OPENMP)
            if (kctx) mt = (p.num_threads > 0 ? p.num_threads : omp_get_max_threads()) / 2;
#endif
            if (menv && atoi(menv) > 0) mt = atoi(menv);
            if (mt < 1) mt = 1;
            fin = spare;
            while ((qs < pieces || qr < pieces) && rc == MPI_SUCCESS) {
                int64_t hs = 0, hr = 0; /* rows told: of the sent set, of the own set */
                int over = 1, moved = 0;
                if (compute && worker && rd_made) {
                    /* (rank 0 sends slice 1's rows, rows; rank 1 slice 0's, rows2) */
                    xknn__sym_news(&rd, rank == 0 ? &hs : &hr, rank == 0 ? &hr : &hs, &over);
                } else if (compute) {
                    /* (inline, the step is over; no news without the mutex: after the join) */
                    if (worker && !joined) pthread_join(th, NULL);
                    joined = worker;
                    hs = rank == 0 ? w.pub : w.pub2;
                    hr = rank == 0 ? w.pub2 : w.pub;
                }
                while (qs < pieces && rc == MPI_SUCCESS) {
                    /* (rank 0 sends slice 1's pieces, rank 1 the parts of slice 0's rows [0, g)) */
                    const int64_t a = xknn__sym_at(rank == 0, ms, pieces, qs);
                    const int64_t b = xknn__sym_at(rank == 0, ms, pieces, qs + 1);
                    if (b > hs && !over) break;
                    if (b > a) {
                        rc = MPI_Isend(v->ids + a * k, (int)(b - a), idtype, 1 - rank, XKNN__TAG_LIST_IDS, ctx->comm,
                                       &preq[so + 2 * qs]);
                        if (rc == MPI_SUCCESS)
                            rc = MPI_Isend(v->dist + a * k, (int)(b - a), dtype_k, 1 - rank, XKNN__TAG_LIST_DIST,
                                           ctx->comm, &preq[so + 2 * qs + 1]);
                        if (trace)
                            fprintf(stderr, "xknn_mpi: trace rank %d: piece %d of slice %d's lists (rows %lld..%lld) sent %.3f\n",
                                    rank, qs, 1 - rank, (long long)a, (long long)b - 1, xknn__sym_now() - tr0);
                    }
                    qs++;
                    moved = 1;
                }
                while (qr < pieces && rc == MPI_SUCCESS) {
                    const int64_t a = xknn__sym_at(rank == 1, mr, pieces, qr);
                    const int64_t b = xknn__sym_at(rank == 1, mr, pieces, qr + 1);
                    const int64_t need = rank == 0 ? g : b; /* the own rows it merges with, told */
                    if (hr < need && !over) break;
                    if (rcur < 0) {
                        rc = MPI_Testall(2, preq + ro + 2 * qr, &flag, MPI_STATUSES_IGNORE);
                        if (rc != MPI_SUCCESS || !flag) break;
                        rcur = a;
                    }
                    if (b > a && hr >= need && st == XKNN_SUCCESS) {
                        const int64_t e = b - rcur > blk ? rcur + blk : b;
                        /* (all threads once the worker is done) */
                        xknn__sym_final(&own, &acc[0], &fin, 1, rcur, e, k, neg, over ? p.num_threads : mt, tm);
                        fdone = e;
                        if (out->sink &&
                            (st = xknn__sym_sink(out, rank, ref_offset, rcur, e, k, &fin, tm, lerr)) == XKNN_SUCCESS) {
                            sunk = e;
                            (*owned)++;
                        }
                        if (trace && e == b) {
                            fprintf(stderr,
                                    "xknn_mpi: trace rank %d: piece %d, own rows %lld..%lld final%s %.3f (merge %.1f ms, "
                                    "sink %.1f ms)\n",
                                    rank, qr, (long long)a, (long long)b - 1, out->sink ? " and written" : "",
                                    xknn__sym_now() - tr0, 1e3 * (tm->reduce - trr), 1e3 * (tm->write - trw));
                            trr = tm->reduce;
                            trw = tm->write;
                        }
                        rcur = e;
                    } else {
                        rcur = b;
                    }
                    moved = 1;
                    if (rcur < b) break; /* (one block a round: the sends first) */
                    qr++;
                    rcur = -1;
                }
                if (rc == MPI_SUCCESS && w.hparts && hr > hsunk && st == XKNN_SUCCESS) {
                    /* rank 0's rows [g, m_0) take nothing from rank 1: final once told */
                    if ((st = xknn__sym_sink(out, rank, ref_offset, hsunk, hr, k, &own, tm, lerr)) == XKNN_SUCCESS)
                        (*owned)++;
                    if (trace) {
                        fprintf(stderr, "xknn_mpi: trace rank 0: own rows %lld..%lld final and written %.3f (sink %.1f ms)\n",
                                (long long)hsunk, (long long)hr - 1, xknn__sym_now() - tr0, 1e3 * (tm->write - trw));
                        trw = tm->write;
                    }
                    hsunk = hr;
                    moved = 1;
                }
                if (rc == MPI_SUCCESS && !moved) {
                    /* (progress for what is posted; Open MPI moves data only inside MPI calls) */
                    const struct timespec nap = {0, 100000};
                    rc = MPI_Testall(64, preq, &flag, MPI_STATUSES_IGNORE);
                    nanosleep(&nap, NULL);
                }
            }
            if (rc == MPI_SUCCESS) rc = xknn__sym_wait(64, preq, worker && !joined);
            if (rc == MPI_SUCCESS && rank == 0 && compute && st == XKNN_SUCCESS && out->sink && out->gather_root < 0 &&
                fdone == g && sunk == g) {
                /* rows [g, m_0) take nothing from rank 1: final in the own set once the worker
                 * has brought them all, given after rows [0, g) (any order: those left); fin
                 * holds rows [0, g) only: no gather here */
                if (worker && !joined) pthread_join(th, NULL);
                joined = worker;
                if (w.st == XKNN_SUCCESS && w.pub2 == nloc) {
                    if (nloc > hsunk &&
                        (st = xknn__sym_sink(out, rank, ref_offset, hsunk, nloc, k, &own, tm, lerr)) == XKNN_SUCCESS) {
                        (*owned)++;
                        if (trace)
                            fprintf(stderr, "xknn_mpi: trace rank 0: own rows %lld..%lld final and written %.3f\n",
                                    (long long)hsunk, (long long)nloc - 1, xknn__sym_now() - tr0);
                    }
                    if (st == XKNN_SUCCESS) sunk = fdone = nloc;
                }
            }
        }
        if (rc == MPI_SUCCESS && worker && compute && s == S + 1 && w.rd && st == XKNN_SUCCESS) {
            /* split, step S + 1: every list set of the own rows is here; rows whose own
             * lists the worker has finished are final: merged and given to the sink while
             * it computes the next part */
            fin = nrecv > 0 ? spare : own;
            for (;;) {
                int64_t hi;
                int over;
                xknn__sym_news(&rd, &hi, NULL, &over);
                if (hi > fdone) {
                    xknn__sym_final(&own, &acc[0], &fin, nrecv > 0, fdone, hi, k, neg, p.num_threads, tm);
                    if (out->sink && st == XKNN_SUCCESS && nloc > 0 &&
                        (st = xknn__sym_sink(out, rank, ref_offset, fdone, hi, k, &fin, tm, lerr)) == XKNN_SUCCESS) {
                        sunk = hi;
                        (*owned)++;
                    }
                    if (trace)
                        fprintf(stderr, "xknn_mpi: trace rank %d: rows %lld..%lld final %.3f\n", rank, (long long)fdone,
                                (long long)hi - 1, xknn__sym_now() - tr0);
                    fdone = hi;
                } else if (over) {
                    break;
                } else {
                    const struct timespec nap = {0, 100000};
                    nanosleep(&nap, NULL);
                }
            }
        }
        tc = xknn__sym_now();
        if (worker && !joined) pthread_join(th, NULL);
#ifdef XKNN_MPI_HAVE_CUDA
        if (compute && w.forget[0]) kept[0] = NULL; /* (the worker forgot them) */
        if (compute && w.forget[1]) kept[1 + (s & 1)] = NULL;
        if (s >= 1 && kept[1 + (s & 1)]) {
            /* the held slice's buffer receives another slice later */
            xknn_cuda_forget_rows(kctx, kept[1 + (s & 1)]);
            kept[1 + (s & 1)] = NULL;
        }
        if (compute) {
            /* (the worker fetched them; a failed step drops them) */
            if (w.fetch_held) held_dev = 0;
            if (w.fetch_own || w.own_dropped) own_dev = 0;
            tdl += w.tf1 - w.tf0;
        }
#endif
        if (trace) {
            char line[512];
            int at = 0, i;
            at += snprintf(line + at, sizeof line - (size_t)at, "xknn_mpi: trace rank %d step %d:", rank, s);
            if (compute) {
                at += snprintf(line + at, sizeof line - (size_t)at, " compute %.3f..%.3f, marks", w.t0 - tr0,
                               w.t1 - tr0);
                for (i = 0; i < w.nmark && at < (int)sizeof line - 16; i++)
                    at += snprintf(line + at, sizeof line - (size_t)at, " %.3f", w.mark[i] - tr0);
                if (w.fetch_held || w.fetch_own)
                    at += snprintf(line + at, sizeof line - (size_t)at, ", lists to the host %.3f..%.3f", w.tf0 - tr0,
                                   w.tf1 - tr0);
                at += snprintf(line + at, sizeof line - (size_t)at, ";");
            }
            snprintf(line + at, sizeof line - (size_t)at,
                     " transfers done %.3f, held slice on the device %.3f, moves done %.3f, joined %.3f\n", ta - tr0,
                     tu - tr0, tc - tr0, xknn__sym_now() - tr0);
            fputs(line, stderr);
        }
        if (compute) {
            /* busy: the compute's own seconds; the moves count where they outlast it */
            tm->search += w.t1 - w.t0;
            nev += w.nev;
            if (w.st != XKNN_SUCCESS) st = xknn__mpi_fail(lerr, w.st, "rank %d: %s", rank, w.e.message);
        }
        /* moves that outlast the compute: the slices' (and lists') as broadcast time, the
         * last step's lists (round S + 1) as reduce time */
        if (s <= S)
            tm->broadcast += worker ? (tc > w.t1 ? tc - w.t1 : 0.0) : tc - tw;
        else
            tm->reduce += worker ? (tc > w.t1 ? tc - w.t1 : 0.0) : tc - tw;
        if (rc != MPI_SUCCESS) {
            st = xknn__mpi_error(rank, lerr, rc, "MPI_Waitall (reference slice or lists)");
            *mpi_broken = 1;
        }
        if (bounds && s == 0 && !*mpi_broken) {
            /* every row's k-th value after step 0 (+inf where its list is not full yet),
             * to every rank: the bounds of the slices it will hold */
            float *mine = bnd + bcnt[P + rank];
            int64_t i;
            int have_kth = 0;
            t0 = MPI_Wtime();
#ifdef XKNN_MPI_HAVE_CUDA
            if (own_dev) {
                /* (from the lists on the device; where that fails, they come to the host) */
                xknn_error ke;
                have_kth = xknn_cuda_lists_kth(kctx, own.ids, mine, &ke) == XKNN_SUCCESS;
                if (!have_kth) {
                    if (xknn_cuda_fetch_lists(kctx, own.ids, 1, &ke) != XKNN_SUCCESS && st == XKNN_SUCCESS)
                        st = xknn__mpi_fail(lerr, ke.status, "rank %d: %s", rank, ke.message);
                    own_dev = 0;
                }
            }
#endif
            if (!have_kth)
                for (i = 0; i < nloc; i++) mine[i] = own.ids[i * k + k - 1] >= 0 ? own.dist[i * k + k - 1] : INFINITY;
            rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, bnd, bcnt, bcnt + P, MPI_FLOAT, ctx->comm);
            tm->broadcast += MPI_Wtime() - t0;
            if (trace) fprintf(stderr, "xknn_mpi: trace rank %d: bounds shared %.3f\n", rank, xknn__sym_now() - tr0);
            if (rc != MPI_SUCCESS) {
                st = xknn__mpi_error(rank, lerr, rc, "MPI_Allgatherv (bounds)");
                *mpi_broken = 1;
            }
        }
    }

    /* the own rows' final lists: the own computations merged with what the others sent */
    fin = nrecv > 0 ? spare : own;
    if (!*mpi_broken && st == XKNN_SUCCESS && fdone < nloc) {
        xknn__sym_final(&own, &acc[0], &fin, nrecv > 0, fdone, nloc, k, neg, p.num_threads, tm);
        fdone = nloc;
    }
    if (trace)
        fprintf(stderr, "xknn_mpi: trace rank %d: final lists %.3f (lists kept on the device: %s, %.3f s to keep and fetch)\n",
                rank, xknn__sym_now() - tr0, dlists ? "yes" : "no", tdl);

    /* delivery, slice by slice in rank order */
    for (j = 0; j < P && !*mpi_broken; j++) {
        const int64_t rows = rowss[j], m = rows * k;
        if (rows == 0) continue; /* the same on every rank */
        t0 = MPI_Wtime();
        rc = MPI_SUCCESS;
        if (out->gather_root >= 0) {
            if (rank == j && j == out->gather_root) {
                memcpy(out->ids + row0s[j] * k, fin.ids, (size_t)m * sizeof(int64_t));
                if (out->dist) memcpy(out->dist + row0s[j] * k, fin.dist, (size_t)m * sizeof(float));
            } else if (rank == j) {
                rc = xknn__mpi_send_cands(ctx, &fin, rows, k, NULL, out->gather_root, XKNN__TAG_GATHER);
            } else if (rank == out->gather_root) {
                xknn__cands g;
                g.ids = out->ids + row0s[j] * k;
                /* (no distances wanted: received into the accumulator, free by now) */
                g.dist = out->dist ? out->dist + row0s[j] * k : acc[0].dist;
                rc = xknn__mpi_recv_cands(ctx, &g, rows, k, NULL, j, XKNN__TAG_GATHER);
            }
        }
        tm->reduce += MPI_Wtime() - t0;
        if (rc != MPI_SUCCESS) {
            st = xknn__mpi_error(rank, lerr, rc, "MPI_Send/MPI_Recv (candidate lists)");
            *mpi_broken = 1;
            break;
        }
        if (rank == j) {
            if (!out->sink || sunk < rows) (*owned)++; /* (split: blocks given in step S + 1 counted there) */
            if (out->sink && st == XKNN_SUCCESS && sunk < rows) {
                /* (split: the rows not given to the sink during step S + 1) */
                st = xknn__sym_sink(out, rank, row0s[j], sunk, rows, k, &fin, tm, lerr);
                if (trace) fprintf(stderr, "xknn_mpi: trace rank %d: written %.3f\n", rank, xknn__sym_now() - tr0);
            }
        }
        done_q += rows;
        if (out->progress) out->progress(out->progress_user, done_q, n);
    }

    if (!*mpi_broken) {
        /* balance: every rank's distance evaluations and busy (compute) seconds,
         * printed by rank 0 with verbose (gathered always: verbose need not agree) */
        double busy = tm->search;
        rc = MPI_Gather(&nev, 1, MPI_INT64_T, allev, 1, MPI_INT64_T, 0, ctx->comm);
        if (rc == MPI_SUCCESS) rc = MPI_Gather(&busy, 1, MPI_DOUBLE, all, 1, MPI_DOUBLE, 0, ctx->comm);
        if (rc == MPI_SUCCESS && rank == 0 && ctx->config.verbose) {
            fprintf(stderr, "xknn_mpi: symmetric ring: %d steps, %lld distance evaluations over %d ranks (compute %s)\n",
                    S + 1 + split, (long long)xknn__sym_tri(n), P,
                    threaded ? "in a worker thread, transfers overlapped" : "inline, transfers after it");
            for (j = 0; j < P; j++)
                fprintf(stderr, "xknn_mpi: rank %d: distance_evals=%lld busy=%.3f s\n", j, (long long)allev[j],
                        all[j]);
        }
        if (rc != MPI_SUCCESS) {
            st = xknn__mpi_error(rank, lerr, rc, "MPI_Gather (busy times)");
            *mpi_broken = 1;
        }
    }
    if (trace) fprintf(stderr, "xknn_mpi: trace rank %d: balance gathered %.3f\n", rank, xknn__sym_now() - tr0);

done:
    if (rd_made) pthread_mutex_destroy(&rd.mu);
    if (dtype_k != MPI_DATATYPE_NULL) MPI_Type_free(&dtype_k);
    if (idtype != MPI_DATATYPE_NULL) MPI_Type_free(&idtype);
    if (rowtype != MPI_DATATYPE_NULL) MPI_Type_free(&rowtype);
#ifdef XKNN_MPI_HAVE_CUDA
    /* (on the context, which may be the caller's: here, before the return) */
    if (own_dev) {
        /* (a step failed: its lists are of no use) */
        xknn_error ke;
        (void)xknn_cuda_fetch_lists(kctx, own.ids, 0, &ke);
    }
    if (held_dev) {
        xknn_error ke;
        for (j = 0; j < nvis; j++) (void)xknn_cuda_fetch_lists(kctx, vis[j].ids, 0, &ke);
    }
    /* (the ring's own context frees its kept rows when it is destroyed, off the path) */
    for (j = 0; j < 3; j++)
        if (kept[j] && kctx != cuctx) xknn_cuda_forget_rows(kctx, kept[j]);
#endif
    {
        /* what is the ring's alone, released off the caller's path (xknn__mpi_later):
         * the context it made, gigabytes of list sets and slices */
        xknn__sym_rel stack, *rl = (xknn__sym_rel *)malloc(sizeof *rl);
        xknn__sym_rel *r = rl ? rl : &stack;
        memset(r, 0, sizeof *r);
        r->heap = rl != NULL;
#ifdef XKNN_MPI_HAVE_CUDA
        r->cuctx = cuctx;
#endif
        r->host[0] = bcnt;
        r->host[1] = bnd;
        r->host[2] = allev;
        r->host[3] = all;
        r->host[4] = plan;
        r->host[5] = slice[1];
        r->host[6] = slice[0];
        r->host[7] = ldist;
        r->host[8] = lid;
        if (rl)
            xknn__mpi_later(ctx, xknn__sym_release, rl);
        else
            xknn__sym_release(r);
    }
    *evals = nev;
    return st;
}
