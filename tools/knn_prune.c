/* SPDX-License-Identifier: MIT */
/*
 * knn_prune -- condensing (Hart) and editing (Wilson) of a labelled reference set with
 * the exact search (include/xknn/learn.h: xknn_condense, xknn_edit). One process; the
 * search uses the GPU when the library has CUDA and a device is present (--backend).
 *
 * Writes three files, each to a temporary name renamed only when all three are complete
 * (a failure leaves none of them):
 *   OUT                 the kept ids, ascending: .txt (one per line) or .ibin (uint32 n,
 *                       uint32 1, int32 ids)
 *   --subset FILE       the kept rows as .fbin (uint32 n, uint32 d, float32 rows);
 *                       default: OUT with its extension replaced by .fbin
 *   --subset-labels F   their labels, one per line; default: OUT's base name + .labels.txt
 * Exit codes: 0 ok, 1 usage, 2 input, 3 resource, 4 internal (as knn_mpi).
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cmd.h"
#include "outputs.h"
#include "xknn.h"
#include "xknn/io.h"
#include "xknn/learn.h"


typedef struct prune_opts {
    int cnn, enn, quiet, help;
    int64_t k, batch;
    int threads;
    xknn_metric metric;
    xknn_backend backend;
    const char *labels, *ref, *out, *subset, *subset_labels;
} prune_opts;

static void prune__usage(FILE *f)
{
    fprintf(f,
            "Usage: knn_prune --cnn|--enn [options] --labels LABELS REF -o OUT\n"
            "\n"
            "Prunes a labelled reference set with the exact k-NN search.\n"
            "  --cnn   Hart's condensed nearest neighbour: a store starting with point 0; passes\n"
            "          over the other points in ascending id order add each point whose k nearest\n"
            "          store points (uniform vote) mislabel it, until a pass adds nothing\n"
            "          (computed in batches, equal to that sequential definition).\n"
            "  --enn   Wilson's edited nearest neighbour: removes every point whose label differs\n"
            "          from the majority of its k nearest other points (itself excluded).\n"
            "Votes: ties between classes go to the smallest label.\n"
            "\n"
            "Options:\n"
            "  -k N                 neighbours of the vote (default 1 for --cnn, 3 for --enn)\n"
            "  -m, --metric NAME    l2 (default) or euclidean (the same neighbours)\n"
            "      --labels FILE    int32 label per REF row (IDX, .npy, .ibin, .txt; see knn_mpi)\n"
            "  -o, --output OUT     kept ids: OUT.txt (one per line) or OUT.ibin\n"
            "      --subset FILE    kept rows as .fbin (default: OUT with extension .fbin)\n"
            "      --subset-labels FILE  their labels, one per line (default: OUT base + .labels.txt)\n"
            "      --backend NAME   auto (default: the GPU when present), cpu or cuda\n"
            "      --batch N        --cnn points per batch (default: automatic)\n"
            "      --threads N      CPU threads (default: OpenMP default)\n"
            "  -q, --quiet          no summary line\n"
            "  -h, --help           this text\n"
            "REF: any input format of knn_mpi. Exit status: 0 ok, 1 usage, 2 input error,\n"
            "3 resource error, 4 internal error; a failed run leaves no output file.\n"
            "\n"
            "Example:\n"
            "  knn_prune --cnn --labels train-labels-idx1-ubyte.gz -o cnn.txt train-images-idx3-ubyte.gz\n");
}

static int prune__parse(int argc, char **argv, prune_opts *o, char *msg, size_t msz)
{
    int i;
    memset(o, 0, sizeof *o);
    o->k = -1;
    o->metric = XKNN_METRIC_L2;
    o->backend = XKNN_BACKEND_AUTO;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t v;
#define PRUNE_VALUE()                                                                  \
    do {                                                                               \
        if (!val) {                                                                    \
            snprintf(msg, msz, "option %s needs a value (see knn_prune --help)", a);   \
            return EXIT_USAGE;                                                         \
        }                                                                              \
        i++;                                                                           \
    } while (0)
        if (!strcmp(a, "--cnn"))
            o->cnn = 1;
        else if (!strcmp(a, "--enn"))
            o->enn = 1;
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet"))
            o->quiet = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            o->help = 1;
        else if (!strcmp(a, "-k")) {
            PRUNE_VALUE();
            if (knn__parse_int(val, 1, INT32_MAX, &o->k)) {
                snprintf(msg, msz, "-k: '%s' is not a positive integer", val);
                return EXIT_USAGE;
            }
        } else if (!strcmp(a, "--batch")) {
            PRUNE_VALUE();
            if (knn__parse_int(val, 1, INT32_MAX, &o->batch)) {
                snprintf(msg, msz, "--batch: '%s' is not a positive integer", val);
                return EXIT_USAGE;
            }
        } else if (!strcmp(a, "--threads")) {
            PRUNE_VALUE();
            if (knn__parse_int(val, 1, 1 << 16, &v)) {
                snprintf(msg, msz, "--threads: '%s' is not a positive integer", val);
                return EXIT_USAGE;
            }
            o->threads = (int)v;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--metric")) {
            PRUNE_VALUE();
            o->metric = xknn_metric_from_name(val);
            if (o->metric == XKNN_METRIC_COUNT) {
                snprintf(msg, msz, "%s: unknown metric '%s' (use l2 or euclidean)", a, val);
                return EXIT_USAGE;
            }
        } else if (!strcmp(a, "--backend")) {
            PRUNE_VALUE();
            if (knn__parse_backend(val, &o->backend)) {
                snprintf(msg, msz, "--backend: unknown backend '%s' (use auto, cpu or cuda)", val);
                return EXIT_USAGE;
            }
        } else if (!strcmp(a, "--labels") || !strcmp(a, "-o") || !strcmp(a, "--output") || !strcmp(a, "--subset") ||
                   !strcmp(a, "--subset-labels")) {
            PRUNE_VALUE();
            if (!*val) {
                snprintf(msg, msz, "%s: empty file name", a);
                return EXIT_USAGE;
            }
            static const char *const names[] = {"--labels", "--subset", "--subset-labels"}; /* else -o */
            const char **slot[] = {&o->labels, &o->subset, &o->subset_labels, &o->out};
            *slot[knn__index_of(a, names, 3)] = val;
        } else if (a[0] == '-' && a[1]) {
            snprintf(msg, msz, "unknown option '%s' (see knn_prune --help)", a);
            return EXIT_USAGE;
        } else if (!o->ref) {
            o->ref = a;
        } else {
            snprintf(msg, msz, "unexpected argument '%s': give one REF file", a);
            return EXIT_USAGE;
        }
