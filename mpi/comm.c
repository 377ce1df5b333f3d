/* SPDX-License-Identifier: MIT */
/*
 * mpi/comm.c -- the context (duplicated communicator, local rank, device, transfer
 * mode), collective error agreement, and small helpers of the distributed layer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "impl.h"

#if defined(XKNN_HAVE_MPI_EXT_H)
#include <mpi-ext.h>
#endif

xknn_status xknn__mpi_error(int rank, xknn_error *err, int rc, const char *what)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    const char *paren;
    size_t wlen;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "MPI error code %d", rc);
    /* name the MPI function, not the whole call expression */
    paren = strchr(what, '(');
    wlen = paren ? (size_t)(paren - what) : strlen(what);
    if (wlen > 64) wlen = 64;
    return xknn__mpi_fail(err, XKNN_ERROR_MPI, "rank %d: %.*s failed: %s", rank, (int)wlen, what, text);
}

const char *xknn_mpi_transfer_name(xknn_mpi_transfer transfer)
{
    switch (transfer) {
    case XKNN_MPI_TRANSFER_AUTO: return "auto";
    case XKNN_MPI_TRANSFER_HOST_STAGED: return "host-staged";
    case XKNN_MPI_TRANSFER_CUDA_AWARE: return "cuda-aware";
    default: return "unknown";
    }
}

xknn_mpi_transfer xknn_mpi_transfer_from_name(const char *name)
{
    int t;
    if (!name) return XKNN_MPI_TRANSFER_COUNT;
    for (t = 0; t < XKNN_MPI_TRANSFER_COUNT; t++)
        if (!strcmp(name, xknn_mpi_transfer_name((xknn_mpi_transfer)t))) return (xknn_mpi_transfer)t;
    return XKNN_MPI_TRANSFER_COUNT;
}

int xknn_mpi_cuda_aware_supported(void)
{
#if defined(XKNN_HAVE_MPI_EXT_H) && defined(MPIX_CUDA_AWARE_SUPPORT)
    /* The compile-time macro says whether the extension exists in this build of the
     * MPI library; the run-time query whether CUDA support is active now. */
    return MPIX_Query_cuda_support() ? 1 : 0;
#else
    return 0;
#endif
}

xknn_mpi_transfer xknn__mpi_pick_transfer(xknn_mpi_transfer requested, int candidates_on_device,
                                          int cuda_aware_mpi, xknn_error *err)
{
    switch (requested) {
    case XKNN_MPI_TRANSFER_AUTO:
        return candidates_on_device && cuda_aware_mpi ? XKNN_MPI_TRANSFER_CUDA_AWARE
                                                      : XKNN_MPI_TRANSFER_HOST_STAGED;
    case XKNN_MPI_TRANSFER_HOST_STAGED: return XKNN_MPI_TRANSFER_HOST_STAGED;
    case XKNN_MPI_TRANSFER_CUDA_AWARE:
        /* Host candidate buffers may be handed to any MPI directly; device buffers only
         * to a CUDA-aware one. */
        if (candidates_on_device && !cuda_aware_mpi) {
            xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                           "transfer cuda-aware: this MPI library reports no CUDA support "
                           "(MPIX_Query_cuda_support() = 0); use host-staged or auto");
            return XKNN_MPI_TRANSFER_COUNT;
        }
        return XKNN_MPI_TRANSFER_CUDA_AWARE;
    default:
        xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT, "unknown transfer mode %d", (int)requested);
        return XKNN_MPI_TRANSFER_COUNT;
    }
}

void xknn_mpi_slice(int64_t n, int rank, int size, int64_t *row0, int64_t *rows)
{
    int64_t q, rem, a, b;
    if (n < 0 || size <= 0 || rank < 0 || rank >= size) {
        if (row0) *row0 = 0;
        if (rows) *rows = 0;
        return;
    }
    /* floor(r*n/P) = r*q + floor(r*rem/P) with n = q*P + rem: no overflow. */
    q = n / size;
    rem = n % size;
    a = (int64_t)rank * q + ((int64_t)rank * rem) / size;
    b = (int64_t)(rank + 1) * q + ((int64_t)(rank + 1) * rem) / size;
    if (row0) *row0 = a;
    if (rows) *rows = b - a;
}

