/* SPDX-License-Identifier: MIT */
/* learn-t: votes, regression, accuracy and confusion (include/xknn/learn.h) on hand-made
 * cases and against a naive tally; the label/target readers; iris against scikit-learn;
 * condensing and editing against naive sequential definitions.
 * Argument: the path of tests/data/iris.csv. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ref/ref.h"
#include "tap/tap.h"
#include "xknn.h"
#include "xknn/io.h"
#include "xknn/learn.h"

/* ---- hand-made votes ------------------------------------------------------------- */

/* The ids of k <= 16 hand-written neighbours: 0..k-1. */
static const int64_t hand_ids[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

/* A diagnostic line where a call failed. */
static void diag_failure(xknn_status st, const char *what, const xknn_error *err)
{
    if (st != XKNN_SUCCESS) diag("%s: %s", what, err->message);
}

/* One query's vote over k hand-written neighbours (ids 0..k-1 carry labels lab). */
static int32_t vote1(int64_t k, const int32_t *lab, const float *dist, xknn_metric metric, xknn_vote vote)
{
    int32_t pred = -12345;
    xknn_error err;
    diag_failure(xknn_classify(1, k, hand_ids, dist, metric, vote, lab, k, &pred, &err), "xknn_classify", &err);
    return pred;
}

static float regress1(int64_t k, const float *t, const float *dist, xknn_metric metric, xknn_vote vote)
{
    float pred = -12345.0f;
    xknn_error err;
    diag_failure(xknn_regress(1, k, hand_ids, dist, metric, vote, t, k, &pred, &err), "xknn_regress", &err);
    return pred;
}

/* One hand-made vote: k neighbours (ids 0..k-1) with labels lab at distances d (dist
 * NULL where nodist), and the label it must give. */
typedef struct {
    int64_t k;
    int32_t lab[4];
    float d[4];
    int nodist;
    xknn_metric metric;
    xknn_vote vote;
    int32_t want;
    const char *what;
} vote_case;

#define E_ XKNN_METRIC_EUCLIDEAN
#define L_ XKNN_METRIC_L2
#define U_ XKNN_VOTE_UNIFORM
#define D_ XKNN_VOTE_DISTANCE
static const vote_case vote_cases[] = {
    {4, {7, 3, 7, 3}, {1, 2, 3, 4}, 0, E_, U_, 3, "uniform: a 2-2 tie between classes goes to the smallest label"},
    {4, {7, 3, 7, 3}, {0}, 1, E_, U_, 3, "uniform: dist may be NULL"},
    {3, {5, 2, 5}, {0}, 1, E_, U_, 5, "uniform: majority"},
    {3, {1, 0, 0}, {1, 2, 2}, 0, E_, D_, 0, "distance: equal weight sums (1 vs 1/2 + 1/2) go to the smallest label"},
    {3, {1, 0, 0}, {1, 4, 4}, 0, L_, D_, 0, "distance with l2: weights 1/sqrt(l2), the same tie"},
    {3, {2, 1, 1}, {1, 3, 3}, 0, E_, U_, 1, "uniform: 2 votes beat 1"},
    {3, {2, 1, 1}, {1, 3, 3}, 0, E_, D_, 2, "distance: 1/1 beats 1/3 + 1/3"},
    {3, {2, 1, 1}, {1, 9, 9}, 0, L_, D_, 2, "distance with l2: 1/sqrt(1) beats 2/sqrt(9)"},
    {3, {2, 1, 1}, {4, 9, 9}, 0, L_, D_, 1, "distance with l2 = {4, 9, 9}: 1/2 < 1/3 + 1/3 (Euclidean weights)"},
    {3, {2, 1, 1}, {4, 9, 9}, 0, E_, D_, 2, "the same values as euclidean: 1/4 > 1/9 + 1/9"},
    {3, {9, 4, 4}, {0, 0.5f, 0.5f}, 0, E_, D_, 9, "distance: a neighbour at distance 0 votes alone"},
    {3, {9, 4, 4}, {0, 0, 0.1f}, 0, E_, D_, 4,
     "distance: zero-distance neighbours vote with weight 1 each, tie -> smallest"},
    {3, {9, 4, 4}, {0, 0.5f, 0.5f}, 0, L_, D_, 9, "distance with l2: the same zero rule"},
    {3, {INT32_MIN, INT32_MAX, INT32_MAX}, {0}, 1, E_, U_, INT32_MAX, "labels need not be dense: INT32_MAX wins 2-1"},
    {2, {INT32_MAX, INT32_MIN}, {0}, 1, E_, U_, INT32_MIN, "a 1-1 tie between INT32_MAX and INT32_MIN -> INT32_MIN"},
};
#undef E_
#undef L_
#undef U_
#undef D_

static void test_votes(void)
{
    const xknn_metric E = XKNN_METRIC_EUCLIDEAN, L = XKNN_METRIC_L2;
    const xknn_vote U = XKNN_VOTE_UNIFORM, D = XKNN_VOTE_DISTANCE;
    size_t i;
    for (i = 0; i < sizeof vote_cases / sizeof vote_cases[0]; i++) {
        const vote_case *c = &vote_cases[i];
        is_int(vote1(c->k, c->lab, c->nodist ? NULL : c->d, c->metric, c->vote), c->want, "%s", c->what);
    }
    {
        const float t[3] = {1, 2, 4}, d[3] = {1, 2, 4}, dl[3] = {1, 4, 16}, dz[3] = {0, 0, 1};
        const float t2[3] = {5, 6, 100};
        ok(regress1(3, t, d, E, U) == (float)(7.0 / 3.0), "regression: uniform mean (double, rounded once)");
        ok(regress1(3, t, d, E, D) == (float)(3.0 / 1.75), "regression: distance-weighted mean 3 / 1.75");
        ok(regress1(3, t, dl, L, D) == (float)(3.0 / 1.75), "regression with l2: weights 1/sqrt(l2)");
        ok(regress1(3, t2, dz, E, D) == 5.5f, "regression: zero distances only (mean of 5 and 6)");
    }
}

static void test_errors(void)
{
    const int64_t ids[2] = {0, 5};
    const float d[2] = {1, -1}, dn[2] = {1, NAN};
    const int32_t lab[3] = {1, 2, 3};
    int32_t pred[1];
    xknn_error err;
    xknn_status st;
    st = xknn_classify(1, 2, ids, d, XKNN_METRIC_L2, XKNN_VOTE_UNIFORM, lab, 3, pred, &err);
    ok(st == XKNN_ERROR_INVALID_ARGUMENT && strstr(err.message, "id 5"), "id outside the labels: %s", err.message);
    {
        const int64_t ids2[2] = {0, 1};
        st = xknn_classify(1, 2, ids2, d, XKNN_METRIC_L2, XKNN_VOTE_DISTANCE, lab, 3, pred, &err);
        ok(st == XKNN_ERROR_INVALID_ARGUMENT && strstr(err.message, "distance"), "negative distance: %s", err.message);
        st = xknn_classify(1, 2, ids2, dn, XKNN_METRIC_L2, XKNN_VOTE_DISTANCE, lab, 3, pred, &err);
        ok(st == XKNN_ERROR_INVALID_ARGUMENT, "NaN distance: %s", err.message);
        st = xknn_classify(1, 2, ids2, NULL, XKNN_METRIC_L2, XKNN_VOTE_DISTANCE, lab, 3, pred, &err);
        ok(st == XKNN_ERROR_INVALID_ARGUMENT && strstr(err.message, "dist"), "distance vote without dist: %s",
           err.message);
        st = xknn_classify(1, 0, ids2, NULL, XKNN_METRIC_L2, XKNN_VOTE_UNIFORM, lab, 3, pred, &err);
        ok(st == XKNN_ERROR_INVALID_ARGUMENT && strstr(err.message, "k=0"), "k = 0: %s", err.message);
        st = xknn_classify(1, 2, ids2, NULL, XKNN_METRIC_L2, (xknn_vote)7, lab, 3, pred, &err);
        ok(st == XKNN_ERROR_INVALID_ARGUMENT && strstr(err.message, "vote"), "unknown vote: %s", err.message);
    }
    ok(xknn_vote_from_name("distance") == XKNN_VOTE_DISTANCE && xknn_vote_from_name("x") == XKNN_VOTE_COUNT &&
           !strcmp(xknn_vote_name(XKNN_VOTE_UNIFORM), "uniform"),
       "vote names");
}

static void test_accuracy_confusion(void)
{
    const int32_t truth[6] = {3, 3, -1, 7, 7, 7}, pred[6] = {3, -1, -1, 7, 3, 7};
    int32_t all[12], classes[12];
    int64_t correct = -1, nc = 0, m[9], i;
    double acc = -1;
    xknn_error err;
    xknn_status st;
    ok(xknn_accuracy(6, pred, truth, &correct, &acc, &err) == XKNN_SUCCESS && correct == 4 && acc == 4.0 / 6.0,
       "accuracy 4/6");
    memcpy(all, truth, sizeof truth);
    memcpy(all + 6, pred, sizeof pred);
    st = xknn_label_classes(12, all, classes, &nc, &err);
    ok(st == XKNN_SUCCESS && nc == 3 && classes[0] == -1 && classes[1] == 3 && classes[2] == 7,
       "classes of the union: -1 3 7");
    memset(m, 0, sizeof m);
    st = xknn_confusion(6, truth, pred, nc, classes, m, &err);
    {
        const int64_t want[9] = {1, 0, 0, 1, 1, 0, 0, 1, 2};
        int same = st == XKNN_SUCCESS;
        for (i = 0; i < 9; i++) same = same && m[i] == want[i];
        ok(same, "confusion matrix rows = true class, columns = predicted");
    }
    st = xknn_confusion(6, truth, pred, 2, classes, m, &err);
    ok(st == XKNN_ERROR_INVALID_ARGUMENT && strstr(err.message, "query 3"), "a label outside classes: %s",
       err.message);
}

/* ---- the vote against a naive tally on search results with ties ------------------ */

/* For each distinct label in order of first appearance, the sum of its weights in
 * neighbour order; best by (sum desc, label asc). O(k^2), independent of the library. */
static int32_t naive_vote(int64_t k, const int64_t *ids, const float *dist, const int32_t *labels, int l2,
                          int distance)
{
    int64_t j, a;
    int zero = 0;
    double best = -1;
    int32_t best_label = 0;
    for (j = 0; j < k; j++) zero |= distance && dist[j] == 0.0f;
    for (a = 0; a < k; a++) {
        const int32_t lab = labels[ids[a]];
        double s = 0;
        int seen = 0;
        for (j = 0; j < a; j++) seen |= labels[ids[j]] == lab;
        if (seen) continue;
        for (j = 0; j < k; j++) {
            double w;
            if (labels[ids[j]] != lab) continue;
            if (!distance)
                w = 1;
            else if (zero)
                w = dist[j] == 0.0f ? 1 : 0;
            else
                w = 1.0 / (l2 ? sqrt((double)dist[j]) : (double)dist[j]);
            s += w;
        }
        if (s > best || (s == best && lab < best_label)) {
            best = s;
            best_label = lab;
        }
    }
    return best_label;
}

static void test_against_naive(void)
{
    const int64_t n = 500, nq = 80, d = 3, k = 9;
    float *x = malloc((size_t)(n + nq) * d * sizeof(float));
    int64_t *ids = malloc((size_t)(nq * k) * sizeof(int64_t));
    float *dist = malloc((size_t)(nq * k) * sizeof(float));
    int32_t *labels = malloc((size_t)n * sizeof(int32_t)), pred[80];
    uint64_t s = 42;
    int metric, vote;
    int64_t i;
    xknn_params p = XKNN_PARAMS_INIT;
    xknn_error err;
    if (!x || !ids || !dist || !labels) bail("out of memory");
    ref_make_data(DATA_INTEGER, x, n + nq, d, 7); /* many equal distances and duplicates */
    for (i = 0; i < n; i++) labels[i] = (int32_t)(ref_rand_u64(&s) % 5) * 1000003 - 2000000;
    p.backend = XKNN_BACKEND_CPU;
    for (metric = 0; metric < 2; metric++) {
        xknn_matrix ref = XKNN_MATRIX_F32(x, n, d), q = XKNN_MATRIX_F32(x + n * d, nq, d);
        p.metric = metric ? XKNN_METRIC_EUCLIDEAN : XKNN_METRIC_L2;
        if (xknn_search(&p, &ref, &q, k, ids, dist, &err) != XKNN_SUCCESS) bail("xknn_search: %s", err.message);
        for (vote = 0; vote < 2; vote++) {
            int same = xknn_classify(nq, k, ids, dist, p.metric, (xknn_vote)vote, labels, n, pred, &err) ==
                       XKNN_SUCCESS;
            int64_t bad = -1;
            for (i = 0; same && i < nq; i++)
                if (pred[i] != naive_vote(k, ids + i * k, dist + i * k, labels, !metric, vote)) {
                    same = 0;
                    bad = i;
                }
            ok(same, "%s vote, %s: equal to the naive tally on %lld queries with ties%s", vote ? "distance" : "uniform",
               metric ? "euclidean" : "l2", (long long)nq, bad >= 0 ? " (first difference below)" : "");
            if (bad >= 0) diag("query %lld: xknn %ld", (long long)bad, (long)pred[bad]);
        }
    }
    free(x);
    free(ids);
    free(dist);
    free(labels);
}

/* ---- readers ---------------------------------------------------------------------- */

static char tdir[] = "/tmp/xknn-learn-t.XXXXXX";

static const char *tpath(const char *name)
{
    static char buf[4][256];
    static int slot;
    slot = (slot + 1) % 4;
    snprintf(buf[slot], sizeof buf[slot], "%s/%s", tdir, name);
    return buf[slot];
}

static void write_bytes(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b, 1, n, f) != n || fclose(f) != 0) bail("cannot write %s", path);
}

