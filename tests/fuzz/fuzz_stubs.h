/* SPDX-License-Identifier: MIT */
/*
 * tests/fuzz/fuzz_stubs.h -- backend entry points for the fuzz targets, which compile the
 * header-only host code but none of the kernels: the code they drive (readers, the
 * option parser) never reaches a backend. Include once per target, after
 * xknn/impl/backend.h.
 */
#ifndef XKNN_FUZZ_STUBS_H
#define XKNN_FUZZ_STUBS_H

xknn_status xknn__cpu_search(const xknn__job *job) { (void)job; return XKNN_ERROR_INTERNAL; }
const char *xknn__cpu_sym_why_not(const xknn_params *p, xknn_dtype dtype, int64_t d)
{
    (void)p;
    (void)dtype;
    (void)d;
    return "no backend";
}
xknn_status xknn__cpu_sym_pair(const xknn__job *job, const xknn__sym_side *a, const xknn__sym_side *b)
{
    (void)job;
    (void)a;
    (void)b;
    return XKNN_ERROR_INTERNAL;
}
int xknn__cuda_built(void) { return 0; }
int xknn__cuda_device_count(void) { return 0; }

#endif