/* The message travelling in the agreement's broadcast. */
typedef struct xknn__verdict {
    int status;
    char message[sizeof(((xknn_error *)0)->message)];
} xknn__verdict;

xknn_status xknn_mpi_agree(xknn_mpi_context *ctx, xknn_status status, xknn_error *err)
{
    int in[2], res[2] = {0, 0}, rc;
    xknn__verdict v;
    if (!ctx) return xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT, "xknn_mpi_agree: context is NULL");
    in[0] = status != XKNN_SUCCESS;
    in[1] = ctx->rank;
    /* MAXLOC: the failure flag decides; among failing ranks the lowest rank wins. */
    rc = MPI_Allreduce(in, res, 1, MPI_2INT, MPI_MAXLOC, ctx->comm);
    if (rc != MPI_SUCCESS) return xknn__mpi_error(ctx->rank, err, rc, "MPI_Allreduce(agreement)");
    if (!res[0]) {
        if (err) {
            err->status = XKNN_SUCCESS;
            err->message[0] = '\0';
        }
        return XKNN_SUCCESS;
    }
    memset(&v, 0, sizeof v);
    if (ctx->rank == res[1]) {
        v.status = (int)status;
        if (err && err->message[0])
            snprintf(v.message, sizeof v.message, "%s", err->message);
        else
            snprintf(v.message, sizeof v.message, "rank %d: %s", ctx->rank, xknn_status_string(status));
    }
    rc = MPI_Bcast(&v, (int)sizeof v, MPI_BYTE, res[1], ctx->comm);
    if (rc != MPI_SUCCESS) return xknn__mpi_error(ctx->rank, err, rc, "MPI_Bcast(agreement)");
    if (v.status <= XKNN_SUCCESS || v.status >= XKNN_STATUS_COUNT) v.status = XKNN_ERROR_INTERNAL;
    v.message[sizeof v.message - 1] = '\0';
    if (err) {
        err->status = (xknn_status)v.status;
        memcpy(err->message, v.message, sizeof err->message);
    }
    return (xknn_status)v.status;
}

