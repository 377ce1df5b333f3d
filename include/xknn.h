/*
 * xknn.h -- exact k-nearest-neighbour search, C99 public API.
 *
 * WHAT IT DOES
 *   Given n reference vectors and nq query vectors of dimension d, xknn returns for
 *   every query the k references nearest to it, exactly: the same ids and the same
 *   distance bits on every backend (CPU, CUDA), block size and MPI rank count.
 *   - Neighbours are ordered by (reported float distance ascending, id ascending).
 *   - The reported distance is canonical: accumulated in double precision in dimension
 *     order with fused multiply-add, rounded once to float. Fast paths (BLAS sgemm,
 *     tensor cores) only propose candidates under a rigorous error bound; the canonical
 *     value decides.
 *   - Self-join (query == NULL): a point is never its own neighbour; duplicates of it
 *     at other ids are.
 *
 * WHAT IT DOES NOT DO
 *   - No approximate search, no index structure, no training: every query is compared
 *     with every reference (tiled and blocked, never an nq x n matrix in memory).
 *   - No global state, no hidden threads beyond OpenMP/BLAS inside a call, no output
 *     padding: k = 0, k > n (k > n - 1 in self-join), n = 0, d = 0 are errors.
 *   - NaN or Inf in any input vector is an error naming the row and column.
 *
 * EXAMPLE (examples/hello_knn.c is this, compiled and run by the tests)
 *
 *     #define XKNN_IMPLEMENTATION   // in exactly one .c file, or link libxknn
 *     #include <xknn.h>
 *     xknn_params p = XKNN_PARAMS_INIT;            // l2, auto backend
 *     xknn_matrix ref = XKNN_MATRIX_F32(xs, n, d);  // row-major host arrays
 *     xknn_matrix qry = XKNN_MATRIX_F32(qs, nq, d);
 *     xknn_error err;
 *     if (xknn_search(&p, &ref, &qry, k, ids, dist, &err) != XKNN_SUCCESS)
 *         fprintf(stderr, "xknn: %s\n", err.message);
 *     // ids[i*k + j], dist[i*k + j]: j-th neighbour of query i
 *
 * COMPILE-TIME OPTIONS
 *   XKNN_IMPLEMENTATION  define in exactly one translation unit before including this
 *                        header to compile the host code (the installed libxknn already
 *                        does: link it and do not define this yourself). The backends
 *                        (kernels/cpu, kernels/cuda) are always compiled into libxknn.
 *                        Two units defining it fail to link ("multiple definition of
 *                        xknn_status_string"); one unit defining it AND linking the
 *                        shared libxknn links silently, the program's copy taking
 *                        precedence (tests/headers checks both).
 *   XKNN_API             decoration of every public function (default: extern).
 *
 * LIMITS
 *   - n, nq, d, k are int64; ids are int64 (global id = params.ref_id_offset + row).
 *   - Input dtype: float32 (dtype field reserved for more types).
 *   - Metrics: XKNN_METRIC_L2 (squared Euclidean, the FAISS/big-ann convention) and
 *     XKNN_METRIC_EUCLIDEAN (its square root).
 *   - Values whose squared norm exceeds about 1e36 make the CPU BLAS path fall back to
 *     the exact loop (still exact, slower).
 *   - Memory of the CPU backend: O(query_block * (ref_block + k)) per call, never nq*n.
 */
#ifndef XKNN_H
#define XKNN_H

#include <stddef.h>
#include <stdint.h>

#ifndef XKNN_API
#define XKNN_API extern
#endif

#define XKNN_VERSION_MAJOR 0
#define XKNN_VERSION_MINOR 1
#define XKNN_VERSION_PATCH 0
#define XKNN_VERSION_STRING "0.1.0"

