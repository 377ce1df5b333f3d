/* SPDX-License-Identifier: MIT */
/*
 * xknn/learn.h -- learning on neighbour lists: classification by vote, regression by
 * mean, accuracy and confusion matrix. C99 host code; the implementation is compiled
 * behind XKNN_IMPLEMENTATION (libxknn does).
 *
 * WHAT IT DOES
 *   Takes the neighbour lists xknn_search() (or the distributed layer) returns -- ids
 *   and distances, nq x k, row-major, ordered by (distance, id) -- and the labels or
 *   targets of the references, and predicts one label or value per query. Results are
 *   deterministic: the same lists give the same bits on every machine.
 *
 * WHAT IT DOES NOT DO
 *   - No search of its own, no model state: every call is a pure function of its inputs.
 *   - No nq x C vote table: a query's votes are tallied in O(k) memory, whatever the
 *     number of classes C (labels may be any int32, not only 0..C-1).
 *
 * VOTE RULES (the same as scikit-learn's KNeighborsClassifier / KNeighborsRegressor)
 *   XKNN_VOTE_UNIFORM   every neighbour has weight 1.
 *   XKNN_VOTE_DISTANCE  neighbour j has weight 1 / e_j where e_j is its Euclidean
 *                       distance: e_j = sqrt((double)dist_j) for XKNN_METRIC_L2 (squared
 *                       Euclidean, so that the weights equal scikit-learn's
 *                       weights='distance' with its default Euclidean metric), and
 *                       e_j = (double)dist_j for every other metric. If any neighbour of
 *                       a query is at distance 0, only the neighbours at distance 0
 *                       vote, each with weight 1.
 *   Summation: weights are double; each class's weight is summed in neighbour order
 *   (j = 0, 1, ..., k-1) starting from 0.0. The predicted class is the one with the
 *   largest sum; equal sums go to the smallest label. Regression: the prediction is
 *   (sum_j w_j * (double)t_j) / (sum_j w_j), both sums in neighbour order in double,
 *   rounded once to float (uniform: the plain mean sum_j t_j / k).
 *
 * MEMORY AND ERRORS
 *   Every pointer is host memory. Every function is thread-safe and Not collective;
 *   they fill `err` (may be NULL) with one line naming the query, neighbour or row at
 *   fault and return the status. xknn_classify allocates O(k) bytes per call (freed
 *   before it returns); the others allocate nothing.
 */
#ifndef XKNN_LEARN_H
#define XKNN_LEARN_H

#include <stdint.h>

#include "../xknn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum xknn_vote {
    XKNN_VOTE_UNIFORM = 0, /* weight 1 per neighbour (default)                       */
    XKNN_VOTE_DISTANCE,    /* weight 1/Euclidean distance; zero distances win alone  */
    XKNN_VOTE_COUNT
} xknn_vote;

/* "uniform", "distance" ("unknown" out of range); parse: XKNN_VOTE_COUNT if unknown. */
XKNN_API const char *xknn_vote_name(xknn_vote vote);
XKNN_API xknn_vote xknn_vote_from_name(const char *name);

/*
 * Not collective. Majority (or distance-weighted) vote of each query's k neighbours.
 *   nq, k    queries and neighbours per query (nq >= 0, k >= 1)
 *   ids      nq x k int64 reference ids, row-major (ld = k); each in [0, n)
 *   dist     nq x k float distances as returned by the search under `metric`, row-major;
 *            may be NULL for XKNN_VOTE_UNIFORM. Must be >= 0 and not NaN.
 *   labels   n int32 labels of the references (any values)
 *   pred     nq int32 predicted labels (output)
 * Errors: INVALID_ARGUMENT (NULL pointer, k < 1, unknown vote/metric, id out of range,
 * negative or NaN distance), OUT_OF_MEMORY.
 */
XKNN_API xknn_status xknn_classify(int64_t nq, int64_t k, const int64_t *ids, const float *dist,
                                   xknn_metric metric, xknn_vote vote, const int32_t *labels, int64_t n,
                                   int32_t *pred, xknn_error *err);

