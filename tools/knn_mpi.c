/* SPDX-License-Identifier: MIT */
/*
 * knn_mpi -- exact k nearest neighbours of a query file among a reference file, or
 * the all-kNN graph of one file, on one process or many MPI ranks.
 *
 * Built with MPI (XKNN_HAVE_MPI): each rank reads only its slice of REF, rank 0 reads
 * QUERY, the search runs through xknn_mpi.h and every block's owner writes its rows of
 * the result at their offsets. Every output (result, predictions, JSON) goes through
 * tools/outputs.h: checked against the inputs first, written to temporaries, renamed
 * together once complete everywhere. Without MPI the same source runs as one process:
 * the few collectives below have serial stand-ins (knn__agree and friends) and the
 * search is one xknn_search().
 *
 * Exit codes: 0 ok, 1 usage, 2 input, 3 resource, 4 internal; every rank exits with the
 * same code, and only rank 0 prints.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>
#if defined(_OPENMP)
#include <omp.h>
#endif
#if defined(__linux__)
#include <sched.h>
#endif

#include "cmd.h"
#include "knn_predict.h"
#include "npz.h"
#include "outputs.h"
#include "progress.h"
#ifdef XKNN_HAVE_MPI
#include "launch.h"
#endif
#include "xknn.h"
#include "xknn/io.h"
#include "xknn/learn.h"

#ifdef XKNN_HAVE_MPI
#include <mpi.h>
#include <pthread.h>

#include "xknn/cuda.h"
#include "xknn_mpi.h"
#endif


/* ------------------------------------------------------------------------------------ */
/* Options                                                                              */
/* ------------------------------------------------------------------------------------ */
typedef struct knn_opts {
    const char *ref, *query, *output, *json;
    int64_t k;
    xknn_metric metric;
    xknn_backend backend;
    int64_t query_block;
    xknn_elem dtype;
    int threads;
    int64_t device_memory; /* bytes; 0: the backend's default (free device memory) */
    int ids64, quiet, progress, verbose, help, version;
    int no_symmetric;       /* --no-symmetric: plain self-join (every distance twice) */
    /* classification / regression (knn_predict.c) */
    const char *labels, *targets, *query_labels, *predict;
    xknn_vote vote;
    /* metrics and bit vectors */
    double p;               /* -p: Minkowski exponent (0: not given)               */
    const char *weights;    /* --weights FILE (whamming)                           */
    int bits;               /* --bits: uint8 bytes are packed bits                 */
    int binarize;           /* --binarize T given                                  */
    double threshold;       /* T: a value > T is a 1 bit                           */
} knn_opts;

static void knn__usage(FILE *f)
{
    fputs("Usage: knn_mpi [options] REF [QUERY]\n"
            "       mpirun -np P knn_mpi [options] REF [QUERY]\n"
            "\n"
            "Exact k nearest neighbours of every QUERY row among the REF rows; without QUERY,\n"
            "the all-kNN graph of REF (each point's own id excluded, duplicates kept).\n"
            "Under MPI each rank reads only its slice of REF; rank 0 reads QUERY; results are\n"
            "identical (ids and distance bits) for any number of ranks.\n"
            "\n"
            "Options:\n"
            "  -k N                 neighbours per query (default 10; at most n, or n-1 without QUERY)\n"
            "  -m, --metric NAME    l2 (squared Euclidean, default), euclidean, l1, minkowski,\n"
            "                       chebyshev, ip (inner product, largest first), cosine (1 - cos;\n"
            "                       1 for a zero vector), hellinger (inputs >= 0), hamming or\n"
            "                       whamming (bit vectors: need --bits or --binarize)\n"
            "  -p P                 Minkowski exponent, P >= 1 (default 2; with -m minkowski)\n"
            "      --weights FILE   whamming: one float weight per bit (|w| is used), as an .fbin\n"
            "                       of n=1 row and d=bits, or a float32 .npy of bits values\n"
            "      --bits           read uint8 data (.u8bin, .bvecs, IDX ubyte, npy |u1, .bin with\n"
            "                       --dtype u8) as packed bits: d bytes -> 8d bits, bit b of byte j\n"
            "                       is bit 8j+b\n"
            "      --binarize T     real data -> bits: bit t is 1 when value t > T\n"
            "  -o, --output FILE    result file, by extension: '.bin' the big-ann ground-truth layout\n"
            "                       (uint32 nq, uint32 k, int32 ids[nq*k], float32 dist[nq*k]);\n"
            "                       '.ivecs' ids only (per row: int32 k, k int32 ids); '.npy' the ids\n"
            "                       as a NumPy array (int64, nq x k); '.npz' an uncompressed NumPy\n"
            "                       archive of ids.npy (int64) and dist.npy (float32), nq x k, up to\n"
            "                       4 GiB - 1 (no ZIP64). Any other extension is refused.\n"
            "                       Default: next to REF, REF_BASENAME.knn<k>.bin. Every output\n"
            "                       (this, --predict, --json) is written to a hidden temporary beside\n"
            "                       it, '.NAME.xknn-tmp.PID.XXXXXX' (NAME's first 64 bytes, PID rank\n"
            "                       0's), and all are renamed together once complete; any error,\n"
            "                       SIGINT or SIGTERM removes them. SIGKILL or a node failure can\n"
            "                       leave one: delete it when no job writing FILE runs. An output\n"
            "                       that is an input or another output (same file) is refused.\n"
            "      --ids64          64-bit ids in the .bin result (needed above 2^31-1 references)\n"
            "      --no-symmetric   self-join (no QUERY): plain search of every row against all\n"
            "                       rows; the default computes each distance once for both of its\n"
            "                       points (about half the work, the same bytes); -v tells which\n",
          f);
    fputs("      --backend NAME   auto (default), cpu or cuda\n"
            "      --query-block N  queries per broadcast block (default: automatic)\n"
            "      --dtype T        element type of '.bin' inputs: f32 (default), u8, i8, f16.\n"
            "                       Values are searched in their own type (u8 and i8 l2/euclidean/ip\n"
            "                       exactly in integers); f16 with l2/euclidean widens to float32\n"
            "                       exactly (same results, faster)\n"
            "      --threads N      CPU threads per rank (default: OMP_NUM_THREADS, else the\n"
            "                       node's cores over its ranks)\n"
            "      --device-memory BYTES\n"
            "                       device memory the CUDA backend may use per rank, with an\n"
            "                       optional K, M or G suffix (powers of 1024; default: 90% of\n"
            "                       the free memory). Less makes smaller tiles; below what one\n"
            "                       tile needs the run fails with exit status 3 and the minimum.\n"
            "      --json FILE      write sizes, ranks, backend, per-phase times (read, broadcast,\n"
            "                       search, reduce, write; maxima over ranks) and queries/s as\n"
            "                       JSON; under MPI also per_rank: [{rank, distance_evals, busy_s}]\n"
            "                       (query-reference distances the rank computed, each pair once\n"
            "                       in the symmetric self-join; seconds in its search phase, the\n"
            "                       ring's compute for the symmetric self-join) and, without QUERY,\n"
            "                       self_join_path: symmetric or plain\n"
            "\n", f);
    /* split: C99 compilers need only accept string literals of 4095 characters */
    fputs("Classification and regression (votes on the k neighbours of each query, computed on\n"
            "the rank that owns the query block after the reduction):\n"
            "      --labels FILE    int32 label of every REF row: IDX label file (*-idx1-ubyte[.gz]),\n"
            "                       .npy of an integer dtype, .ibin (d = 1), or .txt/.csv with one\n"
            "                       integer per line\n"
            "      --targets FILE   float target of every REF row instead (regression: mean of the\n"
            "                       neighbours' targets); same formats, any numbers\n"
            "      --vote NAME      uniform (default: majority, ties to the smallest label) or\n"
            "                       distance (weight 1/Euclidean distance, 1/sqrt for -m l2; if a\n"
            "                       neighbour is at distance 0 only those vote), as scikit-learn\n"
            "      --predict OUT    write one prediction per query in query order: OUT.txt one value\n"
            "                       per line, or OUT.npy (int32, float32 for --targets); identical\n"
            "                       bytes for any number of ranks. Without -o no neighbour file is\n"
            "                       written then\n"
            "      --query-labels FILE  true labels of the queries: prints accuracy=... on the\n"
            "                       summary line (and a confusion matrix with -v)\n"
            "\n", f);
    fputs("      --progress       progress lines on stderr (rank 0) at least every 2 s: rows done,\n"
          "                       rate, ETA; on by default when stderr is a terminal (rewritten\n"
          "                       in place there), full lines otherwise\n"
          "  -q, --quiet          no progress, no summary line (wins over --progress)\n"
            "  -v, --verbose        print the plan (slices, blocks, transfer mode, ranks without a\n"
            "                       CUDA device that search on the CPU) on stderr\n"
            "  -h, --help           this text\n"
            "      --version        version, MPI library and backends\n"
            "\n"
            "Input formats (by extension, little-endian; '.gz' read where zlib is built in):\n"
            "  .fvecs .ivecs .bvecs         TEXMEX (per row: int32 d, then d values)\n"
            "  .fbin .u8bin .i8bin .ibin    big-ann (uint32 n, uint32 d, then n*d values)\n"
            "  .bin                         same layout, float32 unless --dtype says otherwise\n"
            "  .npy                         NumPy v1-v3 (<f4 <f2 <f8 |u1 |i1 <i2 <i4 <i8, C order)\n"
            "  IDX (*-idx?-ubyte[.gz])      MNIST / Fashion-MNIST images\n"
            "\n"
            "GPUs: each rank uses device (local rank mod visible device count). With --backend\n"
            "auto a rank that sees no device searches on the CPU (same results); with --backend\n"
            "cuda every rank needs one.\n"
            "\n"
            "Exit status: 0 ok, 1 usage error (also an output colliding with an input or another\n"
            "output), 2 input error (missing/malformed file or not a regular file, dimension\n"
            "mismatch, NaN/Inf, k too large, a distance overflowing float), 3 resource error\n"
            "(memory, device, not built, disk full, quota, file size limit, no file descriptor\n"
            "left), 4 internal error, 128+N after signal N. Every rank exits with the same status.\n"
            "\n"
            "Example:\n"
            "  mpirun -np 4 knn_mpi -k 100 -o gt.bin base.fbin query.fbin\n"
            "  knn_mpi -k 10 --json run.json train-images-idx3-ubyte.gz   # all-kNN graph\n", f);
}

