/* SPDX-License-Identifier: MIT */
/*
 * knn_predict -- predictions of the knn_mpi command from the reduced neighbour rows
 * (see knn_predict.h for the flow). Votes follow include/xknn/learn.h.
 */
#define _POSIX_C_SOURCE 200809L

#include "cmd.h"
#include "knn_predict.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "xknn/io.h"

enum { KNN_PREDICT_MAX_CLASSES = 1000 }; /* confusion matrix: up to C x C int64 */


void knn_predict_init(knn_predict *p)
{
    memset(p, 0, sizeof *p);
}

int knn_predict_active(const knn_predict *p)
{
    return p->labels_path || p->targets_path || p->qlabels_path || p->out_path;
}

int knn_predict_check_options(const knn_predict *p, char *msg, size_t msz)
{
    if (p->labels_path && p->targets_path) {
        snprintf(msg, msz, "--labels and --targets exclude each other (classification or regression)");
        return 1;
    }
    if (p->out_path && !p->labels_path && !p->targets_path) {
        snprintf(msg, msz, "--predict needs --labels (classification) or --targets (regression)");
        return 1;
    }
    if (p->qlabels_path && !p->labels_path) {
        snprintf(msg, msz, "--query-labels needs --labels (the reference labels)");
        return 1;
    }
    if (p->out_path && !knn__ends(p->out_path, ".txt") && !knn__ends(p->out_path, ".npy")) {
        snprintf(msg, msz, "--predict: %s must end in .txt (one value per line) or .npy", p->out_path);
        return 1;
    }
    return 0;
}

/* ---- the collectives and their serial stand-ins ------------------------------------ */

#ifdef XKNN_HAVE_MPI
static xknn_status knn__pmpi(knn_predict *p, xknn_error *err, int rc, const char *what)
{
    return knn__mpi_fail(err, p->rank, rc, what);
}
#endif

/* Writes len bytes at off of the --predict output. */
static xknn_status knn__pwrite(knn_predict *p, int64_t off, const unsigned char *buf, int64_t len, xknn_error *err)
{
    return knn_outs_write(p->outs, p->slot, off, buf, len, "predictions", err);
}

/* ---- open: read labels, create the temporary -------------------------------------- */

static xknn_status knn__pread_inputs(knn_predict *p, xknn_error *err)
{
    /* --labels, --targets: one value a REF row; --query-labels: one a query */
    const char *const opts[3] = {"--labels", "--targets", "--query-labels"};
    const char *const paths[3] = {p->labels_path, p->targets_path, p->qlabels_path};
    xknn_status st;
    int64_t m = 0;
    int i;
    for (i = 0; i < 3; i++) {
        const char *what = i == 1 ? "target" : "label";
        if (!paths[i]) continue;
        st = i == 1 ? xknn_targets_read(paths[i], &m, &p->targets, err)
                    : xknn_labels_read(paths[i], &m, i == 0 ? &p->labels : &p->qlabels, err);
        if (st != XKNN_SUCCESS) return st;
        if (i == 2 && m != p->nq)
            return knn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "%s: %s holds %lld %ss, but there are nq=%lld queries",
                             opts[i], paths[i], (long long)m, what, (long long)p->nq);
        if (i < 2 && m != p->n)
            return knn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                             "%s: %s holds %lld %ss, but REF has n=%lld rows (one %s per row)", opts[i], paths[i],
                             (long long)m, what, (long long)p->n, what);
    }
    p->pred = (uint32_t *)calloc((size_t)(p->nq > 0 ? p->nq : 1), sizeof *p->pred);
    p->owned = (unsigned char *)calloc((size_t)(p->nq > 0 ? p->nq : 1), 1);
    if (!p->pred || !p->owned)
        return knn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "out of memory for %lld predictions", (long long)p->nq);
    if (p->verbose && p->qlabels) { /* classes: reference labels and query labels */
        int32_t *all = (int32_t *)malloc((size_t)(p->n + p->nq) * sizeof *all);
        if (!all) return knn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "out of memory for the confusion matrix");
        memcpy(all, p->labels, (size_t)p->n * sizeof *all);
        memcpy(all + p->n, p->qlabels, (size_t)p->nq * sizeof *all);
        st = xknn_label_classes(p->n + p->nq, all, all, &p->nclasses, err);
        if (st == XKNN_SUCCESS && p->nclasses <= KNN_PREDICT_MAX_CLASSES) {
            p->classes = all;
            p->confusion = (int64_t *)calloc((size_t)(p->nclasses * p->nclasses), sizeof *p->confusion);
            if (!p->confusion) st = knn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "out of memory for the confusion matrix");
        } else {
            free(all);
        }
        if (st != XKNN_SUCCESS) return st;
    }
    return XKNN_SUCCESS;
}