/*
 * Not collective. Mean (uniform) or distance-weighted mean of each query's neighbours'
 * targets (float, n of them, finite). Same arguments and errors as xknn_classify, with
 * targets/pred float; allocates nothing.
 */
XKNN_API xknn_status xknn_regress(int64_t nq, int64_t k, const int64_t *ids, const float *dist,
                                  xknn_metric metric, xknn_vote vote, const float *targets, int64_t n, float *pred,
                                  xknn_error *err);

/* Not collective. Number of i in [0, nq) with pred[i] == truth[i] (to *correct, may be
 * NULL) and that number / nq (to *accuracy, may be NULL; 0 when nq = 0). */
XKNN_API xknn_status xknn_accuracy(int64_t nq, const int32_t *pred, const int32_t *truth, int64_t *correct,
                                   double *accuracy, xknn_error *err);

/* Not collective. The sorted distinct values of labels[0, n) into classes (room for n
 * values), their number to *nclasses. O(n log n) time, sorts in place in `classes`. */
XKNN_API xknn_status xknn_label_classes(int64_t n, const int32_t *labels, int32_t *classes, int64_t *nclasses,
                                        xknn_error *err);

/*
 * Not collective. Confusion matrix: matrix[a * nclasses + b] += number of queries whose
 * true label is classes[a] and predicted label is classes[b] (the matrix is added to:
 * zero it first; adding lets partial counts be summed). classes: nclasses sorted
 * distinct labels (xknn_label_classes of the union of true and predicted labels).
 * Errors: INVALID_ARGUMENT (NULL pointer, classes not sorted/distinct, a label not in
 * classes: names the query); on error the matrix is left untouched.
 */
XKNN_API xknn_status xknn_confusion(int64_t nq, const int32_t *truth, const int32_t *pred, int64_t nclasses,
                                    const int32_t *classes, int64_t *matrix, xknn_error *err);


/*
 * Not collective. Wilson's edited nearest neighbour: point i is removed when its label
 * differs from the uniform vote (rules above) of its k nearest other points (itself
 * excluded, duplicates of it at other ids included); every decision is taken on the
 * whole original set. Searches with xknn_search(params) (backend auto: the GPU when
 * present) in blocks of queries, self-join.
 *   ref     n x d host matrix; labels: n int32
 *   keep    n bytes (output): 1 kept, 0 removed; *kept (may be NULL): how many kept
 * Memory: O(query block * k) besides the search's. Errors: those of xknn_search
 * (k must be <= n - 1), INVALID_ARGUMENT, OUT_OF_MEMORY.
 */
XKNN_API xknn_status xknn_edit(const xknn_params *params, const xknn_matrix *ref, const int32_t *labels, int64_t k,
                               unsigned char *keep, int64_t *kept, xknn_error *err);

/*
 * Not collective. Hart's condensed nearest neighbour, generalised to k: the store S
 * starts as {point 0}; a pass visits the points not in S in ascending id order, and
 * adds point i to S when the uniform vote of its min(k, |S|) nearest points in S (order
 * (distance, id), as the search reports them) differs from label i; passes repeat
 * until one adds nothing. The result equals that sequential definition exactly, but
 * is computed in batches: a batch of consecutive unabsorbed points is searched against
 * the store as it was before the batch, then resolved in id order, each point's
 * neighbour list merged with the canonical distances (xknn_distance) to the points
 * added earlier in the same batch.
 *   batch   points per batch; 0: automatic (between 256 and 4096, growing with |S|)
 *   keep    n bytes (output): 1 in the condensed set, 0 absorbed; *kept, *passes (may
 *           be NULL): its size and the number of passes (the last one adds nothing)
 * Memory: a copy of the store (up to n x d floats) and O(batch * (k + batch)) besides
 * the search's. Errors: those of xknn_search, INVALID_ARGUMENT, OUT_OF_MEMORY.
 */