static void test_readers(void)
{
    int32_t *lab = NULL;
    float *t = NULL;
    int64_t n = -1;
    xknn_error err;
    xknn_status st;
    const char *txt = " 3\n-7 \n2147483647\n-2147483648\n0";
    write_bytes(tpath("l.txt"), txt, strlen(txt));
    st = xknn_labels_read(tpath("l.txt"), &n, &lab, &err);
    ok(st == XKNN_SUCCESS && n == 5 && lab[0] == 3 && lab[1] == -7 && lab[2] == INT32_MAX && lab[3] == INT32_MIN &&
           lab[4] == 0,
       "text labels (blanks, int32 extremes, no final newline)%s%s", st ? ": " : "", st ? err.message : "");
    free(lab);
    write_bytes(tpath("bad.txt"), "1\n2\nx\n", 6);
    st = xknn_labels_read(tpath("bad.txt"), &n, &lab, &err);
    ok(st == XKNN_ERROR_FORMAT && strstr(err.message, "line 3") && !lab, "a bad text line is named: %s", err.message);
    write_bytes(tpath("big.txt"), "1\n2147483648\n", 13);
    st = xknn_labels_read(tpath("big.txt"), &n, &lab, &err);
    ok(st == XKNN_ERROR_INVALID_VALUE && strstr(err.message, "line 2"), "a label beyond int32: %s", err.message);
    {
        /* .npy <i8 (NumPy's default integer), shape (3,) */
        unsigned char b[128 + 24];
        const char *h = "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }";
        const int64_t v[3] = {-5, 70000, 2147483647};
        size_t hl = 128 - 10, i;
        memset(b, ' ', 128);
        memcpy(b, "\x93NUMPY\x01\x00", 8);
        b[8] = (unsigned char)(hl & 0xff);
        b[9] = (unsigned char)(hl >> 8);
        memcpy(b + 10, h, strlen(h));
        b[127] = '\n';
        for (i = 0; i < 3; i++) {
            uint64_t u = (uint64_t)v[i];
            int j;
            for (j = 0; j < 8; j++) b[128 + 8 * i + (size_t)j] = (unsigned char)(u >> (8 * j));
        }
        write_bytes(tpath("l.npy"), b, sizeof b);
        st = xknn_labels_read(tpath("l.npy"), &n, &lab, &err);
        ok(st == XKNN_SUCCESS && n == 3 && lab[0] == -5 && lab[1] == 70000 && lab[2] == INT32_MAX,
           "npy <i8 labels%s%s", st ? ": " : "", st ? err.message : "");
        free(lab);
        st = xknn_targets_read(tpath("l.npy"), &n, &t, &err);
        ok(st == XKNN_ERROR_INVALID_VALUE, "targets refuse an int64 that float32 cannot hold: %s", err.message);
    }
    {
        /* IDX label file: 0 0 0x08 1, n = 4 big-endian, uint8 labels */
        const unsigned char b[12] = {0, 0, 8, 1, 0, 0, 0, 4, 9, 0, 255, 1};
        write_bytes(tpath("l-idx1-ubyte"), b, sizeof b);
        st = xknn_labels_read(tpath("l-idx1-ubyte"), &n, &lab, &err);
        ok(st == XKNN_SUCCESS && n == 4 && lab[0] == 9 && lab[2] == 255 && lab[3] == 1, "IDX uint8 labels%s%s",
           st ? ": " : "", st ? err.message : "");
        free(lab);
    }
    {
        /* .fbin with d = 2: not labels; .fbin d = 1 floats: not labels, fine as targets */
        const unsigned char b2[8 + 8] = {2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0x80, 0x3f, 0, 0, 0, 0x40};
        const unsigned char b1[8 + 8] = {2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0xc0, 0x3f, 0, 0, 0, 0x40};
        write_bytes(tpath("two.fbin"), b2, sizeof b2);
        write_bytes(tpath("one.fbin"), b1, sizeof b1);
        st = xknn_labels_read(tpath("one.fbin"), &n, &lab, &err);
        ok(st == XKNN_ERROR_FORMAT && strstr(err.message, "integers"), "float file as labels: %s", err.message);
        st = xknn_targets_read(tpath("one.fbin"), &n, &t, &err);
        ok(st == XKNN_SUCCESS && n == 2 && t[0] == 1.5f && t[1] == 2.0f, "fbin d=1 targets");
        free(t);
    }
    {
        const unsigned char b[8 + 8] = {1, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0};
        write_bytes(tpath("wide.ibin"), b, sizeof b);
        st = xknn_labels_read(tpath("wide.ibin"), &n, &lab, &err);
        ok(st == XKNN_ERROR_FORMAT && strstr(err.message, "2 values per row"), "two columns: %s", err.message);
    }
    write_bytes(tpath("t.csv"), "1.5\n-2e3\n", 9);
    st = xknn_targets_read(tpath("t.csv"), &n, &t, &err);
    ok(st == XKNN_SUCCESS && n == 2 && t[0] == 1.5f && t[1] == -2000.0f, "text targets");
    free(t);
    write_bytes(tpath("inf.txt"), "1\ninf\n", 6);
    st = xknn_targets_read(tpath("inf.txt"), &n, &t, &err);
    ok(st == XKNN_ERROR_INVALID_VALUE && strstr(err.message, "line 2"), "Inf target: %s", err.message);
}