#ifdef XKNN_HAVE_MPI
xknn_status knn_predict_open(knn_predict *p, MPI_Comm comm, xknn_mpi_context *ctx, int64_t n, int64_t nq,
                             xknn_metric metric, xknn_error *err)
#else
xknn_status knn_predict_open(knn_predict *p, int64_t n, int64_t nq, xknn_metric metric, xknn_error *err)
#endif
{
    xknn_status st;
#ifdef XKNN_HAVE_MPI
    p->comm = comm;
    p->ctx = ctx;
    MPI_Comm_rank(comm, &p->rank);
    MPI_Comm_size(comm, &p->size);
#else
    p->rank = 0;
    p->size = 1;
#endif
    p->n = n;
    p->nq = nq;
    p->metric = metric;
    p->npy = p->out_path && knn__ends(p->out_path, ".npy");
    if (!knn_predict_active(p)) return XKNN_SUCCESS;
    /* every rank reads the same (small) files: one verdict, agreed below */
    st = knn__pread_inputs(p, err);
    return knn__agree_ctx(p->ctx, st, err);
}

/* ---- rows: the vote on the owner of a block --------------------------------------- */

xknn_status knn_predict_rows(knn_predict *p, int64_t q0, int64_t rows, int64_t k, const int64_t *ids,
                             const float *dist, xknn_error *err)
{
    xknn_status st;
    int64_t i;
    if (!knn_predict_active(p)) return XKNN_SUCCESS;
    if (p->labels) {
        int32_t *out = (int32_t *)malloc((size_t)(rows > 0 ? rows : 1) * sizeof *out);
        if (!out) return knn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "out of memory for %lld predictions", (long long)rows);
        st = xknn_classify(rows, k, ids, dist, p->metric, p->vote, p->labels, p->n, out, err);
        if (st == XKNN_SUCCESS && p->confusion)
            st = xknn_confusion(rows, p->qlabels + q0, out, p->nclasses, p->classes, p->confusion, err);
        if (st == XKNN_SUCCESS)
            for (i = 0; i < rows; i++) {
                p->pred[q0 + i] = (uint32_t)out[i];
                p->owned[q0 + i] = 1;
                if (p->qlabels) p->correct += out[i] == p->qlabels[q0 + i];
            }
        free(out);
        return st;
    } else {
        float *out = (float *)malloc((size_t)(rows > 0 ? rows : 1) * sizeof *out);
        if (!out) return knn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "out of memory for %lld predictions", (long long)rows);
        st = xknn_regress(rows, k, ids, dist, p->metric, p->vote, p->targets, p->n, out, err);
        if (st == XKNN_SUCCESS)
            for (i = 0; i < rows; i++) {
                memcpy(&p->pred[q0 + i], &out[i], sizeof out[i]);
                p->owned[q0 + i] = 1;
            }
        free(out);
        return st;
    }
}

/* ---- finish: sums over ranks, the file -------------------------------------------- */

/* Text of row q (with its newline) into buf (>= 32 bytes); returns its length. */
static int knn__pline(const knn_predict *p, int64_t q, char *buf)
{
    if (p->labels) return snprintf(buf, 32, "%ld\n", (long)(int32_t)p->pred[q]);
    {
        float f;
        memcpy(&f, &p->pred[q], sizeof f);
        return snprintf(buf, 32, "%.9g\n", (double)f);
    }
}

/* NumPy v1 header of a 1-D array of nq int32 or float32 values; total 64k bytes. */
static int knn__npy_header(const knn_predict *p, unsigned char *h)
{
    char dict[128];
    int dl = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%lld,), }",
                      p->labels ? "<i4" : "<f4", (long long)p->nq);
    int total = 10 + dl + 1, hl;
    total = (total + 63) / 64 * 64;
    hl = total - 10;
    memcpy(h, "\x93NUMPY\x01\x00", 8);
    h[8] = (unsigned char)(hl & 0xff);
    h[9] = (unsigned char)(hl >> 8);
    memcpy(h + 10, dict, (size_t)dl);
    memset(h + 10 + dl, ' ', (size_t)(total - 10 - dl - 1));
    h[total - 1] = '\n';
    return total;
}

/* Every rank writes its own rows: runs of consecutive owned rows, one write each. */
static xknn_status knn__pwrite_rows(knn_predict *p, int64_t hdr, const int64_t *offs, xknn_error *err)
{
    unsigned char *buf = NULL;
    size_t cap = 0;
    int64_t q = 0;
    xknn_status st = XKNN_SUCCESS;
    while (st == XKNN_SUCCESS && q < p->nq) {
        int64_t e, used = 0, r;
        if (!p->owned[q]) {
            q++;
            continue;
        }
        for (e = q; e < p->nq && p->owned[e] && e - q < 65536; e++) {
        }
        if (cap < (size_t)(e - q) * 32) {
            unsigned char *nb = (unsigned char *)realloc(buf, (size_t)(e - q) * 32);
            if (!nb) {
                st = knn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "out of memory writing predictions");
                break;
            }
            buf = nb;
            cap = (size_t)(e - q) * 32;
        }
        for (r = q; r < e; r++) {
            if (p->npy) {
                const uint32_t v = p->pred[r];
                buf[used++] = (unsigned char)(v & 0xff);
                buf[used++] = (unsigned char)((v >> 8) & 0xff);
                buf[used++] = (unsigned char)((v >> 16) & 0xff);
                buf[used++] = (unsigned char)(v >> 24);
            } else {
                used += knn__pline(p, r, (char *)buf + used);
            }
        }
        st = knn__pwrite(p, p->npy ? hdr + 4 * q : offs[q], buf, used, err);
        q = e;
    }
    free(buf);
    return st;
}