/* Parses a byte count: a whole decimal number with an optional K, M or G suffix (powers
 * of 1024), at least 1; 0 on success. */
static int knn__parse_bytes(const char *s, int64_t *v)
{
    char *end;
    long long x;
    int shift = 0;
    if (!s || *s < '0' || *s > '9') return -1;
    errno = 0;
    x = strtoll(s, &end, 10);
    if (errno || x < 1) return -1;
    if (*end == 'K' || *end == 'k')
        shift = 10;
    else if (*end == 'M' || *end == 'm')
        shift = 20;
    else if (*end == 'G' || *end == 'g')
        shift = 30;
    else if (*end)
        return -1;
    if (shift && *++end) return -1;
    if (x > (INT64_MAX >> shift)) return -1;
    *v = (int64_t)x << shift;
    return 0;
}

/* name equals the short or the long spelling (either may be NULL). */
static int knn__is(const char *name, const char *s, const char *l)
{
    return (s && !strcmp(name, s)) || (l && !strcmp(name, l));
}

/* The options' combinations, once all are read: EXIT_USAGE and msg, or EXIT_OK. */
static int knn__check_opts(knn_opts *o, char *msg, size_t msz)
{
    if (!o->ref) {
        snprintf(msg, msz, "missing REF file (usage: knn_mpi [options] REF [QUERY]; see knn_mpi --help)");
        return EXIT_USAGE;
    }
    if (o->ids64 && o->output && strlen(o->output) >= 6 && !strcmp(o->output + strlen(o->output) - 6, ".ivecs")) {
        snprintf(msg, msz, "--ids64: %s is an .ivecs file, which holds int32 ids only; use a .bin output", o->output);
        return EXIT_USAGE;
    }
    if (o->quiet && o->verbose) o->verbose = 0;
    {
        knn_predict lp;
        knn_predict_init(&lp);
        lp.labels_path = o->labels;
        lp.targets_path = o->targets;
        lp.qlabels_path = o->query_labels;
        lp.out_path = o->predict;
        if (knn_predict_check_options(&lp, msg, msz)) return EXIT_USAGE;
    }
    {
        const int bin_metric = o->metric == XKNN_METRIC_HAMMING || o->metric == XKNN_METRIC_WHAMMING;
        if (o->p != 0.0 && o->metric != XKNN_METRIC_MINKOWSKI) {
            snprintf(msg, msz, "-p is the Minkowski exponent: use it with -m minkowski (metric is %s)",
                     xknn_metric_name(o->metric));
            return EXIT_USAGE;
        }
        if (o->bits && o->binarize) {
            snprintf(msg, msz, "--bits and --binarize both make bit vectors: give one of them");
            return EXIT_USAGE;
        }
        if ((o->bits || o->binarize) && !bin_metric) {
            snprintf(msg, msz, "%s makes bit vectors: use -m hamming or -m whamming (metric is %s)",
                     o->bits ? "--bits" : "--binarize", xknn_metric_name(o->metric));
            return EXIT_USAGE;
        }
        if (bin_metric && !o->bits && !o->binarize) {
            snprintf(msg, msz, "-m %s compares bit vectors: add --bits (packed uint8 data) or --binarize T",
                     xknn_metric_name(o->metric));
            return EXIT_USAGE;
        }
        if (o->metric == XKNN_METRIC_WHAMMING && !o->weights) {
            snprintf(msg, msz, "-m whamming needs --weights FILE (one weight per bit)");
            return EXIT_USAGE;
        }
        if (o->weights && o->metric != XKNN_METRIC_WHAMMING) {
            snprintf(msg, msz, "--weights is for -m whamming (metric is %s)", xknn_metric_name(o->metric));
            return EXIT_USAGE;
        }
    }
    return EXIT_OK;
}

/* Fills msg and returns EXIT_USAGE on a bad command line; EXIT_OK otherwise. */
static int knn__parse(int argc, char **argv, knn_opts *o, char *msg, size_t msz)
{
    int i, npos = 0, only_pos = 0;
    memset(o, 0, sizeof *o);
    o->k = 10;
    o->metric = XKNN_METRIC_L2;
    o->backend = XKNN_BACKEND_AUTO;
    o->dtype = XKNN_ELEM_F32;

    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *val = NULL, *eq;
        char name[64];
        int has_eq = 0;
        if (only_pos || a[0] != '-' || !a[1]) {
            if (npos == 0)
                o->ref = a;
            else if (npos == 1)
                o->query = a;
            else {
                snprintf(msg, msz, "unexpected argument '%s': give REF and at most one QUERY file", a);
                return EXIT_USAGE;
            }
            npos++;
            continue;
        }
        if (!strcmp(a, "--")) {
            only_pos = 1;
            continue;
        }
        if (a[1] == '-') { /* --name or --name=value */
            eq = strchr(a, '=');
            snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - a) : (int)strlen(a), a);
            if (eq) {
                val = eq + 1;
                has_eq = 1;
            }
        } else { /* -x, -xVALUE or -x VALUE */
            snprintf(name, sizeof name, "-%c", a[1]);
            if (a[2]) {
                val = a + 2;
                has_eq = 1;
            }
        }

#define KNN_FLAG(s, l) knn__is(name, s, l)
#define KNN_NEED_VALUE()                                                                   \
    do {                                                                                   \
        if (!has_eq) {                                                                     \
            if (i + 1 >= argc) {                                                           \
                snprintf(msg, msz, "option %s needs a value (see knn_mpi --help)", name);  \
                return EXIT_USAGE;                                                         \
            }                                                                              \
            val = argv[++i];                                                               \
        }                                                                                  \
    } while (0)
#define KNN_NO_VALUE()                                                                     \
    do {                                                                                   \
        if (has_eq) {                                                                      \
            snprintf(msg, msz, "option %s takes no value (got '%s')", name, val);          \
            return EXIT_USAGE;                                                             \
        }                                                                                  \
    } while (0)

        if (KNN_FLAG("-k", NULL)) {
            KNN_NEED_VALUE();
            if (knn__parse_int(val, 1, INT64_MAX, &o->k)) {
                snprintf(msg, msz, "-k: '%s' is not a positive integer (need k >= 1)", val);
                return EXIT_USAGE;
            }
        } else if (KNN_FLAG("-m", "--metric")) {
            KNN_NEED_VALUE();
            o->metric = xknn_metric_from_name(val);
            if (o->metric == XKNN_METRIC_COUNT) {
                snprintf(msg, msz,
                         "%s: unknown metric '%s' (use l2, euclidean, l1, minkowski, chebyshev, ip, cosine, "
                         "hellinger, hamming or whamming)",
                         name, val);
                return EXIT_USAGE;
            }
        } else if (KNN_FLAG("-p", NULL)) { /* ---- metric options: -p, --weights, --bits, --binarize */
            char *end;
            KNN_NEED_VALUE();
            errno = 0;
            o->p = strtod(val, &end);
            if (!*val || *end || errno || !(o->p >= 1.0 && o->p <= 1e300)) {
                snprintf(msg, msz, "-p: '%s' is not a number >= 1 (the Minkowski exponent)", val);
                return EXIT_USAGE;
            }
        } else if (KNN_FLAG(NULL, "--weights")) {
            KNN_NEED_VALUE();
            if (!*val) {
                snprintf(msg, msz, "--weights: empty file name");
                return EXIT_USAGE;
            }
            o->weights = val;
        } else if (KNN_FLAG(NULL, "--bits")) {
            KNN_NO_VALUE();
            o->bits = 1;
        } else if (KNN_FLAG(NULL, "--binarize")) {
            char *end;
            KNN_NEED_VALUE();
            errno = 0;
            o->threshold = strtod(val, &end);
            if (!*val || *end || errno || !isfinite(o->threshold)) {
                snprintf(msg, msz, "--binarize: '%s' is not a finite number", val);
                return EXIT_USAGE;
            }
            o->binarize = 1; /* ---- end of metric options */
        } else if (KNN_FLAG("-o", "--output")) {
            KNN_NEED_VALUE();
            if (!*val) {
                snprintf(msg, msz, "%s: empty file name", name);
                return EXIT_USAGE;
            }
            o->output = val;
        } else if (KNN_FLAG(NULL, "--ids64")) {
            KNN_NO_VALUE();
            o->ids64 = 1;
        } else if (KNN_FLAG(NULL, "--no-symmetric")) {
            KNN_NO_VALUE();
            o->no_symmetric = 1;
        } else if (KNN_FLAG(NULL, "--backend")) {
            KNN_NEED_VALUE();
            if (knn__parse_backend(val, &o->backend)) {
                snprintf(msg, msz, "--backend: unknown backend '%s' (use auto, cpu or cuda)", val);
                return EXIT_USAGE;
            }
        } else if (KNN_FLAG(NULL, "--query-block")) {
            KNN_NEED_VALUE();
            if (knn__parse_int(val, 1, INT32_MAX, &o->query_block)) {
                snprintf(msg, msz, "--query-block: '%s' is not a positive integer", val);
                return EXIT_USAGE;
            }
        } else if (KNN_FLAG(NULL, "--dtype")) {
            KNN_NEED_VALUE();
            if (!strcmp(val, "f32"))
                o->dtype = XKNN_ELEM_F32;
            else if (!strcmp(val, "u8"))
                o->dtype = XKNN_ELEM_U8;
            else if (!strcmp(val, "i8"))
                o->dtype = XKNN_ELEM_I8;
            else if (!strcmp(val, "f16"))
                o->dtype = XKNN_ELEM_F16;
            else {
                snprintf(msg, msz, "--dtype: unknown type '%s' (use f32, u8, i8 or f16)", val);
                return EXIT_USAGE;
            }
        } else if (KNN_FLAG(NULL, "--threads")) {
            int64_t t;
            KNN_NEED_VALUE();
            if (knn__parse_int(val, 1, 1 << 16, &t)) {
                snprintf(msg, msz, "--threads: '%s' is not a positive integer", val);
                return EXIT_USAGE;
            }
            o->threads = (int)t;
        } else if (KNN_FLAG(NULL, "--device-memory")) {
            KNN_NEED_VALUE();
            if (knn__parse_bytes(val, &o->device_memory)) {
                snprintf(msg, msz, "--device-memory: '%s' is not a byte count (a positive integer, optionally "
                         "with K, M or G: 512M)", val);
                return EXIT_USAGE;
            }
        } else if (KNN_FLAG(NULL, "--json")) {
            KNN_NEED_VALUE();
            if (!*val) {
                snprintf(msg, msz, "--json: empty file name");
                return EXIT_USAGE;
            }
            o->json = val;
        } else if (KNN_FLAG(NULL, "--labels") || KNN_FLAG(NULL, "--targets") || KNN_FLAG(NULL, "--query-labels") ||
                   KNN_FLAG(NULL, "--predict")) {
            /* classification / regression: knn_predict.c */
            KNN_NEED_VALUE();
            if (!*val) {
                snprintf(msg, msz, "%s: empty file name", name);
                return EXIT_USAGE;
            }
            if (KNN_FLAG(NULL, "--labels"))
                o->labels = val;
            else if (KNN_FLAG(NULL, "--targets"))
                o->targets = val;
            else if (KNN_FLAG(NULL, "--query-labels"))
                o->query_labels = val;
            else
                o->predict = val;
        } else if (KNN_FLAG(NULL, "--vote")) {
            KNN_NEED_VALUE();
            o->vote = xknn_vote_from_name(val);
            if (o->vote == XKNN_VOTE_COUNT) {
                snprintf(msg, msz, "--vote: unknown vote '%s' (use uniform or distance)", val);
                return EXIT_USAGE;
            }
        } else if (KNN_FLAG(NULL, "--progress")) {
            KNN_NO_VALUE();
            o->progress = 1;
        } else if (KNN_FLAG("-q", "--quiet")) {
            KNN_NO_VALUE();
            o->quiet = 1;
        } else if (KNN_FLAG("-v", "--verbose")) {
            KNN_NO_VALUE();
            o->verbose = 1;
        } else if (KNN_FLAG("-h", "--help")) {
            KNN_NO_VALUE();
            o->help = 1;
        } else if (KNN_FLAG(NULL, "--version")) {
            KNN_NO_VALUE();
            o->version = 1;
        } else {
            snprintf(msg, msz, "unknown option '%s' (see knn_mpi --help)", a);
            return EXIT_USAGE;
        }