XKNN_API xknn_status xknn_condense(const xknn_params *params, const xknn_matrix *ref, const int32_t *labels,
                                   int64_t k, int64_t batch, unsigned char *keep, int64_t *kept, int64_t *passes,
                                   xknn_error *err);

#ifdef __cplusplus
}
#endif

#endif /* XKNN_LEARN_H */

/* ===================================================================================== */
/*                                  IMPLEMENTATION                                       */
/* ===================================================================================== */
#ifdef XKNN_IMPLEMENTATION
#ifndef XKNN__LEARN_IMPLEMENTATION_DONE
#define XKNN__LEARN_IMPLEMENTATION_DONE

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "impl/backend.h" /* xknn__fail, xknn__keyed */

#ifdef __cplusplus
extern "C" {
#endif

static const char *const xknn__vote_names[XKNN_VOTE_COUNT] = {"uniform", "distance"};

const char *xknn_vote_name(xknn_vote vote)
{
    if ((int)vote < 0 || vote >= XKNN_VOTE_COUNT) return "unknown";
    return xknn__vote_names[vote];
}

xknn_vote xknn_vote_from_name(const char *name)
{
    static const xknn__alias none[] = {{NULL, 0}};
    return (xknn_vote)xknn__from_name(name, xknn__vote_names, (int)XKNN_VOTE_COUNT, none);
}

static void xknn__learn_ok(xknn_error *err)
{
    if (err) {
        err->status = XKNN_SUCCESS;
        err->message[0] = '\0';
    }
}

/* Checks shared by classify and regress. */
static xknn_status xknn__learn_check(int64_t nq, int64_t k, const int64_t *ids, const float *dist,
                                     xknn_metric metric, xknn_vote vote, const void *values, int64_t n,
                                     const void *pred, xknn_error *err)
{
    int64_t i;
    if (nq < 0) return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "nq=%lld: need nq >= 0", (long long)nq);
    if (k < 1) return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "k=%lld: need k >= 1", (long long)k);
    if (n < 1) return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "n=%lld: need at least one reference", (long long)n);
    if ((int)vote < 0 || vote >= XKNN_VOTE_COUNT)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "unknown vote %d", (int)vote);
    if ((int)metric < 0 || metric >= XKNN_METRIC_COUNT)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "unknown metric %d", (int)metric);
    if (nq == 0) return XKNN_SUCCESS;
    if (!ids || !values || !pred || (vote == XKNN_VOTE_DISTANCE && !dist))
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "%s is NULL",
                          !ids ? "ids" : !values ? "labels/targets" : !pred ? "pred" : "dist (needed by the distance vote)");
    for (i = 0; i < nq * k; i++) {
        if (ids[i] < 0 || ids[i] >= n)
            return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                              "query %lld neighbour %lld has id %lld, outside the %lld references with labels",
                              (long long)(i / k), (long long)(i % k), (long long)ids[i], (long long)n);
        if (dist && !(dist[i] >= 0.0f))
            return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "query %lld neighbour %lld has distance %g (need >= 0)",
                              (long long)(i / k), (long long)(i % k), (double)dist[i]);
    }
    return XKNN_SUCCESS;
}

/* Weights of one query's k neighbours (see VOTE RULES). */
static void xknn__learn_weights(int64_t k, const float *dist, xknn_metric metric, xknn_vote vote, double *w)
{
    int64_t j;
    int zero = 0;
    if (vote == XKNN_VOTE_UNIFORM) {
        for (j = 0; j < k; j++) w[j] = 1.0;
        return;
    }
    for (j = 0; j < k; j++) zero |= dist[j] == 0.0f;
    for (j = 0; j < k; j++) {
        if (zero)
            w[j] = dist[j] == 0.0f ? 1.0 : 0.0;
        else
            w[j] = 1.0 / (metric == XKNN_METRIC_L2 ? sqrt((double)dist[j]) : (double)dist[j]);
    }
}

typedef struct xknn__vote_item {
    int32_t label;
    int64_t pos; /* neighbour index: keeps the summation in neighbour order */
} xknn__vote_item;

