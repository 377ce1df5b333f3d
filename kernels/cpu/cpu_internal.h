/* Private: pieces shared by the CPU backend's paths (kernels/cpu). */
#ifndef XKNN_CPU_INTERNAL_H
#define XKNN_CPU_INTERNAL_H

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
/* Formats the job's error message; returns st. */
xknn_status xknn__cpu_fail(const xknn__job *job, xknn_status st, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* f32 jobs whose values are all 8-bit integers (cpu_int8.c): converted once and searched
 * by the integer path. Returns XKNN__FALLBACK when it does not apply and !required. */
xknn_status xknn__cpu_int8_f32(const xknn__job *job, int required);

#endif