#undef KNN_FLAG
#undef KNN_NEED_VALUE
#undef KNN_NO_VALUE
    }
    if (o->help || o->version) return EXIT_OK;
    return knn__check_opts(o, msg, msz);
}

/* REF's directory + REF's name without ".gz" and its extension + ".knn<k>.bin". */
static char *knn__default_output(const char *ref, int64_t k)
{
    const char *slash = strrchr(ref, '/');
    const char *base = slash ? slash + 1 : ref;
    size_t blen = strlen(base), dlen = (size_t)(base - ref);
    const char *dot;
    char *out;
    if (blen > 3 && !strcmp(base + blen - 3, ".gz")) blen -= 3;
    for (dot = base + blen; dot > base && *(dot - 1) != '.'; dot--) {
    }
    if (dot > base + 1) blen = (size_t)(dot - 1 - base);
    out = (char *)malloc(dlen + blen + 48);
    if (!out) return NULL;
    sprintf(out, "%.*s%.*s.knn%lld.bin", (int)dlen, ref, (int)blen, base, (long long)k);
    return out;
}



static double knn__now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* JSON string (quotes and escapes). */
static void knn__json_str(FILE *f, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    fputc('"', f);
    for (; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

/* ------------------------------------------------------------------------------------ */
/* The run: shared state and the MPI / serial stand-ins                                 */
/* ------------------------------------------------------------------------------------ */
typedef struct knn_run {
    int rank, size;
    knn_opts o;
    char *output;           /* resolved output path (malloc)                      */
    knn_outs outs;          /* every output of the run (tools/outputs.h)         */
    int slot_result, slot_json; /* their slots; -1: not written                   */
    xknn_result_format fmt;
    xknn_result_layout lay;
    knn_npz npz;            /* .npy / .npz result (tools/npz.h); kind NONE otherwise */
    knn_progress prog;      /* rank 0's progress lines (tools/progress.h)         */
    xknn_read_opts ropts;
    xknn_file_info rinfo, qinfo;
    int64_t n, d, nq, row0, rows;
    void *ref, *query;      /* rows of dtype (BIN: packed words)                  */
    xknn_dtype dtype;       /* what is searched                                   */
    int64_t dsearch;        /* columns searched: d, or bits for BIN               */
    float *weights;         /* whamming, dsearch values                           */
    xknn_params params;
    const char *backend_used;
    double t_read, t_bcast, t_search, t_reduce, t_write, t_total, t_query; /* max over ranks */
    double t_setup;         /* start to the read: MPI_Init, contexts, outputs (max) */
    double t_devwait;       /* after the read, waiting for the device warm-up (max) */
    double t_mpi_init;      /* of t_setup: MPI_Init_thread (max)                  */
    double t_cuda_init;     /* of t_setup: the early context's wait after MPI_Init, or the
                               driver's start (max)                                */
    double t_context;       /* the warm-up thread's own time (max)                  */
    int64_t query_block, blocks;
    const char *transfer;
    unsigned char *wbuf;    /* the sink's encoding buffer                         */
    size_t wcap;
    double t_start;
    knn_predict pred;       /* --labels/--targets/--predict (knn_predict.c)       */
    int no_result;          /* --predict without -o: no neighbour file            */
    int64_t *rank_work;     /* rank 0, --json: per rank, distance evaluations and
                               1 if its backend takes the symmetric self-join (NULL
                               when not gathered)                                  */
    double *rank_busy;      /* rank 0, --json: per rank, busy (search) seconds     */
    double t_read_mine;     /* this rank's knn__read seconds (t_read: the maximum) */
    int64_t read_bytes;     /* bytes of rows this rank read (its slice; rank 0 also
                               the queries), as stored in the files                */
    double *rank_read;      /* rank 0, --json: per rank, read seconds and bytes    */
#ifdef XKNN_HAVE_MPI
    MPI_Comm comm; /* the library context's communicator (xknn_mpi_comm)           */
    xknn_mpi_context *ctx;
    xknn_cuda_context *cuctx; /* the rank's CUDA context, made while the input is read */
#endif
} knn_run;

#ifdef XKNN_HAVE_MPI
static xknn_status knn__mpi_error(knn_run *r, xknn_error *err, int rc, const char *what)
{
    return knn__mpi_fail(err, r->rank, rc, what);
}
#endif

#ifdef XKNN_HAVE_MPI
/* The rank's CUDA context (device, streams, memory pool), made in a thread of its own so
 * that the search starts on a warm device:
 * - from the start, beside MPI_Init, where the launcher names the rank's local rank (the
 *   device is then local rank mod devices, xknn_mpi_create's rule): done before the
 *   read, it does not contend with the read's page faults, which slow it several times;
 *   a context made there on another device than the one named is dropped;
 * - else beside the read, once xknn_mpi_create named the device.
 * Only when the arguments parse and may use a GPU, so a CPU run never starts the driver.
 * Where no context can be made, the search makes its own and reports what stands in the
 * way. */
typedef struct knn_warm {
    int local_rank;        /* >= 0: the device is this mod the device count */
    int device;            /* the device, or -1 (none: the driver only starts) */
    xknn_cuda_context *cx; /* NULL where none was made */
    double seconds;        /* the thread's own time */
} knn_warm;

static void *knn__warm_device(void *arg)
{
    knn_warm *w = (knn_warm *)arg;
    xknn_error e;
    const double t0 = knn__now();
    const int ndev = xknn_cuda_device_count();
    if (w->local_rank >= 0 && ndev > 0) w->device = w->local_rank % ndev;
    if (w->device >= 0) (void)xknn_cuda_context_create(w->device, &w->cx, &e);
    w->seconds = knn__now() - t0;
    return NULL;
}

static int knn__warm_early(int argc, char **argv, knn_warm *w, pthread_t *th)
{
    knn_opts pre;
    char msg[8];
    w->local_rank = knn_launcher_local_rank();
    w->device = -1;
    w->cx = NULL;
    w->seconds = 0.0;
    if (!xknn_backend_built(XKNN_BACKEND_CUDA)) return 0;
    if (knn__parse(argc, argv, &pre, msg, sizeof msg) != EXIT_OK || pre.help || pre.version ||
        pre.backend == XKNN_BACKEND_CPU)
        return 0;
    (void)knn_narrow_gpus(w->local_rank); /* before the driver starts (tools/launch.h) */
    return pthread_create(th, NULL, knn__warm_device, w) == 0;
}
#endif

/* What the no-device message adds where knn_mpi narrowed CUDA_VISIBLE_DEVICES */
static const char *knn__narrowed_note(void)
{
#ifdef XKNN_HAVE_MPI
    return knn_narrowed() ? ", set by knn_mpi to this rank's GPU; set it yourself to choose" : "";
#else
    return "";
#endif
}

/* Collective. Every rank gets the same status and message (the lowest failing rank's). */
static xknn_status knn__agree(knn_run *r, xknn_status st, xknn_error *err)
{
#ifdef XKNN_HAVE_MPI
    return xknn_mpi_agree(r->ctx, st, err);
#else
    (void)r;
    (void)err;
    return st;
#endif
}

/* Collective. Broadcasts int64 values from rank 0. */
static xknn_status knn__bcast_i64(knn_run *r, int64_t *v, int count, xknn_error *err)
{
#ifdef XKNN_HAVE_MPI
    int rc = MPI_Bcast(v, count, MPI_INT64_T, 0, r->comm);
    if (rc != MPI_SUCCESS) return knn__mpi_error(r, err, rc, "MPI_Bcast");
#else
    (void)r;
    (void)v;
    (void)count;
    (void)err;
#endif
    return XKNN_SUCCESS;
}

/* Collective. Element-wise maximum over ranks, in place. */
static void knn__max_doubles(knn_run *r, double *v, int count)
{
#ifdef XKNN_HAVE_MPI
    double tmp[16];
    if (count <= 16 && MPI_Allreduce(v, tmp, count, MPI_DOUBLE, MPI_MAX, r->comm) == MPI_SUCCESS)
        memcpy(v, tmp, (size_t)count * sizeof(double));
#else
    (void)r;
    (void)v;
    (void)count;
#endif
}

#ifdef XKNN_HAVE_MPI
/* Collective; --backend auto with CUDA built. Rank 0 learns which ranks see no CUDA
 * device (they search on the CPU: identical results by contract): the summary and the
 * JSON name the mix ("cuda+cpu"), -v lists those ranks. */
static xknn_status knn__device_census(knn_run *r, int has_device, xknn_error *err)
{
    xknn_status st = XKNN_SUCCESS;
    int *dev = NULL, rc, i, none = 0, listed = 0;
    if (r->rank == 0 && !(dev = (int *)malloc((size_t)r->size * sizeof(int))))
        st = knn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "out of memory (device census of %d ranks)", r->size);
    if ((st = knn__agree(r, st, err)) != XKNN_SUCCESS) return st;
    rc = MPI_Gather(&has_device, 1, MPI_INT, dev, 1, MPI_INT, 0, r->comm);
    if (rc != MPI_SUCCESS) st = knn__mpi_error(r, err, rc, "MPI_Gather (device census)");
    if (st == XKNN_SUCCESS && r->rank == 0) {
        for (i = 0; i < r->size; i++) none += !dev[i];
        r->backend_used = none == 0 ? "cuda" : none == r->size ? "cpu" : "cuda+cpu";
        if (r->o.verbose && none > 0) {
            fprintf(stderr, "knn_mpi: backend auto: %d of %d rank%s see%s no CUDA device and use%s the CPU backend "
                    "(identical results):", none, r->size, r->size == 1 ? "" : "s", none == 1 ? "s" : "",
                    none == 1 ? "s" : "");
            for (i = 0; i < r->size && listed < 32; i++)
                if (!dev[i]) fprintf(stderr, "%s rank %d", listed++ ? "," : "", i);
            fprintf(stderr, "%s\n", none > listed ? ", ..." : "");
        }
    }
    free(dev);
    return knn__agree(r, st, err);
}
#endif

/* ---- whamming weights: every rank reads the small file itself ----------------------- */
static xknn_status knn__read_weights(knn_run *r, xknn_error *err)
{
    xknn_file_info wi;
    xknn_read_opts wo = XKNN_READ_OPTS_INIT;
    xknn_status st = xknn_file_probe(r->o.weights, &wo, &wi, err);
    if (st != XKNN_SUCCESS) return st;
    if (!((wi.rows == 1 && wi.cols == r->dsearch) || (wi.cols == 1 && wi.rows == r->dsearch)))
        return knn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                         "--weights %s holds %lld x %lld values: need one weight per bit (%lld), as 1 x %lld",
                         r->o.weights, (long long)wi.rows, (long long)wi.cols, (long long)r->dsearch,
                         (long long)r->dsearch);
    r->weights = (float *)malloc((size_t)r->dsearch * sizeof(float));
    if (!r->weights) return knn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "out of memory for %lld weights", (long long)r->dsearch);
    return xknn_file_read_rows(r->o.weights, &wi, 0, wi.rows, r->weights, err);
}