#ifdef __cplusplus
extern "C" {
#endif

/* Status of every call. 0 is success; xknn_status_string() names each value. */
typedef enum xknn_status {
    XKNN_SUCCESS = 0,
    XKNN_ERROR_INVALID_ARGUMENT, /* bad k, n, d, NULL pointer, unknown enum value  */
    XKNN_ERROR_INVALID_VALUE,    /* NaN or Inf in an input vector                  */
    XKNN_ERROR_OUT_OF_MEMORY,    /* host or device allocation failed               */
    XKNN_ERROR_NOT_BUILT,        /* backend not compiled into this library         */
    XKNN_ERROR_NO_DEVICE,        /* backend built, but no usable device found      */
    XKNN_ERROR_DEVICE,           /* device runtime or library call failed          */
    XKNN_ERROR_IO,               /* file could not be opened, read or written      */
    XKNN_ERROR_FORMAT,           /* file contents do not match its format          */
    XKNN_ERROR_MPI,              /* an MPI call failed                             */
    XKNN_ERROR_INTERNAL,         /* a bug: please report with the message          */
    XKNN_STATUS_COUNT
} xknn_status;

typedef enum xknn_metric {
    XKNN_METRIC_L2 = 0,      /* squared Euclidean distance (default)     */
    XKNN_METRIC_EUCLIDEAN,   /* Euclidean distance: sqrt of XKNN_METRIC_L2 */
    XKNN_METRIC_COUNT
} xknn_metric;

typedef enum xknn_dtype {
    XKNN_DTYPE_F32 = 0,
    XKNN_DTYPE_COUNT
} xknn_dtype;

typedef enum xknn_backend {
    XKNN_BACKEND_AUTO = 0, /* CUDA when built and a device is present, else CPU */
    XKNN_BACKEND_CPU,
    XKNN_BACKEND_CUDA,
    XKNN_BACKEND_COUNT
} xknn_backend;

/* How the CPU backend generates candidates. Results are identical for all values. */
typedef enum xknn_cpu_path {
    XKNN_CPU_PATH_AUTO = 0, /* INT8 when it applies, else BLAS when built in and
                               values are in range, else LOOP                    */
    XKNN_CPU_PATH_BLAS,     /* sgemm candidates + certified canonical re-rank   */
    XKNN_CPU_PATH_LOOP,     /* cache-blocked canonical loop, no BLAS            */
    XKNN_CPU_PATH_INT8,     /* l2/euclidean with every value an integer in
                               [0, 255] or [-128, 127] (each matrix on its own):
                               exact int8 GEMM (oneDNN, needs a VNNI CPU)        */
    XKNN_CPU_PATH_COUNT
} xknn_cpu_path;

/* A row-major matrix. Memory space depends on the call (host for xknn_search). */
typedef struct xknn_matrix {
    const void *data; /* rows x cols elements of dtype, row i at data + i*ld      */
    int64_t rows;
    int64_t cols;
    int64_t ld;       /* elements between consecutive rows; 0 means cols          */
    xknn_dtype dtype; /* XKNN_DTYPE_F32                                          */
} xknn_matrix;

#define XKNN_MATRIX_F32(ptr, nrows, ncols) \
    { (const void *)(ptr), (int64_t)(nrows), (int64_t)(ncols), 0, XKNN_DTYPE_F32 }

/* Search parameters. Zero means default, except where noted; start from
 * XKNN_PARAMS_INIT (or xknn_params_default()). */
typedef struct xknn_params {
    xknn_backend backend;        /* XKNN_BACKEND_AUTO                                 */
    xknn_metric metric;          /* XKNN_METRIC_L2                                    */
    int exclude_self;            /* 1: reference whose global id equals the query's
                                    global id is skipped (self-join)                  */
    int pad_missing;             /* 1: if fewer than k references are available, pad
                                    with id -1 and distance +inf instead of failing
                                    (used by distributed layers on small slices)      */
    int64_t ref_id_offset;       /* global id of reference row 0                     */
    int64_t query_id_offset;     /* global id of query row 0 (for exclude_self)      */
    int num_threads;             /* CPU threads; 0: OpenMP default                   */
    int64_t query_block;         /* queries per block; 0: automatic                  */
    int64_t ref_block;           /* references per block; 0: automatic               */
    xknn_cpu_path cpu_path;      /* XKNN_CPU_PATH_AUTO                               */
    int device;                  /* CUDA device ordinal; -1 (INIT): current device   */
    size_t device_memory_budget; /* bytes the CUDA backend may allocate; 0: free mem */
    int cuda_path;               /* CUDA candidate path; 0: automatic (see backend)  */
    int verbose;                 /* 1: backend prints its choices on stderr          */
    void *cuda_context;          /* optional reusable CUDA context (an
                                    xknn_cuda_context * from include/xknn/cuda.h); it
                                    decides the device. NULL: the host call creates a
                                    temporary one on `device`                         */
} xknn_params;

#define XKNN_PARAMS_INIT \
    { XKNN_BACKEND_AUTO, XKNN_METRIC_L2, 0, 0, 0, 0, 0, 0, 0, XKNN_CPU_PATH_AUTO, -1, 0, 0, 0, NULL }

/* Error report filled by calls that take one (may be NULL). message is one line,
 * without a trailing newline, naming the argument, row and column at fault. */
typedef struct xknn_error {
    xknn_status status;
    char message[512];
} xknn_error;

/* Not collective. Static string naming a status ("success", "invalid argument"...). */
XKNN_API const char *xknn_status_string(xknn_status status);
XKNN_API const char *xknn_metric_name(xknn_metric metric);
/* Parse "l2", "sqeuclidean", "euclidean"; returns XKNN_METRIC_COUNT if unknown. */
XKNN_API xknn_metric xknn_metric_from_name(const char *name);
XKNN_API const char *xknn_backend_name(xknn_backend backend);
XKNN_API xknn_params xknn_params_default(void);

/* 1 if the backend is compiled into this library (0 for an unknown value). */
XKNN_API int xknn_backend_built(xknn_backend backend);
/* 1 if a CUDA device is usable now (0 when not built or no device). */
XKNN_API int xknn_cuda_device_count(void);

/*
 * Exact k-nearest-neighbour search on host arrays.
 *   ref    n x d reference matrix, host memory, row-major with leading dimension.
 *   query  nq x d query matrix, host memory; NULL: self-join of ref (exclude_self is
 *          forced on and query_id_offset = ref_id_offset).
 *   k      neighbours per query, 1 <= k <= n (n - 1 with exclude_self).
 *   ids    nq x k int64 global ids, host memory, row-major (ld = k). Required.
 *   dist   nq x k float distances, host memory, row-major (ld = k). May be NULL.
 *   err    filled on failure (may be NULL).
 * Synchronous; uses params->num_threads CPU threads, or the CUDA device (host arrays
 * are copied in and results out). Thread-safe: no state is shared between calls.
 * Errors: INVALID_ARGUMENT, INVALID_VALUE (NaN/Inf with row and column),
 * OUT_OF_MEMORY, NOT_BUILT / NO_DEVICE (backend cuda), DEVICE.
 */
XKNN_API xknn_status xknn_search(const xknn_params *params, const xknn_matrix *ref,
                                 const xknn_matrix *query, int64_t k, int64_t *ids,
                                 float *dist, xknn_error *err);

/*
 * Canonical distance between two float vectors of length d (host memory), the value
 * every backend reports: double accumulation in dimension order with fma, rounded once
 * to float (sqrt of the double sum for XKNN_METRIC_EUCLIDEAN). Not collective.
 */
XKNN_API float xknn_distance(xknn_metric metric, const float *a, const float *b, int64_t d);

#ifdef __cplusplus
}
#endif