static int xknn__vote_cmp(const void *a, const void *b)
{
    const xknn__vote_item *x = (const xknn__vote_item *)a, *y = (const xknn__vote_item *)b;
    if (x->label != y->label) return x->label < y->label ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

xknn_status xknn_classify(int64_t nq, int64_t k, const int64_t *ids, const float *dist, xknn_metric metric,
                          xknn_vote vote, const int32_t *labels, int64_t n, int32_t *pred, xknn_error *err)
{
    xknn__vote_item *items;
    double *w;
    int64_t i, j;
    xknn_status st;

    xknn__learn_ok(err);
    if ((st = xknn__learn_check(nq, k, ids, dist, metric, vote, labels, n, pred, err)) != XKNN_SUCCESS) return st;
    if (nq == 0) return XKNN_SUCCESS;
    if ((uint64_t)k > SIZE_MAX / (sizeof *items + sizeof *w))
        return xknn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "k=%lld neighbours do not fit in memory", (long long)k);
    items = (xknn__vote_item *)malloc((size_t)k * sizeof *items);
    w = (double *)malloc((size_t)k * sizeof *w);
    if (!items || !w) {
        free(items);
        free(w);
        return xknn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "cannot allocate the vote of k=%lld neighbours", (long long)k);
    }
    for (i = 0; i < nq; i++) {
        const int64_t *row = ids + i * k;
        double best = -1.0;
        int32_t best_label = 0;
        xknn__learn_weights(k, dist ? dist + i * k : NULL, metric, vote, w);
        for (j = 0; j < k; j++) {
            items[j].label = labels[row[j]];
            items[j].pos = j;
        }
        /* grouped by label, neighbour order inside a group; scanned in ascending label
         * order, so a strict '>' keeps the smallest label on equal sums */
        qsort(items, (size_t)k, sizeof *items, xknn__vote_cmp);
        for (j = 0; j < k;) {
            const int32_t lab = items[j].label;
            double s = 0.0;
            for (; j < k && items[j].label == lab; j++) s += w[items[j].pos];
            if (s > best) {
                best = s;
                best_label = lab;
            }
        }
        pred[i] = best_label;
    }
    free(w);
    free(items);
    return XKNN_SUCCESS;
}

xknn_status xknn_regress(int64_t nq, int64_t k, const int64_t *ids, const float *dist, xknn_metric metric,
                         xknn_vote vote, const float *targets, int64_t n, float *pred, xknn_error *err)
{
    int64_t i, j;
    xknn_status st;

    xknn__learn_ok(err);
    if ((st = xknn__learn_check(nq, k, ids, dist, metric, vote, targets, n, pred, err)) != XKNN_SUCCESS) return st;
    for (i = 0; i < nq; i++) {
        const int64_t *row = ids + i * k;
        double num = 0.0, den = 0.0;
        if (vote == XKNN_VOTE_UNIFORM) {
            for (j = 0; j < k; j++) num += (double)targets[row[j]];
            den = (double)k;
        } else {
            const float *d = dist + i * k;
            int zero = 0;
            for (j = 0; j < k; j++) zero |= d[j] == 0.0f;
            for (j = 0; j < k; j++) {
                double w;
                if (zero)
                    w = d[j] == 0.0f ? 1.0 : 0.0;
                else
                    w = 1.0 / (metric == XKNN_METRIC_L2 ? sqrt((double)d[j]) : (double)d[j]);
                num += w * (double)targets[row[j]];
                den += w;
            }
        }
        pred[i] = (float)(num / den);
        if (!isfinite(pred[i]))
            return xknn__fail(err, XKNN_ERROR_INVALID_VALUE,
                              "query %lld: the weighted mean of its neighbours' targets is not finite (a target is "
                              "NaN/Inf, or the sum overflows float)",
                              (long long)i);
    }
    return XKNN_SUCCESS;
}

