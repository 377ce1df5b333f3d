/* SPDX-License-Identifier: MIT */
/* dtype-rule-t: xknn_search_dtype, the element type a search of stored rows runs in.
 * The stored type where it has an exact fast path for the metric, float32 (an exact
 * widening) otherwise and for mixed types; one row per case of the rule. TAP. */
#include "tap/tap.h"
#include "xknn.h"

typedef struct {
    xknn_backend backend;
    xknn_metric metric;
    xknn_dtype ref, query;
    int64_t cols;
    xknn_dtype want;
    const char *what;
} dtype_case;

int main(void)
{
    static const dtype_case cases[] = {
        {XKNN_BACKEND_CPU, XKNN_METRIC_L2, XKNN_DTYPE_U8, XKNN_DTYPE_U8, 128, XKNN_DTYPE_U8, "l2 u8 on the CPU"},
        {XKNN_BACKEND_CPU, XKNN_METRIC_EUCLIDEAN, XKNN_DTYPE_I8, XKNN_DTYPE_I8, XKNN_INT8_EXACT_MAX_D, XKNN_DTYPE_I8,
         "euclidean i8 at the exact limit on the CPU"},
        {XKNN_BACKEND_CPU, XKNN_METRIC_L2, XKNN_DTYPE_U8, XKNN_DTYPE_U8, XKNN_INT8_EXACT_MAX_D + 1, XKNN_DTYPE_F32,
         "l2 u8 beyond the exact limit widens"},
        {XKNN_BACKEND_CUDA, XKNN_METRIC_L2, XKNN_DTYPE_U8, XKNN_DTYPE_U8, 128, XKNN_DTYPE_F32, "l2 u8 on CUDA widens"},
        {XKNN_BACKEND_CPU, XKNN_METRIC_L2, XKNN_DTYPE_F16, XKNN_DTYPE_F16, 64, XKNN_DTYPE_F32, "l2 f16 widens"},
        {XKNN_BACKEND_CPU, XKNN_METRIC_L1, XKNN_DTYPE_F16, XKNN_DTYPE_F16, 64, XKNN_DTYPE_F16, "l1 f16 stays"},
        {XKNN_BACKEND_CUDA, XKNN_METRIC_IP, XKNN_DTYPE_I8, XKNN_DTYPE_I8, 256, XKNN_DTYPE_I8, "ip i8 on CUDA stays"},
        {XKNN_BACKEND_CPU, XKNN_METRIC_IP, XKNN_DTYPE_U8, XKNN_DTYPE_F32, 16, XKNN_DTYPE_F32, "mixed types widen"},
        {XKNN_BACKEND_CPU, XKNN_METRIC_HAMMING, XKNN_DTYPE_BIN, XKNN_DTYPE_BIN, 1024, XKNN_DTYPE_BIN,
         "hamming bits stay"},
        {XKNN_BACKEND_CUDA, XKNN_METRIC_L2, XKNN_DTYPE_F32, XKNN_DTYPE_F32, 128, XKNN_DTYPE_F32, "f32 stays"},
    };
    const int n = (int)(sizeof cases / sizeof cases[0]);
    int i;
    plan(n);
    for (i = 0; i < n; i++) {
        const dtype_case *c = &cases[i];
        ok(xknn_search_dtype(c->backend, c->metric, c->ref, c->query, c->cols) == c->want, "%s", c->what);
    }
    return tap_done();
}