xknn_status knn_predict_finish(knn_predict *p, xknn_error *err)
{
    xknn_status st = XKNN_SUCCESS;
    int64_t *offs = NULL, total = 0, hdr = 0, q;
    unsigned char h[256];
    if (!knn_predict_active(p)) return XKNN_SUCCESS;
#ifdef XKNN_HAVE_MPI
    {
        int64_t c = p->correct;
        int rc = MPI_Allreduce(&c, &p->correct, 1, MPI_INT64_T, MPI_SUM, p->comm);
        if (rc == MPI_SUCCESS && p->confusion)
            rc = MPI_Reduce(p->rank == 0 ? MPI_IN_PLACE : p->confusion, p->confusion,
                            (int)(p->nclasses * p->nclasses), MPI_INT64_T, MPI_SUM, 0, p->comm);
        if (rc != MPI_SUCCESS) st = knn__pmpi(p, err, rc, "MPI_Allreduce (accuracy)");
    }
    if ((st = knn__agree_ctx(p->ctx, st, err)) != XKNN_SUCCESS) return st;
#endif
    p->accuracy = p->nq > 0 ? (double)p->correct / (double)p->nq : 0.0;
    if (!p->out_path) return XKNN_SUCCESS;

    if (p->npy) {
        hdr = knn__npy_header(p, h);
        total = hdr + 4 * p->nq;
        if (p->rank == 0) st = knn__pwrite(p, 0, h, hdr, err);
    } else {
        /* offsets of every line: each rank knows its own lines' lengths; summed */
        int32_t *len = (int32_t *)calloc((size_t)(p->nq > 0 ? p->nq : 1), sizeof *len);
        offs = (int64_t *)malloc((size_t)(p->nq > 0 ? p->nq : 1) * sizeof *offs);
        if (!len || !offs) {
            st = knn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "out of memory for %lld prediction offsets",
                            (long long)p->nq);
        } else {
            char line[32];
            for (q = 0; q < p->nq; q++)
                if (p->owned[q]) len[q] = knn__pline(p, q, line);
#ifdef XKNN_HAVE_MPI
            for (q = 0; q < p->nq && st == XKNN_SUCCESS; q += (int64_t)1 << 26) {
                const int64_t c = p->nq - q < ((int64_t)1 << 26) ? p->nq - q : ((int64_t)1 << 26);
                int rc = MPI_Allreduce(MPI_IN_PLACE, len + q, (int)c, MPI_INT32_T, MPI_SUM, p->comm);
                if (rc != MPI_SUCCESS) st = knn__pmpi(p, err, rc, "MPI_Allreduce (prediction offsets)");
            }
#endif
            for (q = 0; q < p->nq; q++) {
                offs[q] = total;
                total += len[q];
            }
        }
        free(len);
    }
    if (st == XKNN_SUCCESS) st = knn__pwrite_rows(p, hdr, offs, err);
    free(offs);
    p->bytes = total;
    return knn__agree_ctx(p->ctx, st, err);
}

void knn_predict_print_confusion(const knn_predict *p, FILE *f)
{
    int64_t a, b;
    if (!p->qlabels || !p->verbose) return;
    if (!p->confusion) {
        fprintf(f, "knn_mpi: confusion matrix skipped: %lld classes (at most %d are printed)\n",
                (long long)p->nclasses, (int)KNN_PREDICT_MAX_CLASSES);
        return;
    }
    fprintf(f, "knn_mpi: confusion matrix (rows: true label, columns: predicted label)\n%12s", "");
    for (b = 0; b < p->nclasses; b++) fprintf(f, " %8ld", (long)p->classes[b]);
    fprintf(f, "\n");
    for (a = 0; a < p->nclasses; a++) {
        fprintf(f, "%12ld", (long)p->classes[a]);
        for (b = 0; b < p->nclasses; b++) fprintf(f, " %8lld", (long long)p->confusion[a * p->nclasses + b]);
        fprintf(f, "\n");
    }
}

void knn_predict_free(knn_predict *p)
{
    free(p->labels);
    free(p->qlabels);
    free(p->targets);
    free(p->pred);
    free(p->owned);
    free(p->classes);
    free(p->confusion);
}
