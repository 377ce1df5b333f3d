/* SPDX-License-Identifier: MIT */
/* consumer: the 3 nearest neighbours of one query among 5 points, through the installed
 * or subproject xknn. Exit 0 when the answer is right; prints the xknn version used. */
#include <stdio.h>
#include <xknn.h>

int main(void)
{
    const float refs[5 * 3] = {0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 1, 1, 0};
    const float qry[1 * 3] = {0.9f, 0.2f, 0};
    int64_t ids[3];
    float dist[3];
    xknn_params p = XKNN_PARAMS_INIT;
    xknn_matrix ref = XKNN_MATRIX_F32(refs, 5, 3), q = XKNN_MATRIX_F32(qry, 1, 3);
    xknn_error err;

    p.backend = XKNN_BACKEND_CPU;
    if (xknn_search(&p, &ref, &q, 3, ids, dist, &err) != XKNN_SUCCESS) {
        fprintf(stderr, "consumer: xknn: %s\n", err.message);
        return 1;
    }
    printf("consumer: xknn %s: ids %lld %lld %lld\n", XKNN_VERSION_STRING, (long long)ids[0],
           (long long)ids[1], (long long)ids[2]);
    return !(ids[0] == 1 && ids[1] == 4 && ids[2] == 0 && dist[0] == xknn_distance(XKNN_METRIC_L2, qry, refs + 3, 3));
}