#undef PRUNE_VALUE
    }
    if (o->help) return EXIT_OK;
    if (o->cnn == o->enn) {
        snprintf(msg, msz, "give exactly one of --cnn and --enn (see knn_prune --help)");
        return EXIT_USAGE;
    }
    if (!o->ref || !o->labels || !o->out) {
        snprintf(msg, msz, "missing %s (usage: knn_prune --cnn|--enn --labels LABELS REF -o OUT)",
                 !o->ref ? "REF file" : !o->labels ? "--labels" : "-o OUT");
        return EXIT_USAGE;
    }
    if (!knn__ends(o->out, ".txt") && !knn__ends(o->out, ".ibin")) {
        snprintf(msg, msz, "-o: %s must end in .txt or .ibin", o->out);
        return EXIT_USAGE;
    }
    if (o->subset && !knn__ends(o->subset, ".fbin")) {
        snprintf(msg, msz, "--subset: %s must end in .fbin", o->subset);
        return EXIT_USAGE;
    }
    if (o->k < 0) o->k = o->cnn ? 1 : 3;
    return EXIT_OK;
}



/* One output composed in memory (open_memstream), written through tools/outputs.h. */
typedef struct prune_file {
    char *buf;
    size_t len;
    FILE *f;
} prune_file;

/* Closes the streams, writes each file into its temporary and renames all three. */
static xknn_status prune__commit(knn_outs *outs, prune_file *files, xknn_error *err)
{
    xknn_status st = XKNN_SUCCESS;
    int f;
    for (f = 0; f < 3; f++) {
        const int bad = ferror(files[f].f);
        if (fclose(files[f].f) != 0 || bad)
            st = knn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "out of memory composing %s", outs->f[f].path);
        files[f].f = NULL;
    }
    for (f = 0; f < 3 && st == XKNN_SUCCESS; f++)
        st = knn_outs_write(outs, f, 0, files[f].buf, (int64_t)files[f].len, "its contents", err);
    return knn_outs_commit(outs, st, NULL, err);
}