/* ---- iris against scikit-learn ---------------------------------------------------- */

/* Output of tests/data/iris_expected.py (scikit-learn 1.9.1,
 * KNeighborsClassifier(algorithm='brute'), train = rows i % 3 != 0, test = i % 3 == 0):
 * correct test predictions out of 50. */
static const struct {
    int k;
    xknn_vote vote;
    int correct;
} iris_expected[] = {
    {1, XKNN_VOTE_UNIFORM, 49}, {1, XKNN_VOTE_DISTANCE, 49}, {5, XKNN_VOTE_UNIFORM, 48},
    {5, XKNN_VOTE_DISTANCE, 49}, {9, XKNN_VOTE_UNIFORM, 50}, {9, XKNN_VOTE_DISTANCE, 50},
};
#define IRIS_CASES (int)(sizeof iris_expected / sizeof iris_expected[0])

static void test_iris(const char *path)
{
    float x[150 * 4], train[100 * 4], test[50 * 4], dist[50 * 9];
    int32_t y[150], ytrain[100], ytest[50], pred[50];
    int64_t ids[50 * 9], ntr = 0, nte = 0, correct, i;
    char line[256];
    int rows = 0, c, metric;
    FILE *f = fopen(path, "r");
    xknn_params p = XKNN_PARAMS_INIT;
    xknn_error err;
    if (!f) bail("cannot open %s: %s", path, strerror(errno));
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        if (rows == 150 || sscanf(line, "%f,%f,%f,%f,%d", x + 4 * rows, x + 4 * rows + 1, x + 4 * rows + 2,
                                  x + 4 * rows + 3, &c) != 5)
            bail("%s: bad row %d", path, rows);
        y[rows++] = c;
    }
    fclose(f);
    if (rows != 150) bail("%s: %d rows, expected 150", path, rows);
    for (i = 0; i < 150; i++) {
        if (i % 3 == 0) {
            memcpy(test + 4 * nte, x + 4 * i, 4 * sizeof(float));
            ytest[nte++] = y[i];
        } else {
            memcpy(train + 4 * ntr, x + 4 * i, 4 * sizeof(float));
            ytrain[ntr++] = y[i];
        }
    }
    p.backend = XKNN_BACKEND_CPU;
    for (metric = 0; metric < 2; metric++) {
        xknn_matrix ref = XKNN_MATRIX_F32(train, ntr, 4), q = XKNN_MATRIX_F32(test, nte, 4);
        p.metric = metric ? XKNN_METRIC_EUCLIDEAN : XKNN_METRIC_L2;
        for (c = 0; c < IRIS_CASES; c++) {
            const int64_t k = iris_expected[c].k;
            xknn_status st = xknn_search(&p, &ref, &q, k, ids, dist, &err);
            if (st == XKNN_SUCCESS)
                st = xknn_classify(nte, k, ids, dist, p.metric, iris_expected[c].vote, ytrain, ntr, pred, &err);
            if (st == XKNN_SUCCESS) st = xknn_accuracy(nte, pred, ytest, &correct, NULL, &err);
            if (st != XKNN_SUCCESS) diag("%s", err.message);
            is_int(st == XKNN_SUCCESS ? correct : -1, iris_expected[c].correct,
                   "iris k=%lld %s %s: correct test predictions as scikit-learn", (long long)k,
                   xknn_vote_name(iris_expected[c].vote), xknn_metric_name(p.metric));
        }
    }
}


