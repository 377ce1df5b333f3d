/* SPDX-License-Identifier: MIT */
/* Private: pieces shared by the CPU backend's paths (kernels/cpu). */
#ifndef XKNN_CPU_INTERNAL_H
#define XKNN_CPU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "xknn/impl/backend.h"

/* A result entry under the order (distance ascending, id ascending). */
typedef struct {
    float d;
    int64_t id;
} xknn__pair;

/* private status: this path does not apply to the job, try the next one */
#define XKNN__FALLBACK ((xknn_status)-1)

/* qsort comparator of pairs under the result order */
int xknn__pair_cmp(const void *a, const void *b);
/* Bounded max-heap of cap pairs keeping the best under the result order. */
void xknn__pheap_push(xknn__pair *h, int64_t *size, int64_t cap, float d, int64_t id);
/* Writes the sorted pairs (first `have`) of query qi and pads to k (pad_missing only). */
void xknn__emit(const xknn__job *job, int64_t qi, const xknn__pair *best, int64_t have);
/* CPU threads of the job (params.num_threads, else the OpenMP default). */
int xknn__threads(const xknn__job *job);
/* Formats the error message of job (an xknn__job, or any job with msg and msg_size);
 * returns st. */
#define xknn__cpu_fail(job, st, ...) xknn__msgf((job)->msg, (job)->msg_size, (st), __VA_ARGS__)

/* f32 jobs whose values are all 8-bit integers (cpu_int8.c): converted once and searched
 * by the integer path. Returns XKNN__FALLBACK when it does not apply and !required. */
xknn_status xknn__cpu_int8_f32(const xknn__job *job, int required);

#ifdef XKNN_HAVE_CBLAS
/* Candidate buffer of one query of the BLAS path (cpu_search.c), also driven by the
 * symmetric self-join (sym_search.c). */
typedef struct {
    int64_t *cand;    /* candidate reference rows (local)                          */
    float *cand_lo;   /* lower bounds of their squared distance (-inf once exact)  */
    float *cand_hi;   /* upper bounds of their squared distance                    */
    float *cand_c;    /* canonical distance, or NaN when not computed              */
    int64_t count;
    int64_t trigger;  /* prune when count reaches this                             */
    float tau;        /* tau' = (k-th smallest upper bound)(1 + 2^-19) + 16 FLT_MIN;
                         +inf until the buffer first held k candidates             */
} xknn__qstate;

/* Scans one row of a -2 q.x tile (crow, references r0 .. r0+rb-1 of job->ref, whose
 * float norms are nx[r0 ..]) into the query's candidate buffer under the certified
 * bound; self_row: a reference row to skip (-1: none). cpu_search.c documents it. */
void xknn__scan_row(const xknn__job *job, xknn__qstate *s, const float *crow, int64_t r0, int64_t rb,
                    const float *nx, float nqi, float eps, float absb, int64_t self_row, int64_t kk, int64_t cap,
                    const float *q, int64_t *rows, float *vals, xknn__pair *tmp);
/* Prunes, re-ranks with the canonical distance and keeps the exact best `keep`
 * (job->ref rows); returns the count. Scratch: cap entries each. */
int64_t xknn__rerank(const xknn__job *job, xknn__qstate *s, const float *q, int64_t keep, int64_t *rows,
                     float *vals, xknn__pair *tmp, int64_t kk);
/* OpenBLAS single-threaded while OpenMP threads each call sgemm (nt > 1); returns what
 * xknn__blas_threads_restore needs. */
int xknn__blas_threads_single(int nt);
void xknn__blas_threads_restore(int saved);
/* OUT_OF_MEMORY for a BLAS path's per-thread buffers: a qb x rb tile and cap candidates
 * per query. */
xknn_status xknn__cpu_tile_oom(const xknn__job *job, int64_t qb, int64_t rb, int64_t cap);
#endif

/* The canonical distance function of a dtype, and the bytes of one element (BIN: of
 * one uint64 word). */
typedef float (*xknn__dist_fn)(const xknn__cm_spec *s, const void *a, const void *b, int64_t d);
xknn__dist_fn xknn__pick_dist(xknn_dtype dtype);

/* Symmetric self-join (sym_search.c): each distance computed once for both points. */
xknn_status xknn__cpu_sym_self(const xknn__job *job);

#endif