xknn_status xknn_accuracy(int64_t nq, const int32_t *pred, const int32_t *truth, int64_t *correct, double *accuracy,
                          xknn_error *err)
{
    int64_t i, c = 0;
    xknn__learn_ok(err);
    if (nq < 0) return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "nq=%lld: need nq >= 0", (long long)nq);
    if (nq > 0 && (!pred || !truth))
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "%s is NULL", pred ? "truth" : "pred");
    for (i = 0; i < nq; i++) c += pred[i] == truth[i];
    if (correct) *correct = c;
    if (accuracy) *accuracy = nq > 0 ? (double)c / (double)nq : 0.0;
    return XKNN_SUCCESS;
}

static int xknn__i32_cmp(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

xknn_status xknn_label_classes(int64_t n, const int32_t *labels, int32_t *classes, int64_t *nclasses,
                               xknn_error *err)
{
    int64_t i, m = 0;
    xknn__learn_ok(err);
    if (n < 0 || !nclasses || (n > 0 && (!labels || !classes)))
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "xknn_label_classes: n < 0 or a NULL pointer");
    if (n > 0) {
        memmove(classes, labels, (size_t)n * sizeof *classes);
        qsort(classes, (size_t)n, sizeof *classes, xknn__i32_cmp);
        for (i = 0; i < n; i++)
            if (i == 0 || classes[i] != classes[m - 1]) classes[m++] = classes[i];
    }
    *nclasses = m;
    return XKNN_SUCCESS;
}

/* Index of v in the sorted classes, or -1. */
static int64_t xknn__class_index(const int32_t *classes, int64_t nclasses, int32_t v)
{
    int64_t lo = 0, hi = nclasses;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (classes[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < nclasses && classes[lo] == v ? lo : -1;
}

xknn_status xknn_confusion(int64_t nq, const int32_t *truth, const int32_t *pred, int64_t nclasses,
                           const int32_t *classes, int64_t *matrix, xknn_error *err)
{
    int64_t i;
    xknn__learn_ok(err);
    if (nq < 0 || nclasses < 1 || !classes || !matrix || (nq > 0 && (!truth || !pred)))
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                          "xknn_confusion: nq < 0, nclasses < 1 or a NULL pointer");
    for (i = 1; i < nclasses; i++)
        if (classes[i - 1] >= classes[i])
            return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                              "xknn_confusion: classes are not sorted and distinct (classes[%lld] = %ld, classes[%lld] "
                              "= %ld)",
                              (long long)(i - 1), (long)classes[i - 1], (long long)i, (long)classes[i]);
    for (i = 0; i < nq; i++) { /* check every label first: on error matrix is untouched */
        const int64_t a = xknn__class_index(classes, nclasses, truth[i]);
        const int64_t b = xknn__class_index(classes, nclasses, pred[i]);
        if (a < 0 || b < 0)
            return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                              "xknn_confusion: query %lld has %s label %ld, not in classes", (long long)i,
                              a < 0 ? "true" : "predicted", (long)(a < 0 ? truth[i] : pred[i]));
    }
    for (i = 0; i < nq; i++)
        matrix[xknn__class_index(classes, nclasses, truth[i]) * nclasses +
               xknn__class_index(classes, nclasses, pred[i])] += 1;
    return XKNN_SUCCESS;
}


/* ---- editing and condensing -------------------------------------------------------- */

static xknn_status xknn__prune_check(const xknn_matrix *ref, const int32_t *labels, int64_t k,
                                     const unsigned char *keep, xknn_error *err)
{
    if (!ref || !ref->data || !labels || !keep)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "ref, its data, labels or keep is NULL");
    if (ref->dtype != XKNN_DTYPE_F32 || ref->rows < 1 || ref->cols < 1 || (ref->ld && ref->ld < ref->cols))
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "ref: need a float32 matrix with n >= 1 and d >= 1");
    if (k < 1) return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "k=%lld: need k >= 1", (long long)k);
    return XKNN_SUCCESS;
}