/* ---- condensing and editing against the naive sequential definitions --------------- */

/* Uniform vote of point i's k nearest among the points with mask[j] (j != i). */
static int32_t naive_knn_vote(const float *x, int64_t n, int64_t d, int metric, const int32_t *labels,
                              const unsigned char *mask, int64_t i, int64_t k, ref_pair *c, int64_t *ids)
{
    int64_t j, m = 0;
    for (j = 0; j < n; j++)
        if (j != i && mask[j]) {
            c[m].d = ref_distance(metric, x + i * d, x + j * d, d);
            c[m++].id = j;
        }
    qsort(c, (size_t)m, sizeof *c, ref_pair_cmp);
    if (m > k) m = k;
    for (j = 0; j < m; j++) ids[j] = c[j].id;
    return naive_vote(m, ids, NULL, labels, 0, 0);
}

static void naive_condense(const float *x, int64_t n, int64_t d, int metric, const int32_t *labels, int64_t k,
                           unsigned char *keep, int64_t *passes)
{
    ref_pair *c = malloc((size_t)n * sizeof *c);
    int64_t *ids = malloc((size_t)n * sizeof *ids), i;
    int changed = 1;
    if (!c || !ids) bail("out of memory");
    memset(keep, 0, (size_t)n);
    keep[0] = 1;
    *passes = 0;
    while (changed) {
        changed = 0;
        ++*passes;
        for (i = 0; i < n; i++)
            if (!keep[i] && naive_knn_vote(x, n, d, metric, labels, keep, i, k, c, ids) != labels[i]) {
                keep[i] = 1;
                changed = 1;
            }
    }
    free(c);
    free(ids);
}