xknn_status xknn_mpi_create(MPI_Comm comm, const xknn_mpi_config *config, xknn_mpi_context **out,
                            xknn_error *err)
{
    xknn_mpi_config cfg = XKNN_MPI_CONFIG_INIT;
    xknn_mpi_context *ctx;
    MPI_Comm local = MPI_COMM_NULL;
    xknn_status st = XKNN_SUCCESS, agreed;
    xknn_error lerr;
    int rank = -1, rc, ndev;

    lerr.status = XKNN_SUCCESS;
    lerr.message[0] = '\0';
    if (out) *out = NULL;
    if (config) cfg = *config;
    MPI_Comm_rank(comm, &rank); /* for messages only; the dup below is what counts */

    ctx = (xknn_mpi_context *)calloc(1, sizeof *ctx);
    if (!ctx) return xknn__mpi_fail(err, XKNN_ERROR_OUT_OF_MEMORY, "rank %d: out of memory for the context", rank);
    ctx->comm = MPI_COMM_NULL;
    /* The duplicate comes first: it is collective and everything after runs on it. */
    rc = MPI_Comm_dup(comm, &ctx->comm);
    if (rc != MPI_SUCCESS) {
        free(ctx);
        return xknn__mpi_error(rank, err, rc, "MPI_Comm_dup");
    }
    rc = MPI_Comm_set_errhandler(ctx->comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(ctx->comm, &ctx->rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(ctx->comm, &ctx->size);
    if (rc != MPI_SUCCESS) {
        st = xknn__mpi_error(rank, err, rc, "MPI_Comm_set_errhandler/rank/size");
        MPI_Comm_free(&ctx->comm);
        free(ctx);
        return st;
    }
    rank = ctx->rank;

    /* From here on every rank reaches the agreement below. */
    rc = MPI_Comm_split_type(ctx->comm, MPI_COMM_TYPE_SHARED, ctx->rank, MPI_INFO_NULL, &local);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(local, &ctx->local_rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(local, &ctx->local_size);
    if (local != MPI_COMM_NULL) MPI_Comm_free(&local);
    if (rc != MPI_SUCCESS) st = xknn__mpi_error(rank, &lerr, rc, "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
    if (rc == MPI_SUCCESS) xknn_thread_share(ctx->local_size); /* the node's CPUs are shared */

    if (st == XKNN_SUCCESS && cfg.device < -1)
        st = xknn__mpi_fail(&lerr, XKNN_ERROR_INVALID_ARGUMENT, "rank %d: config device=%d: need -1 or a device ordinal",
                            rank, cfg.device);
    if (st == XKNN_SUCCESS && cfg.query_block < 0)
        st = xknn__mpi_fail(&lerr, XKNN_ERROR_INVALID_ARGUMENT, "rank %d: config query_block=%lld: need >= 0",
                            rank, (long long)cfg.query_block);
    if (st == XKNN_SUCCESS) {
        ctx->cuda_aware_mpi = xknn_mpi_cuda_aware_supported();
        /* Candidate buffers are host memory in every backend today. */
        ctx->transfer = xknn__mpi_pick_transfer(cfg.transfer, 0, ctx->cuda_aware_mpi, &lerr);
        if (ctx->transfer == XKNN_MPI_TRANSFER_COUNT) {
            char m[sizeof lerr.message];
            snprintf(m, sizeof m, "%s", lerr.message);
            st = xknn__mpi_fail(&lerr, XKNN_ERROR_INVALID_ARGUMENT, "rank %d: config %s", rank, m);
        }
    }
    if (st == XKNN_SUCCESS) {
        ndev = xknn_cuda_device_count();
        ctx->device = cfg.device >= 0 ? cfg.device : (ndev > 0 ? ctx->local_rank % ndev : -1);
        ctx->config = cfg;
    }

    agreed = xknn_mpi_agree(ctx, st, &lerr);
    if (agreed != XKNN_SUCCESS) {
        MPI_Comm_free(&ctx->comm);
        free(ctx);
        if (err) *err = lerr;
        return agreed;
    }
    if (err) *err = lerr;
    if (out)
        *out = ctx;
    else
        xknn_mpi_destroy(ctx);
    return XKNN_SUCCESS;
}

typedef struct xknn__later_job {
    void (*run)(void *);
    void *arg;
} xknn__later_job;

static void *xknn__later_main(void *p)
{
    xknn__later_job job = *(xknn__later_job *)p;
    free(p);
    job.run(job.arg);
    return NULL;
}

void xknn__mpi_later_wait(xknn_mpi_context *ctx)
{
    if (ctx && ctx->later_live) {
        pthread_join(ctx->later, NULL);
        ctx->later_live = 0;
    }
}

void xknn__mpi_later(xknn_mpi_context *ctx, void (*run)(void *), void *arg)
{
    xknn__later_job *job = (xknn__later_job *)malloc(sizeof *job);
    xknn__mpi_later_wait(ctx);
    if (job) {
        job->run = run;
        job->arg = arg;
        if (pthread_create(&ctx->later, NULL, xknn__later_main, job) == 0) {
            ctx->later_live = 1;
            return;
        }
        free(job);
    }
    run(arg);
}

xknn_status xknn_mpi_destroy(xknn_mpi_context *ctx)
{
    int rc = MPI_SUCCESS;
    if (!ctx) return XKNN_SUCCESS;
    xknn__mpi_later_wait(ctx);
    if (ctx->comm != MPI_COMM_NULL) rc = MPI_Comm_free(&ctx->comm);
    free(ctx);
    return rc == MPI_SUCCESS ? XKNN_SUCCESS : XKNN_ERROR_MPI;
}

int xknn_mpi_rank(const xknn_mpi_context *ctx) { return ctx ? ctx->rank : -1; }
int xknn_mpi_size(const xknn_mpi_context *ctx) { return ctx ? ctx->size : 0; }
int xknn_mpi_local_rank(const xknn_mpi_context *ctx) { return ctx ? ctx->local_rank : -1; }
int xknn_mpi_local_size(const xknn_mpi_context *ctx) { return ctx ? ctx->local_size : 0; }
int xknn_mpi_device(const xknn_mpi_context *ctx) { return ctx ? ctx->device : -1; }
MPI_Comm xknn_mpi_comm(const xknn_mpi_context *ctx) { return ctx ? ctx->comm : MPI_COMM_NULL; }
xknn_mpi_transfer xknn_mpi_transfer_mode(const xknn_mpi_context *ctx)
{
    return ctx ? ctx->transfer : XKNN_MPI_TRANSFER_COUNT;
}
