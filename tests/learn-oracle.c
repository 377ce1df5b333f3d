/* SPDX-License-Identifier: MIT */
/* learn-oracle: expected outputs of knn_mpi's --predict and accuracy, written without
 * the library, from a neighbour file of the search oracle (tests/mkdata.c oracle):
 *   learn-oracle labels N CLASSES SEED OUT.txt        N labels in {-3, 7, ...} (text)
 *   learn-oracle targets N SEED OUT.txt               N float targets (text, %.9g)
 *   learn-oracle classify uniform|distance l2|euclidean RESULT.bin LABELS.txt OUT.txt
 *   learn-oracle regress uniform|distance l2|euclidean RESULT.bin TARGETS.txt OUT.txt
 *   learn-oracle accuracy PRED.txt TRUTH.txt          prints accuracy=0.xxxx
 * Votes: for each distinct label, its weights summed in double in neighbour order;
 * the largest sum wins, equal sums go to the smallest label; weight 1 (uniform) or
 * 1/Euclidean distance (sqrt of l2), only zero distances when there are any. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *what)
{
    fprintf(stderr, "learn-oracle: %s\n", what);
    exit(2);
}

static double *read_text(const char *path, int64_t *n)
{
    FILE *f = fopen(path, "r");
    double *v = NULL, x;
    int64_t cap = 0;
    if (!f) die(path);
    *n = 0;
    while (fscanf(f, "%lf", &x) == 1) {
        if (*n == cap) {
            cap = cap ? 2 * cap : 1024;
            v = realloc(v, (size_t)cap * sizeof *v);
            if (!v) die("out of memory");
        }
        v[(*n)++] = x;
    }
    fclose(f);
    return v;
}

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int main(int argc, char **argv)
{
    if (argc == 6 && !strcmp(argv[1], "labels")) {
        long n = atol(argv[2]), c = atol(argv[3]), i;
        uint64_t s = strtoull(argv[4], NULL, 10) * 0x9e3779b97f4a7c15ull + 1;
        FILE *f = fopen(argv[5], "w");
        if (!f || c < 1) die(argv[5]);
        for (i = 0; i < n; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            fprintf(f, "%ld\n", (long)((s >> 33) % (uint64_t)c) * 10 - 3);
        }
        return fclose(f) != 0;
    }
    if (argc == 5 && !strcmp(argv[1], "targets")) {
        long n = atol(argv[2]), i;
        uint64_t s = strtoull(argv[3], NULL, 10) * 0x9e3779b97f4a7c15ull + 1;
        FILE *f = fopen(argv[4], "w");
        if (!f) die(argv[4]);
        for (i = 0; i < n; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            fprintf(f, "%.9g\n", (double)(float)((double)(s >> 40) / 1048576.0 - 8.0));
        }
        return fclose(f) != 0;
    }
    if (argc == 4 && !strcmp(argv[1], "accuracy")) {
        int64_t np, nt, i, c = 0;
        double *p = read_text(argv[2], &np), *t = read_text(argv[3], &nt);
        if (np != nt || np == 0) die("accuracy: lengths differ");
        for (i = 0; i < np; i++) c += p[i] == t[i];
        printf("accuracy=%.4f\n", (double)c / (double)np);
        return 0;
    }
    if (argc == 7 && (!strcmp(argv[1], "classify") || !strcmp(argv[1], "regress"))) {
        const int classify = !strcmp(argv[1], "classify"), distance = !strcmp(argv[2], "distance");
        const int l2 = !strcmp(argv[3], "l2");
        FILE *f = fopen(argv[4], "rb"), *out;
        unsigned char h[8], *body;
        int64_t nq, k, i, j, a, nl;
        double *val = read_text(argv[5], &nl);
        if (!classify) /* targets are float32 */
            for (i = 0; i < nl; i++) val[i] = (double)(float)val[i];
        if (!f || fread(h, 1, 8, f) != 8) die(argv[4]);
        nq = le32(h);
        k = le32(h + 4);
        body = malloc((size_t)(nq * k * 8));
        if (!body || fread(body, 1, (size_t)(nq * k * 8), f) != (size_t)(nq * k * 8)) die(argv[4]);
        fclose(f);
        out = fopen(argv[6], "w");
        if (!out) die(argv[6]);
        for (i = 0; i < nq; i++) {
            int64_t id[4096];
            double w[4096], best = -1, num = 0, den = 0;
            long best_label = 0;
            int zero = 0;
            if (k > 4096) die("k > 4096");
            for (j = 0; j < k; j++) {
                uint32_t b = le32(body + 4 * (i * k + j));
                float d;
                id[j] = (int64_t)(int32_t)b;
                b = le32(body + 4 * nq * k + 4 * (i * k + j));
                memcpy(&d, &b, 4);
                w[j] = d;
                if (id[j] < 0 || id[j] >= nl) die("id outside the labels");
            }
            for (j = 0; j < k; j++) zero |= distance && w[j] == 0.0;
            for (j = 0; j < k; j++)
                w[j] = !distance ? 1.0 : zero ? (w[j] == 0.0 ? 1.0 : 0.0) : 1.0 / (l2 ? sqrt(w[j]) : w[j]);
            if (!classify) {
                for (j = 0; j < k; j++) {
                    num += distance ? w[j] * val[id[j]] : val[id[j]];
                    den += distance ? w[j] : 1.0;
                }
                fprintf(out, "%.9g\n", (double)(float)(num / den));
                continue;
            }
            for (a = 0; a < k; a++) {
                const long lab = (long)val[id[a]];
                double s = 0;
                for (j = 0; j < k; j++)
                    if ((long)val[id[j]] == lab) s += w[j];
                if (s > best || (s == best && lab < best_label)) {
                    best = s;
                    best_label = lab;
                }
            }
            fprintf(out, "%ld\n", best_label);
        }
        free(body);
        free(val);
        return fclose(out) != 0;
    }
    die("usage: see the comment in tests/learn-oracle.c");
    return 2;
}