static void naive_edit(const float *x, int64_t n, int64_t d, int metric, const int32_t *labels, int64_t k,
                       unsigned char *keep)
{
    ref_pair *c = malloc((size_t)n * sizeof *c);
    int64_t *ids = malloc((size_t)n * sizeof *ids), i;
    unsigned char *all = malloc((size_t)n);
    if (!c || !ids || !all) bail("out of memory");
    memset(all, 1, (size_t)n);
    for (i = 0; i < n; i++) keep[i] = naive_knn_vote(x, n, d, metric, labels, all, i, k, c, ids) == labels[i];
    free(all);
    free(c);
    free(ids);
}

static void test_prune(void)
{
    static const struct {
        data_kind kind;
        int64_t n, d, k, batch;
        int metric, classes;
    } cases[] = {
        {DATA_INTEGER, 300, 3, 1, 0, REF_L2, 3},    {DATA_INTEGER, 300, 3, 1, 7, REF_L2, 3},
        {DATA_INTEGER, 300, 3, 3, 1, REF_EUCLIDEAN, 4}, {DATA_DUPLICATES, 257, 5, 1, 16, REF_L2, 2},
        {DATA_DUPLICATES, 257, 5, 3, 0, REF_L2, 3}, {DATA_GAUSSIAN, 400, 8, 1, 33, REF_L2, 5},
        {DATA_CLUSTERED, 333, 16, 5, 64, REF_EUCLIDEAN, 3}, {DATA_UNIFORM, 2, 2, 1, 0, REF_L2, 2},
    };
    size_t c;
    for (c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t n = cases[c].n, d = cases[c].d, k = cases[c].k;
        float *x = malloc((size_t)(n * d) * sizeof(float));
        int32_t *labels = malloc((size_t)n * sizeof(int32_t));
        unsigned char *keep = malloc((size_t)n), *want = malloc((size_t)n);
        int64_t kept = -1, passes = -1, wpasses = 0, i, wkept = 0;
        uint64_t s = 1000 + c;
        xknn_params p = XKNN_PARAMS_INIT;
        xknn_matrix ref = XKNN_MATRIX_F32(NULL, n, d);
        xknn_error err;
        xknn_status st;
        int same;
        if (!x || !labels || !keep || !want) bail("out of memory");
        ref_make_data(cases[c].kind, x, n, d, 77 + c);
        /* labels follow the first coordinate (so condensing absorbs points), with 1/8 noise */
        for (i = 0; i < n; i++) {
            const int64_t cl = cases[c].classes, band = (int64_t)floor((double)x[i * d] * 2.0);
            const int64_t v = (ref_rand_u64(&s) % 8 == 0) ? (int64_t)(ref_rand_u64(&s) % (uint64_t)cl)
                                                          : ((band % cl) + cl) % cl;
            labels[i] = (int32_t)v * 10 - 5;
        }
        ref.data = x;
        p.backend = XKNN_BACKEND_CPU;
        p.metric = cases[c].metric == REF_L2 ? XKNN_METRIC_L2 : XKNN_METRIC_EUCLIDEAN;

        naive_condense(x, n, d, cases[c].metric, labels, k, want, &wpasses);
        st = xknn_condense(&p, &ref, labels, k, cases[c].batch, keep, &kept, &passes, &err);
        same = st == XKNN_SUCCESS && passes == wpasses;
        for (i = 0, wkept = 0; i < n; i++) {
            same = same && keep[i] == want[i];
            wkept += want[i];
        }
        ok(same && kept == wkept, "condense %s n=%lld d=%lld k=%lld batch=%lld: the sequential store (%lld kept, %lld passes)%s%s",
           ref_data_name(cases[c].kind), (long long)n, (long long)d, (long long)k, (long long)cases[c].batch,
           (long long)wkept, (long long)wpasses, st ? ": " : "", st ? err.message : "");

        if (k <= n - 1) {
            naive_edit(x, n, d, cases[c].metric, labels, k, want);
            st = xknn_edit(&p, &ref, labels, k, keep, &kept, &err);
            same = st == XKNN_SUCCESS;
            for (i = 0, wkept = 0; i < n; i++) {
                same = same && keep[i] == want[i];
                wkept += want[i];
            }
            ok(same && kept == wkept, "edit %s n=%lld k=%lld: the naive Wilson set (%lld kept)%s%s",
               ref_data_name(cases[c].kind), (long long)n, (long long)k, (long long)wkept, st ? ": " : "",
               st ? err.message : "");
        } else {
            st = xknn_edit(&p, &ref, labels, k, keep, &kept, &err);
            ok(st == XKNN_ERROR_INVALID_ARGUMENT, "edit with k > n-1: %s", err.message);
        }
        free(x);
        free(labels);
        free(keep);
        free(want);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) bail("usage: learn-t tests/data/iris.csv");
    if (!mkdtemp(tdir)) bail("mkdtemp: %s", strerror(errno));
    plan(19 + 7 + 4 + 4 + 11 + 2 * IRIS_CASES + 16);
    test_votes();
    test_errors();
    test_accuracy_confusion();
    test_against_naive();
    test_readers();
    test_iris(argv[1]);
    test_prune();
    {
        const char *names[] = {"l.txt", "bad.txt", "big.txt", "l.npy", "l-idx1-ubyte", "two.fbin", "one.fbin",
                               "wide.ibin", "t.csv", "inf.txt"};
        size_t i;
        for (i = 0; i < sizeof names / sizeof names[0]; i++) unlink(tpath(names[i]));
        rmdir(tdir);
    }
    return tap_done();
}
