/* SPDX-License-Identifier: MIT */
/* cuda-finite-t: NaN and Inf in host-array inputs on the CUDA backend, which checks f32
 * rows on the device after their upload (kernels/cuda/finite.cu) or, on paths that do
 * not, on the host: the status and the message (the first offending row and column in
 * row-major order, references before queries) must be the CPU backend's, byte for byte.
 * NaN, +Inf and -Inf at the first, a middle and the last element of the references and of
 * the queries; a second bad value later in the rows must not win; on a caller's context
 * (staged copies: the fused and tensor-core paths, several query blocks) and on a
 * temporary one. Skips everything (1..0 # SKIP) without a usable device. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap/tap.h"
#include "xknn.h"
#include "xknn/cuda.h"

enum { N = 3000, NQ = 700, D = 40, K = 5 };

static float ref[N * D], qry[NQ * D];
static int64_t ids[NQ * K];
static float dist[NQ * K];

static void fill(void)
{
    unsigned s = 12345u;
    int i;
    for (i = 0; i < N * D; i++) ref[i] = (float)((s = s * 1103515245u + 12345u) >> 16 & 255) / 16.0f;
    for (i = 0; i < NQ * D; i++) qry[i] = (float)((s = s * 1103515245u + 12345u) >> 16 & 255) / 16.0f;
}

/* One search: backend, path, query block, context; its status and message in *err */
static xknn_status run(xknn_backend backend, int path, int64_t qblock, xknn_cuda_context *ctx, xknn_error *err)
{
    xknn_params p = XKNN_PARAMS_INIT;
    xknn_matrix r = XKNN_MATRIX_F32(ref, N, D), q = XKNN_MATRIX_F32(qry, NQ, D);
    p.backend = backend;
    p.cuda_path = path;
    p.query_block = qblock;
    p.cuda_context = ctx;
    return xknn_search(&p, &r, &q, K, ids, dist, err);
}

int main(void)
{
    static const struct {
        const char *name;
        int path;
        int64_t qblock;
        int ctx;
    } modes[] = {
        {"auto, caller's context", XKNN_CUDA_PATH_AUTO, 0, 1},
        {"fused, caller's context, query blocks of 256", XKNN_CUDA_PATH_FUSED, 256, 1},
        {"mma, caller's context, query blocks of 256", XKNN_CUDA_PATH_MMA, 256, 1},
        {"auto, temporary context", XKNN_CUDA_PATH_AUTO, 0, 0},
    };
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    const char *bad_name[3] = {"NaN", "+Inf", "-Inf"};
    const int64_t at[3][2] = {{0, 0}, {N / 2 + 7, D / 2 + 1}, {N - 1, D - 1}}; /* (row, column) in the references */
    const int64_t atq[3][2] = {{0, 0}, {NQ / 2 + 3, D / 3}, {NQ - 1, D - 1}};
    const int nm = (int)(sizeof modes / sizeof modes[0]);
    xknn_cuda_context *ctx = NULL;
    xknn_error err, want;
    xknn_status st, wst;
    int m, side, b, w;

    if (!xknn_backend_built(XKNN_BACKEND_CUDA) || xknn_cuda_device_count() == 0) skip_all("no CUDA device");
    if (xknn_cuda_context_create(0, &ctx, &err) != XKNN_SUCCESS) bail("context: %s", err.message);
    plan(nm * (1 + 2 * 3 * 3 + 1));
    fill();
    for (m = 0; m < nm; m++) {
        xknn_cuda_context *c = modes[m].ctx ? ctx : NULL;
        st = run(XKNN_BACKEND_CUDA, modes[m].path, modes[m].qblock, c, &err);
        ok(st == XKNN_SUCCESS, "%s: finite rows pass (%s)", modes[m].name, st == XKNN_SUCCESS ? "ok" : err.message);
        for (side = 0; side < 2; side++)
            for (w = 0; w < 3; w++)
                for (b = 0; b < 3; b++) {
                    float *x = side ? qry : ref;
                    const int64_t r = side ? atq[w][0] : at[w][0], col = side ? atq[w][1] : at[w][1];
                    const int64_t i = r * D + col;
                    const float keep = x[i];
                    x[i] = bad[b];
                    wst = run(XKNN_BACKEND_CPU, 0, 0, NULL, &want);
                    st = run(XKNN_BACKEND_CUDA, modes[m].path, modes[m].qblock, c, &err);
                    ok(wst == XKNN_ERROR_INVALID_VALUE && st == wst && !strcmp(err.message, want.message),
                       "%s: %s at %s row %lld column %lld: '%s' (cpu '%s')", modes[m].name, bad_name[b],
                       side ? "query" : "reference", (long long)r, (long long)col, err.message, want.message);
                    x[i] = keep;
                }
        {
            /* two bad values: the first in row-major order is named, in the references
             * before any in the queries */
            ref[(N - 2) * D + 3] = INFINITY;
            ref[(N - 2) * D + 9] = NAN;
            ref[(N - 1) * D] = NAN;
            qry[0] = NAN;
            wst = run(XKNN_BACKEND_CPU, 0, 0, NULL, &want);
            st = run(XKNN_BACKEND_CUDA, modes[m].path, modes[m].qblock, c, &err);
            ok(st == wst && !strcmp(err.message, want.message) && strstr(err.message, "reference row 2998 column 3 is Inf"),
               "%s: several bad values, the first named: '%s'", modes[m].name, err.message);
            fill();
        }
    }
    xknn_cuda_context_destroy(ctx);
    return tap_done();
}