/* ---- step: probe the inputs, check sizes, resolve the output ----------------------- */
static xknn_status knn__plan(knn_run *r, xknn_error *err)
{
    xknn_status st;
    int64_t sz[4];
    const knn_opts *o = &r->o;

    r->ropts.format = XKNN_FORMAT_AUTO;
    r->ropts.bin_dtype = o->dtype;

    /* Every rank probes REF (each reads its own rows later); rank 0 probes QUERY. */
    st = xknn_file_probe(o->ref, &r->ropts, &r->rinfo, err);
    if (st == XKNN_SUCCESS && o->query && r->rank == 0) {
        st = xknn_file_probe(o->query, &r->ropts, &r->qinfo, err);
        if (st == XKNN_SUCCESS && r->qinfo.cols != r->rinfo.cols)
            st = knn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "dimension mismatch: %s has d=%lld, %s has d=%lld", o->ref,
                           (long long)r->rinfo.cols, o->query, (long long)r->qinfo.cols);
    }
    if ((st = knn__agree(r, st, err)) != XKNN_SUCCESS) return st;

    /* The searched dtype (rank 0 decides: it alone probed QUERY): bits for --bits and
     * --binarize, else the library's rule (xknn_search_dtype). */
    if (r->rank == 0) {
        const xknn_dtype rn = xknn_file_native_dtype(&r->rinfo);
        const xknn_dtype qn = o->query ? xknn_file_native_dtype(&r->qinfo) : rn;
        if (o->bits) {
            const char *bad = r->rinfo.elem != XKNN_ELEM_U8 ? o->ref
                              : (o->query && r->qinfo.elem != XKNN_ELEM_U8) ? o->query
                                                                             : NULL;
            if (bad)
                st = knn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                               "--bits: %s holds %s values; packed bits come from uint8 data (.u8bin, .bvecs, IDX "
                               "ubyte, npy |u1, .bin with --dtype u8)",
                               bad, xknn_elem_name(bad == o->ref ? r->rinfo.elem : r->qinfo.elem));
            r->dtype = XKNN_DTYPE_BIN;
        } else if (o->binarize) {
            r->dtype = XKNN_DTYPE_BIN;
        } else {
            r->dtype = xknn_search_dtype(strcmp(r->backend_used, "cpu") ? XKNN_BACKEND_CUDA : XKNN_BACKEND_CPU,
                                         o->metric, rn, qn, r->rinfo.cols);
        }
    }
    if ((st = knn__agree(r, st, err)) != XKNN_SUCCESS) return st;
    sz[0] = r->rinfo.rows;
    sz[1] = r->rinfo.cols;
    sz[2] = o->query ? r->qinfo.rows : r->rinfo.rows;
    sz[3] = (int64_t)r->dtype;
    if ((st = knn__bcast_i64(r, sz, 4, err)) != XKNN_SUCCESS) return knn__agree(r, st, err);
    r->n = r->rinfo.rows; /* every rank probed REF itself */
    r->d = r->rinfo.cols;
    r->nq = sz[2];
    r->dtype = (xknn_dtype)sz[3];
    r->dsearch = o->bits ? 8 * r->d : r->d;

    /* From here on every rank holds the same numbers: checks need no agreement, but
     * go through it anyway so that one code path handles every failure. */
    if (r->n < 1 || r->d < 1)
        st = knn__fail(err, XKNN_ERROR_FORMAT, "%s holds n=%lld rows of d=%lld: nothing to search", o->ref,
                       (long long)r->n, (long long)r->d);
    else if (o->query && r->nq < 1)
        st = knn__fail(err, XKNN_ERROR_FORMAT, "%s holds no query rows", o->query);
    else if (!o->query && o->k > r->n - 1)
        st = knn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                       "-k %lld is too large: %s has n=%lld points, so the all-kNN graph allows k <= n-1 = %lld",
                       (long long)o->k, o->ref, (long long)r->n, (long long)(r->n - 1));
    else if (o->query && o->k > r->n)
        st = knn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "-k %lld is too large: %s has only n=%lld references",
                       (long long)o->k, o->ref, (long long)r->n);
    if (st != XKNN_SUCCESS) return knn__agree(r, st, err);

    r->fmt = xknn_result_format_from_path(r->output);
    if (o->ids64) {
        if (r->fmt == XKNN_RESULT_IVECS)
            st = knn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                           "--ids64: %s is an .ivecs file, which holds int32 ids only; use a .bin output",
                           r->output);
        r->fmt = XKNN_RESULT_BIN64;
    } else if (r->n - 1 > INT32_MAX && r->npz.kind == KNN_NPZ_NONE) {
        st = knn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                       "%s has n=%lld references: ids above 2^31-1 do not fit the int32 ids of %s; "
                       "add --ids64 (and a .bin output)",
                       o->ref, (long long)r->n, r->output);
    }
    if (st == XKNN_SUCCESS && (r->nq > (int64_t)UINT32_MAX || o->k > (int64_t)UINT32_MAX))
        st = knn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "nq=%lld or k=%lld does not fit the result header (uint32)",
                       (long long)r->nq, (long long)o->k);
    if (st == XKNN_SUCCESS && r->npz.kind != KNN_NPZ_NONE) {
        r->fmt = XKNN_RESULT_BIN64; /* its encoding: int64 ids, float32 distances */
        st = knn_npz_layout(&r->npz, r->npz.kind, r->nq, o->k, &r->lay, err);
    } else if (st == XKNN_SUCCESS) {
        st = xknn_result_layout_of(r->fmt, r->nq, o->k, &r->lay, err);
    }
    if (st == XKNN_SUCCESS && o->weights) st = knn__read_weights(r, err);
    return knn__agree(r, st, err);
}

