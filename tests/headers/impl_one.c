/* SPDX-License-Identifier: MIT */
/* One translation unit that defines XKNN_IMPLEMENTATION itself and is linked with the
 * backends only (kernels/cpu and the CUDA stub, not libxknn): the header-only host code
 * must be complete, so this program links and answers a search. TAP. */
#define _POSIX_C_SOURCE 200809L
#define XKNN_IMPLEMENTATION
#include <xknn.h>
#include <xknn/io.h>

#include <stdio.h>
#include <string.h>

int main(void)
{
    const float refs[4 * 2] = {0, 0, 1, 0, 0, 1, 5, 5};
    const float qry[1 * 2] = {0.9f, 0.2f};
    int64_t ids[2];
    float dist[2];
    xknn_params p = XKNN_PARAMS_INIT;
    xknn_matrix ref = XKNN_MATRIX_F32(refs, 4, 2), q = XKNN_MATRIX_F32(qry, 1, 2);
    xknn_error err;
    xknn_status st;

    p.backend = XKNN_BACKEND_CPU;
    printf("1..3\n");
    st = xknn_search(&p, &ref, &q, 2, ids, dist, &err);
    printf("%s 1 - xknn_search from a self-implemented unit returns success%s%s\n",
           st == XKNN_SUCCESS ? "ok" : "not ok", st == XKNN_SUCCESS ? "" : ": ",
           st == XKNN_SUCCESS ? "" : err.message);
    printf("%s 2 - neighbours are ids 1 and 0\n", st == XKNN_SUCCESS && ids[0] == 1 && ids[1] == 0 ? "ok" : "not ok");
    printf("%s 3 - io implementation present (status string of format error)\n",
           strcmp(xknn_status_string(XKNN_ERROR_FORMAT), "format error") == 0 && xknn_file_format_name(XKNN_FORMAT_FBIN) ? "ok" : "not ok");
    return 0;
}