#endif /* XKNN_H */

/* ===================================================================================== */
/*                                  IMPLEMENTATION                                       */
/* ===================================================================================== */
#ifdef XKNN_IMPLEMENTATION
#ifndef XKNN__IMPLEMENTATION_DONE
#define XKNN__IMPLEMENTATION_DONE

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "xknn/impl/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

static const char *const xknn__status_names[XKNN_STATUS_COUNT] = {
    "success",        "invalid argument", "invalid value (NaN or Inf)",
    "out of memory",  "backend not built", "no device",
    "device error",   "I/O error",         "format error",
    "MPI error",      "internal error",
};

const char *xknn_status_string(xknn_status status)
{
    if ((int)status < 0 || status >= XKNN_STATUS_COUNT) return "unknown status";
    return xknn__status_names[status];
}

const char *xknn_metric_name(xknn_metric metric)
{
    switch (metric) {
    case XKNN_METRIC_L2: return "l2";
    case XKNN_METRIC_EUCLIDEAN: return "euclidean";
    default: return "unknown";
    }
}

xknn_metric xknn_metric_from_name(const char *name)
{
    if (!name) return XKNN_METRIC_COUNT;
    if (!strcmp(name, "l2") || !strcmp(name, "sqeuclidean") || !strcmp(name, "L2"))
        return XKNN_METRIC_L2;
    if (!strcmp(name, "euclidean")) return XKNN_METRIC_EUCLIDEAN;
    return XKNN_METRIC_COUNT;
}