/* Rows in the searched dtype; --binarize reads float32 in chunks and keeps bits. */
static xknn_status knn__read_rows(const knn_run *r, const char *path, const xknn_file_info *info, int64_t row0,
                                  int64_t nrows, void *out, xknn_error *err)
{
    const int64_t words = (r->d + 63) / 64;
    float *tmp;
    int64_t c0, i, t;
    xknn_status st = XKNN_SUCCESS;
    if (!r->o.binarize) return xknn_file_read_rows_as(path, info, row0, nrows, r->dtype, out, err);
    tmp = (float *)malloc((size_t)(1024 * r->d) * sizeof(float));
    if (!tmp) return knn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "out of memory binarizing %s", path);
    for (c0 = 0; c0 < nrows && st == XKNN_SUCCESS; c0 += 1024) {
        const int64_t c = nrows - c0 < 1024 ? nrows - c0 : 1024;
        st = xknn_file_read_rows(path, info, row0 + c0, c, tmp, err);
        for (i = 0; i < c && st == XKNN_SUCCESS; i++) {
            uint64_t *w = (uint64_t *)out + (c0 + i) * words;
            for (t = 0; t < words; t++) w[t] = 0;
            for (t = 0; t < r->d; t++)
                if ((double)tmp[i * r->d + t] > r->o.threshold) w[t / 64] |= 1ull << (t % 64);
        }
    }
    free(tmp);
    return st;
}

/* ---- step: read this rank's reference rows and (rank 0) the queries ----------------- */
static xknn_status knn__read(knn_run *r, xknn_error *err)
{
    xknn_status st = XKNN_SUCCESS;
    double t0 = knn__now();
#ifdef XKNN_HAVE_MPI
    xknn_mpi_slice(r->n, r->rank, r->size, &r->row0, &r->rows);
#else
    r->row0 = 0;
    r->rows = r->n;
#endif
    const int64_t rb = xknn_row_bytes(r->dtype, r->dsearch);
    if (r->rows > 0) {
        r->ref = malloc((size_t)(r->rows * rb));
        if (!r->ref)
            st = knn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "out of memory reading rows %lld..%lld of %s (%.1f MiB)",
                           (long long)r->row0, (long long)(r->row0 + r->rows - 1), r->o.ref,
                           (double)(r->rows * rb) / 1048576.0);
        else
            st = knn__read_rows(r, r->o.ref, &r->rinfo, r->row0, r->rows, r->ref, err);
    }
    if (st == XKNN_SUCCESS && r->o.query && r->rank == 0) {
        r->query = malloc((size_t)(r->nq * rb));
        if (!r->query)
            st = knn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "out of memory reading %s (%.1f MiB)", r->o.query,
                           (double)(r->nq * rb) / 1048576.0);
        else
            st = knn__read_rows(r, r->o.query, &r->qinfo, 0, r->nq, r->query, err);
    }
    if (r->o.metric == XKNN_METRIC_HELLINGER) {
        /* negative values, named by file, row and column (the search would only say
         * "reference" or "query") */
        xknn_matrix m = XKNN_MATRIX_TYPED(r->ref, r->rows, r->dsearch, r->dtype);
        if (st == XKNN_SUCCESS && r->rows > 0) st = xknn_check_input(&r->params, r->o.ref, &m, r->row0, err);
        m.data = r->query;
        m.rows = r->nq;
        if (st == XKNN_SUCCESS && r->o.query && r->rank == 0) st = xknn_check_input(&r->params, r->o.query, &m, 0, err);
    }
    if (st != XKNN_SUCCESS) knn__prefix_rank(err, r->rank, r->size);
    r->t_read = r->t_read_mine = knn__now() - t0;
    r->read_bytes = r->rows * r->rinfo.row_bytes + (r->o.query && r->rank == 0 ? r->nq * r->qinfo.row_bytes : 0);
    return knn__agree(r, st, err);
}

/* Step: the read, beside the rank's CUDA context where none was made early on the device
 * xknn_mpi_create named (one made on another is dropped); then the maxima over ranks of
 * the setup and read times. Collective. */
static xknn_status knn__read_warm(knn_run *r, int early_device, double t_begin, xknn_error *err)
{
    xknn_status st;
#ifdef XKNN_HAVE_MPI
    knn_warm warm;
    pthread_t wth;
    int warming = 0;
    warm.local_rank = -1;
    warm.device = xknn_mpi_device(r->ctx);
    warm.cx = NULL;
    warm.seconds = 0.0;
    if (r->cuctx && early_device != warm.device) {
        xknn_cuda_context_destroy(r->cuctx); /* made early on another device */
        r->cuctx = NULL;
        r->t_context = 0.0;
    }
    if (r->cuctx)
        r->params.cuda_context = r->cuctx;
    else if (r->o.backend != XKNN_BACKEND_CPU && warm.device >= 0 && xknn_backend_built(XKNN_BACKEND_CUDA))
        warming = pthread_create(&wth, NULL, knn__warm_device, &warm) == 0;
    r->t_setup = knn__now() - t_begin;
    st = knn__read(r, err);
    if (warming) {
        const double t0 = knn__now();
        pthread_join(wth, NULL);
        r->params.cuda_context = r->cuctx = warm.cx;
        r->t_devwait = knn__now() - t0;
        r->t_context = warm.seconds;
    }
#else
    (void)early_device;
    r->t_setup = knn__now() - t_begin;
    st = knn__read(r, err);
#endif
    if (st == XKNN_SUCCESS) {
        double *const t[6] = {&r->t_read, &r->t_setup, &r->t_devwait, &r->t_mpi_init, &r->t_cuda_init, &r->t_context};
        double v[6];
        int i;
        for (i = 0; i < 6; i++) v[i] = *t[i];
        knn__max_doubles(r, v, 6);
        for (i = 0; i < 6; i++) *t[i] = v[i];
    }
    return st;
}

/* ---- outputs -------------------------------------------------------------------------- */
/* Collective. Creates the run's temporaries and writes the result's header (rank 0). */
static xknn_status knn__open_output(knn_run *r, xknn_error *err)
{
    xknn_status st = knn_outs_open(&r->outs, err);
    if (st == XKNN_SUCCESS && r->slot_result >= 0 && r->rank == 0 && r->lay.header_bytes > 0) {
        unsigned char hdr[8];
        xknn_result_header(r->fmt, r->nq, r->o.k, hdr);
        st = knn_outs_write(&r->outs, r->slot_result, 0, hdr, r->lay.header_bytes, "the header", err);
    }
    if (st == XKNN_SUCCESS && r->slot_result >= 0) st = knn_npz_write_head(&r->npz, &r->outs, r->slot_result, err);
    return knn__agree(r, st, err);
}

/* Sink: on the block's owner, encode its rows (in parallel: xknn_result_encode_rows)
 * and write them at their offsets, in pieces of about 32 MiB through one reused buffer. */
static xknn_status knn__sink(void *user, int64_t q0, int64_t rows, int64_t k, const int64_t *ids,
                             const float *dist, xknn_error *err)
{
    knn_run *r = (knn_run *)user;
    /* every format but IVECS encodes 4k distance bytes a row (.npy writes none of them) */
    const int64_t enc_dist = r->fmt == XKNN_RESULT_IVECS ? 0 : 4 * k;
    const int64_t row_bytes = r->lay.ids_row_bytes + enc_dist;
    const int64_t fit = row_bytes > 0 ? ((int64_t)32 << 20) / row_bytes : rows;
    const int64_t piece = fit > 0 ? fit : 1;
    char what[96];
    xknn_status st;
    int64_t i0;
    if (dist && (st = xknn_check_result(r->o.metric, q0, rows, k, ids, dist, err)) != XKNN_SUCCESS) return st;
    if ((st = knn_predict_rows(&r->pred, q0, rows, k, ids, dist, err)) != XKNN_SUCCESS) return st;
    if (r->no_result) return XKNN_SUCCESS;
    for (i0 = 0; i0 < rows; i0 += piece) {
        const int64_t nr = rows - i0 < piece ? rows - i0 : piece;
        const int64_t ib = nr * r->lay.ids_row_bytes, db = nr * r->lay.dist_row_bytes, eb = nr * enc_dist;
        if ((size_t)(ib + eb + 1) > r->wcap) {
            unsigned char *nb = (unsigned char *)realloc(r->wbuf, (size_t)(ib + eb + 1));
            if (!nb)
                return knn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "out of memory encoding result rows (%lld bytes)",
                                 (long long)(ib + eb));
            r->wbuf = nb;
            r->wcap = (size_t)(ib + eb + 1);
        }
        st = xknn_result_encode_rows(r->fmt, nr, k, ids + i0 * k, dist ? dist + i0 * k : NULL, r->wbuf, r->wbuf + ib,
                                     err);
        if (st == XKNN_SUCCESS) st = knn_npz_note(&r->npz, q0 + i0, nr, r->wbuf, ib, r->wbuf + ib, db, err);
        if (st != XKNN_SUCCESS) return st;
        snprintf(what, sizeof what, "rows %lld..%lld", (long long)(q0 + i0), (long long)(q0 + i0 + nr - 1));
        st = knn_outs_write(&r->outs, r->slot_result, r->lay.ids_offset + (q0 + i0) * r->lay.ids_row_bytes, r->wbuf,
                            ib, what, err);
        if (st == XKNN_SUCCESS && db > 0)
            st = knn_outs_write(&r->outs, r->slot_result, r->lay.dist_offset + (q0 + i0) * r->lay.dist_row_bytes,
                                r->wbuf + ib, db, what, err);
        if (st != XKNN_SUCCESS) return st; /* the search prefixes the rank */
    }
    return XKNN_SUCCESS;
}

