/* SPDX-License-Identifier: MIT */
/* libFuzzer target: knn_mpi's command-line parser. tools/knn_mpi.c is compiled in this
 * translation unit without XKNN_HAVE_MPI (its serial build) and with its main renamed,
 * so the static knn__parse() and knn__default_output() are called directly; no file is
 * touched. The bytes are split at NUL into argv[1..]. */
#define XKNN_IMPLEMENTATION
#define main knn_mpi_main_unused
#include "../../tools/knn_mpi.c"
#undef main
#include "../../tools/knn_predict.c" /* the parser checks the learning options with it */
#include "../../tools/npz.c"
#include "../../tools/outputs.c" /* the outputs are declared (and checked) by the parser */
#include "../../tools/progress.c"

#include "xknn/impl/backend.h"

#include "fuzz_stubs.h"
xknn_status xknn__cuda_search(const xknn__job *job) { (void)job; return XKNN_ERROR_INTERNAL; }
float xknn__canonical(xknn_metric metric, const float *a, const float *b, int64_t d)
{
    (void)metric; (void)a; (void)b; (void)d;
    return 0.0f;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    enum { MAX_ARGS = 24 };
    char *buf, *argv[MAX_ARGS + 2], msg[512];
    knn_opts o;
    int argc = 1, rc;
    size_t i, start = 0;
    if (size > 4096) return 0;
    buf = (char *)malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    argv[0] = (char *)"knn_mpi";
    for (i = 0; i <= size && argc <= MAX_ARGS; i++) {
        if (buf[i] == '\0') {
            argv[argc++] = buf + start;
            start = i + 1;
        }
    }
    argv[argc] = NULL;
    msg[0] = '\0';
    rc = knn__parse(argc, argv, &o, msg, sizeof msg);
    if (rc != 0 && rc != 1) abort();
    if (rc == 1 && !msg[0]) abort(); /* a usage error always says why */
    if (rc == 0 && !o.help && !o.version) {
        char *out;
        if (!o.ref || o.k < 1) abort();
        out = knn__default_output(o.ref, o.k);
        free(out);
    }
    free(buf);
    return 0;
}