const char *xknn_backend_name(xknn_backend backend)
{
    switch (backend) {
    case XKNN_BACKEND_AUTO: return "auto";
    case XKNN_BACKEND_CPU: return "cpu";
    case XKNN_BACKEND_CUDA: return "cuda";
    default: return "unknown";
    }
}

xknn_params xknn_params_default(void)
{
    xknn_params p = XKNN_PARAMS_INIT;
    return p;
}

int xknn_backend_built(xknn_backend backend)
{
    switch (backend) {
    case XKNN_BACKEND_AUTO:
    case XKNN_BACKEND_CPU: return 1;
    case XKNN_BACKEND_CUDA: return xknn__cuda_built();
    default: return 0;
    }
}

int xknn_cuda_device_count(void) { return xknn__cuda_built() ? xknn__cuda_device_count() : 0; }

float xknn_distance(xknn_metric metric, const float *a, const float *b, int64_t d)
{
    return xknn__canonical(metric, a, b, d);
}

/* printf-style fill of an error report; returns status for `return xknn__fail(...)`. */
static xknn_status xknn__fail(xknn_error *err, xknn_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static xknn_status xknn__fail(xknn_error *err, xknn_status status, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        err->status = status;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    }
    return status;
}

/* 1 if row has a NaN or Inf: exponent bits all ones. Branch-free so it vectorises. */
static int xknn__row_nonfinite(const float *row, int64_t cols)
{
    uint32_t bad = 0;
    int64_t j;
    for (j = 0; j < cols; j++) {
        uint32_t u;
        memcpy(&u, row + j, sizeof u);
        bad |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
    }
    return bad != 0;
}

/* Checks a float matrix for NaN/Inf; reports the first offending row and column.
 * Rows are scanned in parallel (OpenMP when the implementation is compiled with it). */
static xknn_status xknn__check_finite(const char *what, const xknn_matrix *m, xknn_error *err)
{
    const float *base = (const float *)m->data;
    const int64_t ld = m->ld ? m->ld : m->cols;
    int64_t i, j, first = m->rows;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) reduction(min : first)
#endif
    for (i = 0; i < m->rows; i++)
        if (i < first && xknn__row_nonfinite(base + i * ld, m->cols)) first = i;
    if (first < m->rows) {
        const float *row = base + first * ld;
        for (j = 0; j < m->cols; j++)
            if (!isfinite(row[j]))
                return xknn__fail(err, XKNN_ERROR_INVALID_VALUE, "%s row %lld column %lld is %s", what,
                                  (long long)first, (long long)j, isnan(row[j]) ? "NaN" : "Inf");
    }
    return XKNN_SUCCESS;
}

static xknn_status xknn__check_matrix(const char *what, const xknn_matrix *m, xknn_error *err)
{
    if (!m->data) return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "%s data is NULL", what);
    if (m->dtype != XKNN_DTYPE_F32)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "%s dtype %d is not supported (float32 only)",
                          what, (int)m->dtype);
    if (m->rows <= 0)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "%s has %lld rows: need at least 1", what,
                          (long long)m->rows);
    if (m->cols <= 0)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "%s has dimension d=%lld: need d >= 1",
                          what, (long long)m->cols);
    if (m->ld != 0 && m->ld < m->cols)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                          "%s leading dimension %lld is smaller than its %lld columns", what,
                          (long long)m->ld, (long long)m->cols);
    return XKNN_SUCCESS;
}