/* Not collective. Rank 0 starts its progress lines when asked (--progress, or stderr a
 * terminal, and not -q); 1 when they run. */
static int knn__progress_begin(knn_run *r)
{
    const int tty = isatty(STDERR_FILENO);
    if (r->rank != 0 || r->o.quiet || !(r->o.progress || tty)) return 0;
    return knn_progress_start(&r->prog, r->nq, r->o.query ? "queries" : "rows", tty) == 0;
}

#ifdef XKNN_HAVE_MPI
/* ---- MPI: the search ---------------------------------------------------------------- */
/* Collective. For --json: every rank's distance evaluations, busy seconds (the phase the
 * library counts as search: the ring's compute in the symmetric self-join) and whether
 * its backend takes the symmetric self-join, gathered on rank 0. */
static xknn_status knn__gather_ranks(knn_run *r, const xknn_mpi_stats *stats, xknn_error *err)
{
    int64_t mine[2];
    double busy = stats->local.search, rd[2];
    int have = 1, rc;
    rd[0] = r->t_read_mine;
    rd[1] = (double)r->read_bytes;
    mine[0] = stats->distance_evals;
    /* the symmetric ring (pair kernel), or one rank's own symmetric self-join (GPU) */
    mine[1] = !r->o.query && (xknn_search_pair_why_not(&r->params, r->dtype, r->dsearch) == NULL ||
                              (r->size == 1 && xknn_self_join_why_plain(&r->params, r->dtype, r->dsearch) == NULL));
    if (r->rank == 0) {
        r->rank_work = (int64_t *)malloc((size_t)r->size * 2 * sizeof(int64_t));
        r->rank_busy = (double *)malloc((size_t)r->size * sizeof(double));
        r->rank_read = (double *)malloc((size_t)r->size * 2 * sizeof(double));
        have = r->rank_work && r->rank_busy && r->rank_read;
    }
    rc = MPI_Bcast(&have, 1, MPI_INT, 0, r->comm);
    if (rc == MPI_SUCCESS && have) rc = MPI_Gather(mine, 2, MPI_INT64_T, r->rank_work, 2, MPI_INT64_T, 0, r->comm);
    if (rc == MPI_SUCCESS && have) rc = MPI_Gather(&busy, 1, MPI_DOUBLE, r->rank_busy, 1, MPI_DOUBLE, 0, r->comm);
    if (rc == MPI_SUCCESS && have) rc = MPI_Gather(rd, 2, MPI_DOUBLE, r->rank_read, 2, MPI_DOUBLE, 0, r->comm);
    if (rc != MPI_SUCCESS) return knn__mpi_error(r, err, rc, "MPI_Gather (per-rank work)");
    if (!have)
        return knn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "rank 0: out of memory for the per-rank statistics of %d ranks",
                         r->size);
    return XKNN_SUCCESS;
}

static xknn_status knn__search_and_write(knn_run *r, xknn_error *err)
{
    xknn_mpi_output out = XKNN_MPI_OUTPUT_INIT;
    xknn_mpi_stats stats;
    xknn_mpi_index *index = NULL;
    xknn_params ip = r->params;
    xknn_matrix refm = XKNN_MATRIX_TYPED(r->ref, r->rows, r->dsearch, r->dtype);
    xknn_matrix qm = XKNN_MATRIX_TYPED(r->query, r->nq, r->dsearch, r->dtype);
    xknn_status st;
    double t0, v[2];

    out.sink = knn__sink;
    out.sink_user = r;
    out.any_order = 1; /* (rows are written at their offsets) */
    if (knn__progress_begin(r)) {
        out.progress = knn_progress_update;
        out.progress_user = &r->prog;
    }
    r->t_start = knn__now();
    memset(&stats, 0, sizeof stats);
    /* the index borrows the slice read above (no copy); the readers refused NaN and Inf,
     * so the search does not scan the rows again (hellinger's signs: knn__read) */
    ip.values_checked = 1;
    st = xknn_mpi_index_borrow(r->ctx, &ip, r->rows > 0 ? &refm : NULL, r->row0, &index, err);
    if (st == XKNN_SUCCESS && r->o.query)
        st = xknn_mpi_index_search(index, r->rank == 0 ? &qm : NULL, 0, r->o.k, &out, &stats, err);
    else if (st == XKNN_SUCCESS)
        st = xknn_mpi_index_self_join(index, r->o.k, &out, &stats, err);
    xknn_mpi_index_destroy(index);
    knn_progress_stop(&r->prog);
    r->query_block = stats.query_block;
    r->blocks = stats.blocks;
    r->transfer = xknn_mpi_transfer_name(stats.transfer);
    r->t_query = stats.max.total;
    r->t_bcast = stats.max.broadcast;
    r->t_search = stats.max.search;
    r->t_reduce = stats.max.reduce;
    /* the search's status is agreed: every rank takes this branch or none does */
    if (st == XKNN_SUCCESS && r->o.json) st = knn__gather_ranks(r, &stats, err);

    /* predictions: collective, written after the search (their offsets need every row) */
    t0 = knn__now();
    st = knn__agree(r, st, err);
    if (st == XKNN_SUCCESS) st = knn__agree(r, knn_npz_finish(&r->npz, &r->outs, r->slot_result, err), err);
    if (st == XKNN_SUCCESS) st = knn_predict_finish(&r->pred, err);
    v[0] = stats.local.write + (knn__now() - t0);
    v[1] = 0;
    knn__max_doubles(r, v, 1);
    r->t_write = v[0];
    return st;
}
#else
/* ---- serial stand-in: one search, one writer ---------------------------------------- */
static xknn_status knn__search_and_write(knn_run *r, xknn_error *err)
{
    xknn_matrix refm = XKNN_MATRIX_TYPED(r->ref, r->rows, r->dsearch, r->dtype);
    xknn_matrix qm = XKNN_MATRIX_TYPED(r->query, r->nq, r->dsearch, r->dtype);
    int64_t *ids = NULL;
    float *dist = NULL;
    xknn_status st = XKNN_SUCCESS;
    double t0;

    r->query_block = r->o.query_block > 0 ? r->o.query_block : 0;
    r->blocks = 1;
    r->transfer = "none";
    ids = (int64_t *)malloc((size_t)(r->nq * r->o.k) * sizeof(int64_t));
    dist = (float *)malloc((size_t)(r->nq * r->o.k) * sizeof(float));
    if (!ids || !dist)
        st = knn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "out of memory for %lld x %lld results", (long long)r->nq,
                       (long long)r->o.k);
    t0 = knn__now();
    if (st == XKNN_SUCCESS) {
        r->params.query_block = r->o.query_block;
        (void)knn__progress_begin(r); /* (no per-block hook here: elapsed time only) */
        st = xknn_search(&r->params, &refm, r->o.query ? &qm : NULL, r->o.k, ids, dist, err);
        knn_progress_stop(&r->prog);
    }
    r->t_search = knn__now() - t0;
    r->t_query = r->t_search;
    t0 = knn__now();
    if (st == XKNN_SUCCESS) st = knn__sink(r, 0, r->nq, r->o.k, ids, dist, err);
    if (st == XKNN_SUCCESS) st = knn_npz_finish(&r->npz, &r->outs, r->slot_result, err);
    if (st == XKNN_SUCCESS) st = knn_predict_finish(&r->pred, err);
    r->t_write = knn__now() - t0;
    r->t_query += r->t_write;
    free(dist);
    free(ids);
    return st;
}

#endif