xknn_status xknn_edit(const xknn_params *params, const xknn_matrix *ref, const int32_t *labels, int64_t k,
                      unsigned char *keep, int64_t *kept, xknn_error *err)
{
    xknn_params p = params ? *params : xknn_params_default();
    const int64_t n = ref ? ref->rows : 0, blk = 16384;
    int64_t *ids = NULL, q0, i, nk = 0;
    int32_t *pred = NULL;
    xknn_status st;

    xknn__learn_ok(err);
    if ((st = xknn__prune_check(ref, labels, k, keep, err)) != XKNN_SUCCESS) return st;
    if (k > n - 1)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                          "k=%lld is larger than n-1=%lld (each point's own id is excluded)", (long long)k,
                          (long long)(n - 1));
    ids = (int64_t *)malloc((size_t)(blk * k) * sizeof *ids);
    pred = (int32_t *)malloc((size_t)blk * sizeof *pred);
    if (!ids || !pred) {
        st = xknn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "cannot allocate %lld x %lld neighbour ids", (long long)blk,
                        (long long)k);
        goto done;
    }
    p.exclude_self = 1;
    p.ref_id_offset = 0;
    for (q0 = 0; q0 < n; q0 += blk) {
        const int64_t c = n - q0 < blk ? n - q0 : blk;
        const int64_t ld = ref->ld ? ref->ld : ref->cols;
        xknn_matrix q = XKNN_MATRIX_F32((const float *)ref->data + q0 * ld, c, ref->cols);
        q.ld = ld;
        p.query_id_offset = q0;
        if ((st = xknn_search(&p, ref, &q, k, ids, NULL, err)) != XKNN_SUCCESS) goto done;
        if ((st = xknn_classify(c, k, ids, NULL, p.metric, XKNN_VOTE_UNIFORM, labels, n, pred, err)) !=
            XKNN_SUCCESS)
            goto done;
        for (i = 0; i < c; i++) {
            keep[q0 + i] = pred[i] == labels[q0 + i];
            nk += keep[q0 + i];
        }
    }
    if (kept) *kept = nk;
done:
    free(pred);
    free(ids);
    return st;
}