xknn_status xknn_search(const xknn_params *params, const xknn_matrix *ref, const xknn_matrix *query,
                        int64_t k, int64_t *ids, float *dist, xknn_error *err)
{
    xknn_params p = params ? *params : xknn_params_default();
    xknn__job job;
    xknn_status st;
    int64_t avail;

    if (err) {
        err->status = XKNN_SUCCESS;
        err->message[0] = '\0';
    }
    if (!ref) return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "reference matrix is NULL");
    if ((st = xknn__check_matrix("reference", ref, err)) != XKNN_SUCCESS) return st;
    if (query) {
        if ((st = xknn__check_matrix("query", query, err)) != XKNN_SUCCESS) return st;
        if (query->cols != ref->cols)
            return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                              "dimension mismatch: reference has d=%lld, query has d=%lld",
                              (long long)ref->cols, (long long)query->cols);
    } else {
        p.exclude_self = 1;
        p.query_id_offset = p.ref_id_offset;
    }
    if (!ids) return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "output ids is NULL");
    if ((int)p.metric < 0 || p.metric >= XKNN_METRIC_COUNT)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "unknown metric %d", (int)p.metric);
    if ((int)p.backend < 0 || p.backend >= XKNN_BACKEND_COUNT)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "unknown backend %d", (int)p.backend);
    if ((int)p.cpu_path < 0 || p.cpu_path >= XKNN_CPU_PATH_COUNT)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "unknown cpu_path %d", (int)p.cpu_path);
    if (p.num_threads < 0 || p.query_block < 0 || p.ref_block < 0)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                          "num_threads, query_block and ref_block must be >= 0");

    /* How many references can a query see? With exclude_self, one fewer when the
     * query's own global id lies inside this reference slice (always for self-join). */
    avail = ref->rows;
    if (p.exclude_self) {
        int64_t q0 = p.query_id_offset, q1 = q0 + (query ? query->rows : ref->rows);
        int64_t r0 = p.ref_id_offset, r1 = r0 + ref->rows;
        if (q0 < r1 && r0 < q1) avail = ref->rows - 1;
    }
    if (k < 1)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "k=%lld: need k >= 1", (long long)k);
    if (k > avail && !p.pad_missing)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                          p.exclude_self && avail < ref->rows
                              ? "k=%lld is larger than n-1=%lld (self-join excludes each point itself)"
                              : "k=%lld is larger than the number of references n=%lld",
                          (long long)k, (long long)avail);

    if ((st = xknn__check_finite("reference", ref, err)) != XKNN_SUCCESS) return st;
    if (query && (st = xknn__check_finite("query", query, err)) != XKNN_SUCCESS) return st;

    memset(&job, 0, sizeof job);
    job.ref = (const float *)ref->data;
    job.n = ref->rows;
    job.d = ref->cols;
    job.ldr = ref->ld ? ref->ld : ref->cols;
    job.query = query ? (const float *)query->data : job.ref;
    job.nq = query ? query->rows : ref->rows;
    job.ldq = query ? (query->ld ? query->ld : query->cols) : job.ldr;
    job.k = k;
    job.ids = ids;
    job.dist = dist;
    job.params = p;
    job.msg = err ? err->message : NULL;
    job.msg_size = err ? sizeof err->message : 0;

    switch (p.backend) {
    case XKNN_BACKEND_CUDA:
        if (!xknn__cuda_built())
            return xknn__fail(err, XKNN_ERROR_NOT_BUILT,
                              "backend cuda: this xknn was built without CUDA (reconfigure with -Dcuda=enabled)");
        if (xknn__cuda_device_count() <= 0)
            return xknn__fail(err, XKNN_ERROR_NO_DEVICE, "backend cuda: no CUDA device is available");
        st = xknn__cuda_search(&job);
        break;
    case XKNN_BACKEND_AUTO:
        if (xknn__cuda_built() && xknn__cuda_device_count() > 0) {
            st = xknn__cuda_search(&job);
            break;
        }
        st = xknn__cpu_search(&job);
        break;
    default:
        st = xknn__cpu_search(&job);
        break;
    }
    if (err) err->status = st;
    return st;
}

#ifdef __cplusplus
}
#endif

#endif /* XKNN__IMPLEMENTATION_DONE */
#endif /* XKNN_IMPLEMENTATION */