static void knn__print_version(void)
{
    printf("knn_mpi (xknn) %s\n", XKNN_VERSION_STRING);
#ifdef XKNN_HAVE_MPI
    {
        char lib[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        char *nl;
        MPI_Get_library_version(lib, &len);
        nl = strchr(lib, '\n');
        if (nl) *nl = '\0';
        nl = strchr(lib, ',');
        if (nl) *nl = '\0';
        printf("MPI: %s (CUDA-aware: %s)\n", lib, xknn_mpi_cuda_aware_supported() ? "yes" : "no");
    }
#else
    printf("MPI: not built (single process)\n");
#endif
    if (xknn_backend_built(XKNN_BACKEND_CUDA)) {
        const int ndev = xknn_cuda_device_count();
        printf("backends: cpu, cuda (%d device%s visible)\n", ndev, ndev == 1 ? "" : "s");
    } else {
        printf("backends: cpu\n");
    }
}

static const char *knn__result_format_name(const knn_run *r)
{
    if (r->npz.kind != KNN_NPZ_NONE) return r->npz.kind == KNN_NPZ_NPY ? "npy" : "npz";
    switch (r->fmt) {
    case XKNN_RESULT_BIN: return "bin";
    case XKNN_RESULT_BIN64: return "bin64";
    case XKNN_RESULT_IVECS: return "ivecs";
    default: return "unknown";
    }
}

/* Rank 0: the JSON report, composed in memory and written to its output. */
static xknn_status knn__write_json(knn_run *r, double qps, xknn_error *err)
{
    char *buf = NULL;
    size_t len = 0;
    xknn_status st;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return knn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "out of memory composing --json");
    fprintf(f, "{\n  \"program\": \"knn_mpi\",\n  \"version\": \"%s\",\n", XKNN_VERSION_STRING);
#ifdef XKNN_HAVE_MPI
    fprintf(f, "  \"mpi\": true,\n");
#else
    fprintf(f, "  \"mpi\": false,\n");
#endif
    fprintf(f, "  \"ref\": ");
    knn__json_str(f, r->o.ref);
    fprintf(f, ",\n  \"query\": ");
    if (r->o.query)
        knn__json_str(f, r->o.query);
    else
        fprintf(f, "null");
    fprintf(f, ",\n  \"output\": ");
    if (r->no_result)
        fprintf(f, "null");
    else
        knn__json_str(f, r->output);
    if (r->pred.out_path) {
        fprintf(f, ",\n  \"predict\": ");
        knn__json_str(f, r->pred.out_path);
    }
    if (r->pred.qlabels) fprintf(f, ",\n  \"accuracy\": %.6f", r->pred.accuracy);
    fprintf(f, ",\n  \"output_format\": \"%s\",\n", knn__result_format_name(r));
    fprintf(f, "  \"self_join\": %s,\n", r->o.query ? "false" : "true");
    fprintf(f, "  \"n\": %lld,\n  \"d\": %lld,\n  \"nq\": %lld,\n  \"k\": %lld,\n", (long long)r->n, (long long)r->d,
            (long long)r->nq, (long long)r->o.k);
    fprintf(f, "  \"metric\": \"%s\",\n  \"ranks\": %d,\n  \"backend\": \"%s\",\n", xknn_metric_name(r->o.metric),
            r->size, r->backend_used);
    fprintf(f, "  \"dtype\": \"%s\",\n  \"d_searched\": %lld,\n", xknn_dtype_name(r->dtype), (long long)r->dsearch);
    if (r->o.metric == XKNN_METRIC_MINKOWSKI) fprintf(f, "  \"p\": %.17g,\n", r->params.p);
    fprintf(f, "  \"threads\": %d,\n  \"query_block\": %lld,\n  \"blocks\": %lld,\n  \"transfer\": \"%s\",\n",
            r->params.num_threads > 0 ? r->params.num_threads : xknn_thread_budget(), (long long)r->query_block,
            (long long)r->blocks, r->transfer);
    fprintf(f,
            "  \"time_s\": {\"read\": %.6f, \"broadcast\": %.6f, \"search\": %.6f, \"reduce\": %.6f, "
            "\"write\": %.6f, \"query_phase\": %.6f, \"setup\": %.6f, \"mpi_init\": %.6f, \"cuda_init\": %.6f, "
            "\"context\": %.6f, \"device_wait\": %.6f, \"total\": %.6f},\n",
            r->t_read, r->t_bcast, r->t_search, r->t_reduce, r->t_write, r->t_query, r->t_setup, r->t_mpi_init,
            r->t_cuda_init, r->t_context, r->t_devwait, r->t_total);
    {
        /* the rows read by all ranks over the slowest rank's read phase */
        const double bytes = (double)r->n * (double)r->rinfo.row_bytes +
                             (r->o.query ? (double)r->nq * (double)r->qinfo.row_bytes : 0.0);
        fprintf(f, "  \"read\": {\"bytes\": %.0f, \"s\": %.6f, \"GB_per_s\": %.3f},\n", bytes, r->t_read,
                r->t_read > 0 ? bytes / r->t_read / 1e9 : 0.0);
    }
    if (r->rank_work) {
        /* every rank's share of the distance work and its busy seconds (the balance) */
        int i, sym = !r->o.query;
        for (i = 0; i < r->size; i++)
            if (!r->rank_work[2 * i + 1]) sym = 0;
        if (!r->o.query) fprintf(f, "  \"self_join_path\": \"%s\",\n", sym ? "symmetric" : "plain");
        fprintf(f, "  \"per_rank\": [");
        for (i = 0; i < r->size; i++) {
            const double rs = r->rank_read ? r->rank_read[2 * i] : 0.0;
            const double rbytes = r->rank_read ? r->rank_read[2 * i + 1] : 0.0;
            fprintf(f, "%s\n    {\"rank\": %d, \"distance_evals\": %lld, \"busy_s\": %.6f", i ? "," : "", i,
                    (long long)r->rank_work[2 * i], r->rank_busy[i]);
            fprintf(f, ", \"read_s\": %.6f, \"read_bytes\": %.0f, \"read_GB_per_s\": %.3f}", rs, rbytes,
                    rs > 0 ? rbytes / rs / 1e9 : 0.0);
        }
        fprintf(f, "\n  ],\n");
    }
    fprintf(f, "  \"queries_per_s\": %.3f\n}\n", qps);
    if (fclose(f) != 0) {
        free(buf);
        return knn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "out of memory composing --json");
    }
    st = knn_outs_write(&r->outs, r->slot_json, 0, buf, (int64_t)len, "the report", err);
    free(buf);
    return st;
}

/* Not collective. Every output of the run, checked against the inputs and each other
 * before any work: EXIT_USAGE and msg on a collision. */
static int knn__declare_outputs(knn_run *r, char *msg, size_t msz)
{
    const knn_opts *o = &r->o;
    const char *in_opt[6] = {"REF", "QUERY", "--labels", "--targets", "--query-labels", "--weights"};
    const char *in_path[6];
    r->no_result = o->predict && !o->output;
    r->output = o->output ? strdup(o->output) : knn__default_output(o->ref, o->k);
    if (!r->output) {
        snprintf(msg, msz, "out of memory");
        return EXIT_RESOURCE;
    }
    knn_outs_init(&r->outs);
    r->slot_result = r->no_result ? -1 : knn_outs_add(&r->outs, "output", r->output, 0);
    r->pred.slot = o->predict ? knn_outs_add(&r->outs, "--predict", o->predict, 0) : -1;
    r->slot_json = o->json ? knn_outs_add(&r->outs, "--json", o->json, 1) : -1;
    r->pred.outs = &r->outs;
    in_path[0] = o->ref;
    in_path[1] = o->query;
    in_path[2] = o->labels;
    in_path[3] = o->targets;
    in_path[4] = o->query_labels;
    in_path[5] = o->weights;
    if (knn_outs_collision(&r->outs, in_opt, in_path, 6, msg, msz)) return EXIT_USAGE;
    return o->output && !r->no_result && knn_npz_kind_of(o->output, &r->npz.kind, msg, msz) ? EXIT_USAGE : EXIT_OK;
}

/* Collective over every process. Ranks may have been given different arguments: a usage
 * error on any rank ends all of them with the lowest such rank's message (copied into
 * msg), and --help or --version given to some ranks only is a usage error too. */
static int knn__agree_usage(knn_run *r, int code, char *msg, size_t msz)
{
#ifdef XKNN_HAVE_MPI
    const int info = r->o.help || r->o.version;
    int in[3], out[3];
    in[0] = code != EXIT_OK ? r->rank : r->size; /* the lowest failing rank */
    in[1] = -info;                               /* min: -(any rank asked)  */
    in[2] = info;                                /* min: every rank asked   */
    if (MPI_Allreduce(in, out, 3, MPI_INT, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS) return EXIT_INTERNAL;
    if (out[0] < r->size) {
        MPI_Bcast(msg, (int)msz, MPI_CHAR, out[0], MPI_COMM_WORLD);
        msg[msz - 1] = '\0';
        return code != EXIT_OK ? code : EXIT_USAGE;
    }
    if (out[1] != 0 && out[2] == 0) {
        snprintf(msg, msz, "--help or --version reached some ranks only: every rank must get the same arguments");
        return EXIT_USAGE;
    }
#else
    (void)r;
    (void)msg;
    (void)msz;
#endif
    return code;
}

/* Collective. The JSON report (rank 0), then every output renamed into place together. */
static xknn_status knn__commit_outputs(knn_run *r, xknn_status st, xknn_error *err)
{
    int64_t size[KNN_OUTS_MAX];
    int i;
    if (st == XKNN_SUCCESS && r->slot_json >= 0 && r->rank == 0)
        st = knn__write_json(r, r->t_query > 0 ? (double)r->nq / r->t_query : 0.0, err);
    for (i = 0; i < r->outs.n; i++) size[i] = -1;
    if (r->slot_result >= 0) size[r->slot_result] = r->lay.total_bytes;
    if (r->pred.slot >= 0) size[r->pred.slot] = r->pred.bytes;
    return knn_outs_commit(&r->outs, st, size, err);
}

int main(int argc, char **argv)
{
    knn_run run, *r = &run;
    xknn_error err;
    xknn_status st = XKNN_SUCCESS;
    char msg[512];
    int code;
    const double t_begin = knn__now();

    memset(r, 0, sizeof *r);
    knn_predict_init(&r->pred);
    err.status = XKNN_SUCCESS;
    err.message[0] = '\0';
    r->size = 1;
    int warm_early = 0;    /* a context is being made beside MPI_Init */
    int early_device = -1; /* its device */
#ifdef XKNN_HAVE_MPI
    int provided = MPI_THREAD_SINGLE;
    pthread_t early_th;
    knn_warm early;
    const int one_node_pml = knn_one_node_pml(); /* before any thread (tools/launch.h) */
    warm_early = knn__warm_early(argc, argv, &early, &early_th);
    /* FUNNELED: the symmetric self-join computes in a worker thread while the main thread
     * moves slices and lists (the library falls back to inline compute below it) */
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "knn_mpi: MPI_Init failed\n");
        if (warm_early) pthread_join(early_th, NULL);
        xknn_cuda_context_destroy(early.cx);
        return EXIT_INTERNAL;
    }
    r->t_mpi_init = knn__now() - t_begin;
    if (warm_early) { /* what is left of the early warm-up after MPI_Init, timed for --json */
        const double t0 = knn__now();
        pthread_join(early_th, NULL);
        r->t_cuda_init = knn__now() - t0;
        r->cuctx = early.cx;
        r->t_context = early.seconds;
        early_device = early.device;
    }
    r->comm = MPI_COMM_NULL;
    MPI_Comm_rank(MPI_COMM_WORLD, &r->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &r->size);