xknn_status xknn_condense(const xknn_params *params, const xknn_matrix *ref, const int32_t *labels, int64_t k,
                          int64_t batch, unsigned char *keep, int64_t *kept, int64_t *passes, xknn_error *err)
{
    xknn_params p = params ? *params : xknn_params_default();
    const int64_t n = ref ? ref->rows : 0, d = ref ? ref->cols : 0;
    const int64_t ld = ref ? (ref->ld ? ref->ld : ref->cols) : 0;
    const float *x = ref ? (const float *)ref->data : NULL;
    float *store = NULL, *qbuf = NULL, *sdist = NULL;
    int64_t *store_id = NULL, *sids = NULL, *cand_ids = NULL, *added = NULL, *todo = NULL;
    xknn__keyed *cand = NULL; /* (distance, id) */
    int64_t ns = 0, npass = 0, bmax, i, j;
    int changed = 1, dirty = 1;
    xknn_status st = XKNN_SUCCESS;

    xknn__learn_ok(err);
    if ((st = xknn__prune_check(ref, labels, k, keep, err)) != XKNN_SUCCESS) return st;
    if (batch < 0) return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "batch=%lld: need batch >= 0", (long long)batch);
    bmax = batch > 0 ? batch : 4096;
    if (bmax > n) bmax = n;
    if ((uint64_t)n > SIZE_MAX / sizeof(float) / (uint64_t)d)
        return xknn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "n x d = %lld x %lld does not fit in memory", (long long)n,
                          (long long)d);
    store = (float *)malloc((size_t)(n * d) * sizeof *store);
    store_id = (int64_t *)malloc((size_t)n * sizeof *store_id);
    todo = (int64_t *)malloc((size_t)n * sizeof *todo);
    qbuf = (float *)malloc((size_t)(bmax * d) * sizeof *qbuf);
    sids = (int64_t *)malloc((size_t)(bmax * k) * sizeof *sids);
    sdist = (float *)malloc((size_t)(bmax * k) * sizeof *sdist);
    added = (int64_t *)malloc((size_t)bmax * sizeof *added);
    cand = (xknn__keyed *)malloc((size_t)(k + bmax) * sizeof *cand);
    cand_ids = (int64_t *)malloc((size_t)k * sizeof *cand_ids);
    if (!store || !store_id || !todo || !qbuf || !sids || !sdist || !added || !cand || !cand_ids) {
        st = xknn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "cannot allocate the store of %lld x %lld floats",
                        (long long)n, (long long)d);
        goto done;
    }
    memset(keep, 0, (size_t)n);
    keep[0] = 1;
    p.exclude_self = 0;
    p.pad_missing = 0;
    p.ref_id_offset = 0;
    p.query_id_offset = 0;

    while (changed) {
        int64_t ntodo = 0, t0;
        changed = 0;
        npass++;
        for (i = 0; i < n; i++)
            if (!keep[i]) todo[ntodo++] = i;
        for (t0 = 0; t0 < ntodo;) {
            int64_t b, kk, na = 0;
            xknn_matrix sm, qm;
            /* the store in ascending id order (row order = id order keeps the search's
             * ties by id), rebuilt when the previous batch added points */
            if (dirty) {
                ns = 0;
                for (i = 0; i < n; i++)
                    if (keep[i]) {
                        memcpy(store + ns * d, x + i * ld, (size_t)d * sizeof *store);
                        store_id[ns++] = i;
                    }
                dirty = 0;
            }
            b = batch > 0 ? batch : (ns < 256 ? 256 : ns > 4096 ? 4096 : ns);
            if (b > bmax) b = bmax;
            if (b > ntodo - t0) b = ntodo - t0;
            kk = k < ns ? k : ns;
            for (i = 0; i < b; i++) memcpy(qbuf + i * d, x + todo[t0 + i] * ld, (size_t)d * sizeof *qbuf);
            memset(&sm, 0, sizeof sm);
            sm.data = store;
            sm.rows = ns;
            sm.cols = d;
            qm = sm;
            qm.data = qbuf;
            qm.rows = b;
            if ((st = xknn_search(&p, &sm, &qm, kk, sids, sdist, err)) != XKNN_SUCCESS) goto done;
            for (i = 0; i < b; i++) {
                const int64_t id = todo[t0 + i];
                int64_t nc = 0, m;
                int32_t pred = 0;
                for (j = 0; j < kk; j++) {
                    cand[nc].key = sdist[i * kk + j];
                    cand[nc++].id = store_id[sids[i * kk + j]];
                }
                for (j = 0; j < na; j++) {
                    cand[nc].key = xknn_distance(p.metric, x + id * ld, x + added[j] * ld, d);
                    cand[nc++].id = added[j];
                }
                if (na > 0) qsort(cand, (size_t)nc, sizeof *cand, xknn__keyed_cmp);
                m = nc < k ? nc : k;
                for (j = 0; j < m; j++) cand_ids[j] = cand[j].id;
                if ((st = xknn_classify(1, m, cand_ids, NULL, p.metric, XKNN_VOTE_UNIFORM, labels, n, &pred, err)) !=
                    XKNN_SUCCESS)
                    goto done;
                if (pred != labels[id]) {
                    keep[id] = 1;
                    added[na++] = id;
                    changed = dirty = 1;
                }
            }
            t0 += b;
        }
    }
    ns = 0;
    for (i = 0; i < n; i++) ns += keep[i];
    if (kept) *kept = ns;
    if (passes) *passes = npass;
done:
    free(cand_ids);
    free(cand);
    free(added);
    free(sdist);
    free(sids);
    free(qbuf);
    free(todo);
    free(store_id);
    free(store);
    return st;
}

#ifdef __cplusplus
}
#endif

#endif /* XKNN__LEARN_IMPLEMENTATION_DONE */
#endif /* XKNN_IMPLEMENTATION */
