/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/pool.cu -- the context's copy helpers (pool_copy): a host copy of a staged
 * call (pageable to pinned memory and back) split into chunks that the calling thread and
 * up to kPoolHelpers helper threads claim one at a time.
 *
 * Why not an OpenMP team: a team's join waits for every member, and on a busy machine a
 * member may wait a scheduler slice (milliseconds) for a core before it starts. Here the
 * caller copies every chunk no thread has claimed yet, so it never waits for a helper
 * that has not started; it waits only for chunks a helper is copying at that moment. On
 * an idle machine the helpers take most of the chunks and the copy runs at the memory's
 * speed. Idle helpers sleep on a condition variable: nothing spins.
 *
 * A helper descheduled in the middle of a chunk still makes the caller wait for it. When
 * that wait was long (kPoolLate: a scheduler slice, not a chunk's copy), the machine is
 * busy: the copies of the next kPoolRest seconds run on the caller alone, then helpers
 * are tried again.
 */
#include <atomic>
#include <new>

#include "engine.cuh"

using namespace xknn_cuda;

/* The claim word: the job's generation in the high bits, the chunks still unclaimed in
 * the low kPoolBits. A claim is a compare-and-swap that takes chunk (unclaimed - 1) of
 * the generation the claimer joined; it fails once the generation moved on, so a late
 * helper never takes a chunk of a job whose fields it has not read. */
static const int kPoolBits = 40;
static const uint64_t kPoolMask = ((uint64_t)1 << kPoolBits) - 1;

struct xknn_cuda_pool {
    pthread_t th[kPoolHelpers];
    int nth;
    pthread_mutex_t mu;
    pthread_cond_t wake;     /* a job was published (or stop)                 */
    pthread_cond_t progress; /* the job's last chunk is done                  */
    int stop, seats;         /* under mu: helpers that may still join the job */
    uint64_t gen;            /* under mu: the current job's generation        */
    std::atomic<uint64_t> claim;
    std::atomic<int64_t> left; /* chunks not copied yet                        */
    std::atomic<int> waiting;  /* the caller sleeps on progress                */
    double rest_until;         /* the caller's: no helpers before this time      */
    /* the job; written before its generation is published, read after a claim */
    char *dst;
    const char *src;
    int64_t rows, chunk_rows;
    size_t row_bytes, ld_bytes;
};

namespace {

/* Chunk index claimed in generation g, or -1 when none is left (or g is over) */
int64_t pool_claim(xknn_cuda_pool *p, uint64_t g)
{
    uint64_t v = p->claim.load(std::memory_order_acquire);
    while ((v >> kPoolBits) == g && (v & kPoolMask) > 0)
        if (p->claim.compare_exchange_weak(v, v - 1, std::memory_order_acq_rel, std::memory_order_acquire))
            return (int64_t)(v & kPoolMask) - 1;
    return -1;
}

/* Copies the chunks of generation g that this thread can claim; wakes the caller when
 * it copied the last one and the caller sleeps. */
void pool_work(xknn_cuda_pool *p, uint64_t g)
{
    for (int64_t c; (c = pool_claim(p, g)) >= 0;) {
        const int64_t r0 = c * p->chunk_rows, nr = min64(p->chunk_rows, p->rows - r0);
        host_rows_copy(p->dst + r0 * (int64_t)p->row_bytes, p->src + r0 * (int64_t)p->ld_bytes, nr, p->row_bytes,
                       p->ld_bytes, 1);
        if (p->left.fetch_sub(1) == 1 && p->waiting.load()) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->progress);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

/* A helper: sleeps until a job it has not seen is published, joins it while seats are
 * left, copies what it can claim, sleeps again */
void *pool_helper(void *arg)
{
    xknn_cuda_pool *p = (xknn_cuda_pool *)arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        if (p->gen == seen) {
            pthread_cond_wait(&p->wake, &p->mu);
            continue;
        }
        seen = p->gen;
        if (p->seats <= 0) continue;
        --p->seats;
        pthread_mutex_unlock(&p->mu);
        pool_work(p, seen);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* The context's pool, made on first use with min(kPoolHelpers, budget - 1) helpers
 * (xknn_thread_budget: the CPUs this process may use); NULL where the budget is one CPU
 * or no thread can be started (the caller then copies alone). */
xknn_cuda_pool *pool_get(xknn_cuda_context *ctx)
{
    if (ctx->copy_pool || ctx->copy_pool_none) return ctx->copy_pool;
    const int want = min64(kPoolHelpers, (int64_t)xknn_thread_budget() - 1);
    xknn_cuda_pool *p = want > 0 ? new (std::nothrow) xknn_cuda_pool() : NULL;
    if (p) {
        pthread_mutex_init(&p->mu, NULL);
        pthread_cond_init(&p->wake, NULL);
        pthread_cond_init(&p->progress, NULL);
        while (p->nth < want && pthread_create(&p->th[p->nth], NULL, pool_helper, p) == 0) ++p->nth;
        if (p->nth == 0) {
            pool_destroy(p);
            p = NULL;
        }
    }
    ctx->copy_pool = p;
    ctx->copy_pool_none = p == NULL;
    return p;
}

} // namespace

namespace xknn_cuda {

void pool_destroy(xknn_cuda_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nth; ++i) pthread_join(p->th[i], NULL);
    pthread_cond_destroy(&p->progress);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    delete p;
}

int pool_helpers(xknn_cuda_context *ctx, int threads)
{
    if (!ctx || threads == 1) return 0;
    const xknn_cuda_pool *p = pool_get(ctx);
    const int h = p && (p->rest_until == 0.0 || wall_seconds() >= p->rest_until) ? p->nth : 0;
    return threads > 1 && threads - 1 < h ? threads - 1 : h;
}

/* rows x row_bytes from rows of stride ld_bytes, on the calling thread and the helpers
 * (at most threads - 1 of them when threads > 0); chunks of kPoolChunk bytes. One caller
 * at a time per context, as for every host call on it. */
void pool_copy(xknn_cuda_context *ctx, char *dst, const char *src, int64_t rows, size_t row_bytes, size_t ld_bytes,
               int threads)
{
    if (ld_bytes == row_bytes) { /* contiguous: chunks of bytes */
        rows *= (int64_t)row_bytes;
        row_bytes = ld_bytes = 1;
    }
    const int64_t chunk_rows = max64(1, (int64_t)(kPoolChunk / row_bytes)), n = ceil_div(rows, chunk_rows);
    const int helpers = n > 1 ? pool_helpers(ctx, threads) : 0;
    if (helpers == 0) {
        host_rows_copy(dst, src, rows, row_bytes, ld_bytes, threads);
        return;
    }
    xknn_cuda_pool *p = ctx->copy_pool;
    pthread_mutex_lock(&p->mu);
    p->dst = dst;
    p->src = src;
    p->rows = rows;
    p->chunk_rows = chunk_rows;
    p->row_bytes = row_bytes;
    p->ld_bytes = ld_bytes;
    p->left.store(n);
    p->seats = (int)min64(helpers, n - 1);
    const uint64_t g = ++p->gen;
    p->claim.store(g << kPoolBits | (uint64_t)n, std::memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    pool_work(p, g);
    p->rest_until = 0.0;
    if (p->left.load() > 0) {
        /* only chunks a helper is copying now are left: sleep until the last is done */
        const double t0 = wall_seconds();
        pthread_mutex_lock(&p->mu);
        p->waiting.store(1);
        while (p->left.load() > 0) pthread_cond_wait(&p->progress, &p->mu);
        p->waiting.store(0);
        pthread_mutex_unlock(&p->mu);
        const double t1 = wall_seconds();
        if (t1 - t0 > kPoolLate) p->rest_until = t1 + kPoolRest;
    }
}

} // namespace xknn_cuda
