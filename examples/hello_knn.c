/* SPDX-License-Identifier: MIT */
/* hello_knn: the README example. Exact k nearest neighbours of a few queries on host
 * arrays, CPU or GPU (backend auto). Build: cc hello_knn.c $(pkg-config --cflags --libs xknn) */
#include <stdio.h>
#include <xknn.h>

int main(void)
{
    /* example-begin */
    float refs[6 * 2] = {0, 0, 1, 0, 0, 1, 1, 1, 2, 2, 0.5f, 0.5f}; /* n = 6 points, d = 2 */
    float queries[2 * 2] = {0.9f, 0.1f, 2, 1.9f};                    /* nq = 2 */
    int64_t ids[2 * 3];
    float dist[2 * 3];
    xknn_params p = XKNN_PARAMS_INIT; /* l2 = squared Euclidean, backend auto */
    xknn_matrix ref = XKNN_MATRIX_F32(refs, 6, 2), qry = XKNN_MATRIX_F32(queries, 2, 2);
    xknn_error err;
    if (xknn_search(&p, &ref, &qry, 3, ids, dist, &err) != XKNN_SUCCESS) {
        fprintf(stderr, "xknn: %s\n", err.message);
        return 1;
    }
    /* example-end */
    for (int i = 0; i < 2; i++) {
        printf("query %d:", i);
        for (int j = 0; j < 3; j++) printf("  id %lld (%.4g)", (long long)ids[i * 3 + j], (double)dist[i * 3 + j]);
        printf("\n");
    }
    return !(ids[0] == 1 && ids[1] == 5 && ids[3] == 4 && ids[4] == 3);
}