static void prune__u32(FILE *f, uint32_t v)
{
    unsigned char b[4];
    b[0] = (unsigned char)(v & 0xff);
    b[1] = (unsigned char)((v >> 8) & 0xff);
    b[2] = (unsigned char)((v >> 16) & 0xff);
    b[3] = (unsigned char)(v >> 24);
    fwrite(b, 1, 4, f);
}

/* OUT name with its extension replaced by ext (".fbin", ".labels.txt"). */
static char *prune__derive(const char *out, const char *ext)
{
    const char *slash = strrchr(out, '/'), *dot = strrchr(out, '.');
    size_t base = (dot && (!slash || dot > slash)) ? (size_t)(dot - out) : strlen(out);
    char *s = (char *)malloc(base + strlen(ext) + 1);
    if (s) sprintf(s, "%.*s%s", (int)base, out, ext);
    return s;
}

static double prune__now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Condensing (--cnn) or editing of the n rows x of d floats: keep[i] set for the rows
 * kept, *kept of them (*passes: condensing's). */
static xknn_status prune__run(const prune_opts *o, const float *x, int64_t n, int64_t d, const int32_t *labels,
                              unsigned char *keep, int64_t *kept, int64_t *passes, xknn_error *err)
{
    xknn_params p = XKNN_PARAMS_INIT;
    const xknn_matrix ref = XKNN_MATRIX_F32(x, n, d);
    p.backend = o->backend;
    p.metric = o->metric;
    p.num_threads = o->threads;
    if (o->cnn) return xknn_condense(&p, &ref, labels, o->k, o->batch, keep, kept, passes, err);
    return xknn_edit(&p, &ref, labels, o->k, keep, kept, err);
}

int main(int argc, char **argv)
{
    prune_opts o;
    prune_file files[3];
    knn_outs outs;
    char msg[512];
    char *subset = NULL, *subset_labels = NULL;
    float *x = NULL;
    int32_t *labels = NULL;
    unsigned char *keep = NULL;
    int64_t n = 0, nl = 0, kept = 0, passes = 0, i, j;
    xknn_file_info info;
    xknn_error err;
    xknn_status st = XKNN_SUCCESS;
    double t0 = prune__now(), t_search = 0;
    int code, f;

    memset(files, 0, sizeof files);
    knn_outs_init(&outs);
    knn_outs_catch_signals();
    memset(&info, 0, sizeof info);
    err.status = XKNN_SUCCESS;
    err.message[0] = '\0';
    code = prune__parse(argc, argv, &o, msg, sizeof msg);
    if (code != EXIT_OK) {
        fprintf(stderr, "knn_prune: %s\n", msg);
        return code;
    }
    if (o.help) {
        prune__usage(stdout);
        return EXIT_OK;
    }
    subset = o.subset ? strdup(o.subset) : prune__derive(o.out, ".fbin");
    subset_labels = o.subset_labels ? strdup(o.subset_labels) : prune__derive(o.out, ".labels.txt");
    if (!subset || !subset_labels) {
        st = knn__fail(&err, XKNN_ERROR_OUT_OF_MEMORY, "out of memory");
        goto report;
    }
    {
        const char *in_opt[2] = {"REF", "--labels"}, *in_path[2];
        in_path[0] = o.ref;
        in_path[1] = o.labels;
        knn_outs_add(&outs, "-o", o.out, 0);
        knn_outs_add(&outs, "--subset", subset, 0);
        knn_outs_add(&outs, "--subset-labels", subset_labels, 0);
        if (knn_outs_collision(&outs, in_opt, in_path, 2, msg, sizeof msg)) {
            fprintf(stderr, "knn_prune: %s\n", msg);
            code = EXIT_USAGE;
            goto done;
        }
    }

    /* inputs */
    if ((st = xknn_file_probe(o.ref, NULL, &info, &err)) != XKNN_SUCCESS) goto report;
    n = info.rows;
    if ((st = xknn_labels_read(o.labels, &nl, &labels, &err)) != XKNN_SUCCESS) goto report;
    if (nl != n) {
        st = knn__fail(&err, XKNN_ERROR_INVALID_ARGUMENT, "--labels: %s holds %lld labels, but %s has n=%lld rows",
                         o.labels, (long long)nl, o.ref, (long long)n);
        goto report;
    }
    if (n - 1 > INT32_MAX) {
        st = knn__fail(&err, XKNN_ERROR_INVALID_ARGUMENT, "%s has n=%lld rows: ids beyond int32 are not written",
                         o.ref, (long long)n);
        goto report;
    }
    x = (float *)malloc((size_t)(n * info.cols) * sizeof *x);
    keep = (unsigned char *)malloc((size_t)(n > 0 ? n : 1));
    if (!x || !keep) {
        st = knn__fail(&err, XKNN_ERROR_OUT_OF_MEMORY, "out of memory reading %s (%lld x %lld floats)", o.ref,
                         (long long)n, (long long)info.cols);
        goto report;
    }
    if ((st = xknn_file_read_rows(o.ref, &info, 0, n, x, &err)) != XKNN_SUCCESS) goto report;

    /* outputs: the temporaries first (an unwritable place fails before the work) */
    if ((st = knn_outs_open(&outs, &err)) != XKNN_SUCCESS) goto report;
    for (f = 0; f < 3; f++)
        if (!(files[f].f = open_memstream(&files[f].buf, &files[f].len))) {
            st = knn__fail(&err, XKNN_ERROR_OUT_OF_MEMORY, "out of memory");
            goto report;
        }

    /* the work */
    t_search = prune__now();
    st = prune__run(&o, x, n, info.cols, labels, keep, &kept, &passes, &err);
    t_search = prune__now() - t_search;
    if (st != XKNN_SUCCESS) goto report;

    /* write, close, then rename all three */
    if (knn__ends(o.out, ".ibin")) {
        prune__u32(files[0].f, (uint32_t)kept);
        prune__u32(files[0].f, 1);
        for (i = 0; i < n; i++)
            if (keep[i]) prune__u32(files[0].f, (uint32_t)i);
    } else {
        for (i = 0; i < n; i++)
            if (keep[i]) fprintf(files[0].f, "%lld\n", (long long)i);
    }
    prune__u32(files[1].f, (uint32_t)kept);
    prune__u32(files[1].f, (uint32_t)info.cols);
    for (i = 0; i < n; i++)
        if (keep[i])
            for (j = 0; j < info.cols; j++) {
                uint32_t b;
                memcpy(&b, x + i * info.cols + j, 4);
                prune__u32(files[1].f, b);
            }
    for (i = 0; i < n; i++)
        if (keep[i]) fprintf(files[2].f, "%ld\n", (long)labels[i]);
    st = prune__commit(&outs, files, &err);

report:
    code = knn__exit_code(st);
    if (st == XKNN_ERROR_IO && outs.no_space) code = EXIT_RESOURCE;
    if (st == XKNN_SUCCESS && !o.quiet) {
        printf("knn_prune: %s k=%lld n=%lld d=%lld kept=%lld (%.2f%%)", o.cnn ? "cnn" : "enn", (long long)o.k,
               (long long)n, (long long)info.cols, (long long)kept, 100.0 * (double)kept / (double)n);
        if (o.cnn) printf(" passes=%lld", (long long)passes);
        printf(" time=%.3fs (search %.3fs) -> %s, %s, %s\n", prune__now() - t0, t_search, o.out, subset,
               subset_labels);
    }
    if (st != XKNN_SUCCESS) fprintf(stderr, "knn_prune: %s\n", err.message);
done:
    for (f = 0; f < 3; f++) {
        if (files[f].f) fclose(files[f].f);
        free(files[f].buf);
    }
    knn_outs_discard(&outs);
    free(subset);
    free(subset_labels);
    free(x);
    free(labels);
    free(keep);
    return code;
}