#endif

    knn_outs_catch_signals();
    r->slot_result = r->slot_json = -1;
    r->pred.slot = -1;
    /* Every rank parses its argv and checks the outputs; the verdict is agreed, rank 0
     * speaks. */
    msg[0] = '\0';
    code = knn__parse(argc, argv, &r->o, msg, sizeof msg);
    if (code == EXIT_OK && !r->o.help && !r->o.version) code = knn__declare_outputs(r, msg, sizeof msg);
    code = knn__agree_usage(r, code, msg, sizeof msg);
    if (code != EXIT_OK || r->o.help || r->o.version) {
        if (r->rank == 0) {
            if (code != EXIT_OK)
                fprintf(stderr, "knn_mpi: %s\n", msg);
            else if (r->o.help)
                knn__usage(stdout);
            else
                knn__print_version();
        }
        goto finalize;
    }

    r->params = xknn_params_default();
    r->params.backend = r->o.backend;
    r->params.metric = r->o.metric;
    r->params.p = r->o.metric == XKNN_METRIC_MINKOWSKI ? (r->o.p != 0.0 ? r->o.p : 2.0) : 0.0;
    r->params.num_threads = r->o.threads;
    r->params.device_memory_budget = (size_t)r->o.device_memory;
    r->params.verbose = r->o.verbose && r->rank == 0;
    r->params.self_join = r->o.no_symmetric ? XKNN_SELF_JOIN_PLAIN : XKNN_SELF_JOIN_AUTO;
    if (!warm_early && r->o.backend != XKNN_BACKEND_CPU && xknn_backend_built(XKNN_BACKEND_CUDA)) {
        const double t0 = knn__now(); /* the driver's start, timed for --json */
        (void)xknn_cuda_device_count();
        r->t_cuda_init = knn__now() - t0;
    }
    r->backend_used = r->o.backend == XKNN_BACKEND_CUDA ? "cuda"
                      : r->o.backend == XKNN_BACKEND_CPU ? "cpu"
                      : (xknn_backend_built(XKNN_BACKEND_CUDA) && xknn_cuda_device_count() > 0) ? "cuda"
                                                                                               : "cpu";

#ifdef XKNN_HAVE_MPI
    {
        xknn_mpi_config cfg = XKNN_MPI_CONFIG_INIT;
        cfg.query_block = r->o.query_block;
        cfg.verbose = r->o.verbose;
        st = xknn_mpi_create(MPI_COMM_WORLD, &cfg, &r->ctx, &err);
        /* the library's communicator carries the command's collectives too: one order for
         * all of them (the report's, after a failed create, go on MPI_COMM_WORLD) */
        r->comm = r->ctx ? xknn_mpi_comm(r->ctx) : MPI_COMM_WORLD;
        if (st != XKNN_SUCCESS) goto report;
        knn_outs_attach(&r->outs, r->ctx, r->comm);
        /* Ranks that share a node share its cores: xknn_mpi_create told the library
         * (xknn_thread_share), whose budget is then this rank's share; the command's
         * own parallel regions take the same */
#if defined(_OPENMP)
        if (r->o.threads == 0) omp_set_num_threads(xknn_thread_budget());
#endif
    }
#endif

    /* Backend availability. A rank may see no device (a node without GPUs, an empty
     * CUDA_VISIBLE_DEVICES): --backend cuda then fails, naming the rank; auto searches
     * on the CPU there, with the same results by contract. */
    {
        const int built = xknn_backend_built(XKNN_BACKEND_CUDA);
        const int ndev = built ? xknn_cuda_device_count() : 0;
        if (r->o.backend == XKNN_BACKEND_CUDA && !built) {
            st = knn__fail(&err, XKNN_ERROR_NOT_BUILT,
                           "--backend cuda: this xknn was built without CUDA (reconfigure with -Dcuda=enabled)");
        } else if (r->o.backend == XKNN_BACKEND_CUDA && ndev <= 0) {
            const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
            st = knn__fail(&err, XKNN_ERROR_NO_DEVICE,
                           "no CUDA device is visible to this process (--backend cuda needs one on every rank%s%.64s%s%s)",
                           cvd ? "; CUDA_VISIBLE_DEVICES='" : "", cvd ? cvd : "", cvd ? "'" : "",
                           knn__narrowed_note());
            knn__prefix_rank(&err, r->rank, r->size);
        }
        if ((st = knn__agree(r, st, &err)) != XKNN_SUCCESS) goto report;
#ifdef XKNN_HAVE_MPI
        if (r->o.backend == XKNN_BACKEND_AUTO && built &&
            (st = knn__device_census(r, ndev > 0, &err)) != XKNN_SUCCESS)
            goto report;
#endif
    }

    if ((st = knn__plan(r, &err)) != XKNN_SUCCESS) goto report;
    r->pred.labels_path = r->o.labels;
    r->pred.targets_path = r->o.targets;
    r->pred.qlabels_path = r->o.query_labels;
    r->pred.out_path = r->o.predict;
    r->pred.vote = r->o.vote;
    r->pred.verbose = r->o.verbose;
#ifdef XKNN_HAVE_MPI
    st = knn_predict_open(&r->pred, r->comm, r->ctx, r->n, r->nq, r->o.metric, &err);
#else
    st = knn_predict_open(&r->pred, r->n, r->nq, r->o.metric, &err);
#endif
    if (st != XKNN_SUCCESS) goto report;
    if ((st = knn__open_output(r, &err)) != XKNN_SUCCESS) goto report;
    if (r->o.verbose && r->rank == 0) {
        fprintf(stderr, "knn_mpi: ref %s n=%lld d=%lld; %s%s nq=%lld; k=%lld %s; ranks=%d, up to %lld rows per rank\n",
                r->o.ref, (long long)r->n, (long long)r->d, r->o.query ? "query " : "self-join",
                r->o.query ? r->o.query : "", (long long)r->nq, (long long)r->o.k, xknn_metric_name(r->o.metric),
                r->size, (long long)((r->n + r->size - 1) / r->size));
        if (r->no_result)
            fprintf(stderr, "knn_mpi: no neighbour file (--predict without -o)\n");
        else
            fprintf(stderr, "knn_mpi: output %s (%s), temporary %s\n", r->output, knn__result_format_name(r),
                    r->outs.f[r->slot_result].tmp);
        if (r->pred.out_path)
            fprintf(stderr, "knn_mpi: predictions %s (%s vote), temporary %s\n", r->pred.out_path,
                    xknn_vote_name(r->pred.vote), r->outs.f[r->pred.slot].tmp);
#ifdef XKNN_HAVE_MPI
        if (one_node_pml)
            fprintf(stderr, "knn_mpi: every rank on one node: Open MPI's pml ob1 (OMPI_MCA_pml or --mca pml "
                            "chooses another)\n");
        if (knn_narrowed())
            fprintf(stderr, "knn_mpi: CUDA_VISIBLE_DEVICES=%s on rank 0, its GPU alone (set it to choose)\n",
                    getenv("CUDA_VISIBLE_DEVICES"));
#endif
    }
    if ((st = knn__read_warm(r, early_device, t_begin, &err)) != XKNN_SUCCESS) goto report;
    r->params.weights = r->weights;
    r->params.weights_count = r->weights ? r->dsearch : 0;
    st = knn__search_and_write(r, &err);

report:
    r->t_total = knn__now() - t_begin;
    knn__max_doubles(r, &r->t_total, 1);
    if (st == XKNN_SUCCESS) st = knn__commit_outputs(r, st, &err);
    code = knn__exit_code(st);
    {
        /* whether any rank ran out of room: a write error is a resource error (exit 3)
         * then, on every rank */
        double v = r->outs.no_space;
        knn__max_doubles(r, &v, 1);
        if (st == XKNN_ERROR_IO && v > 0) code = EXIT_RESOURCE;
    }
    if (st == XKNN_SUCCESS) {
        const double qps = r->t_query > 0 ? (double)r->nq / r->t_query : 0.0;
        if (r->rank == 0 && !r->o.quiet) {
            char acc[32] = "";
            knn_predict_print_confusion(&r->pred, stdout);
            if (r->pred.qlabels) snprintf(acc, sizeof acc, " accuracy=%.4f", r->pred.accuracy);
            printf("knn_mpi: n=%lld d=%lld nq=%lld k=%lld ranks=%d backend=%s time=%.3fs (search %.3fs) "
                   "%.0f queries/s%s -> %s%s%s\n",
                   (long long)r->n, (long long)r->d, (long long)r->nq, (long long)r->o.k, r->size, r->backend_used,
                   r->t_total, r->t_query, qps, acc, r->no_result ? "" : r->output,
                   r->pred.out_path && !r->no_result ? ", " : "", r->pred.out_path ? r->pred.out_path : "");
            fflush(stdout);
        }
    }
    if (st != XKNN_SUCCESS && r->rank == 0) fprintf(stderr, "knn_mpi: %s\n", err.message);

finalize:
    knn_progress_stop(&r->prog); /* (joined before MPI_Finalize on every path) */
    knn_outs_discard(&r->outs); /* temporaries a failure left (rank 0 removes them) */
    knn_predict_free(&r->pred);
#ifdef XKNN_HAVE_MPI
    xknn_cuda_context_destroy(r->cuctx);
    if (r->ctx) xknn_mpi_destroy(r->ctx);
    MPI_Finalize();
#endif
    free(r->wbuf);
    knn_npz_free(&r->npz);
    free(r->rank_busy);
    free(r->rank_read);
    free(r->rank_work);
    free(r->ref);
    free(r->query);
    free(r->weights);
    free(r->output);
    return code;
}
