/* SPDX-License-Identifier: MIT */
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
 *   - Input dtypes (xknn_matrix.dtype): f32, f16, bf16, u8, i8 (kept in their type in
 *     memory, each element converted exactly to double inside the canonical distance),
 *     and bit-packed binary (BIN, see below). NaN/Inf (f32, f16, bf16) are errors.
 *   - BIN rows: cols = number of bits d; a row is ceil(d/64) uint64 words; bit b of a
 *     row is bit (b % 64) of word b / 64 (little-endian words); ld counts words (0:
 *     ceil(d/64)). Bits at positions >= d in the last word are ignored (any value).
 *     hamming and whamming need BIN; every other metric rejects it.
 *   - hamming distances are exact integers up to 2^24 bits (rounded once above).
 *   - u8/i8 with l2, euclidean or ip and d <= XKNN_INT8_EXACT_MAX_D (33025): the CPU
 *     computes the distances exactly in int32 (AVX-512 VNNI where the CPU has it); the
 *     values are the canonical ones (integers, rounded once to float). Larger d takes
 *     the canonical double loop (same results, slower).
 *   - Minkowski: p >= 1, finite; integer p <= XKNN_MINKOWSKI_INT_MAX (64) by repeated
 *     multiplication, other p through the library's own exp/log (not libm's), so every
 *     backend computes the same bits.
 *   - The CUDA backend covers every metric and dtype. f32 l2/euclidean take its
 *     certified fast paths (tensor-core, cuBLAS or fused candidates, canonical re-rank);
 *     f32 ip/cosine its tensor-core path (TF32 candidates with a proven bound that
 *     covers the canonical rounding, cosine on unit-length copies of the rows, then the
 *     canonical re-rank) where it applies: d <= 128, at least 4k witness groups of 64
 *     references, the references resident in the memory budget;
 *     u8/i8 l2/euclidean/ip and hamming are exact integers on the integer tensor cores
 *     (int8, or 1-bit AND + popcount) when k is small enough for witnesses (at least 4k
 *     groups of 64 references) and 256 query rows fit shared memory (H100: d <= 512
 *     for 8-bit, 4096 bits);
 *     everything else is computed as canonical values on the device itself (tiles of
 *     double-precision steps, popcounts for bits) with the selection fused in. The
 *     embedding API of xknn/cuda.h takes f32 l2/euclidean, and ip/cosine where the
 *     tensor-core path applies (INVALID_ARGUMENT with the reason otherwise).
 *   - CPU paths (identical results): f32 l2/euclidean and f32 ip/cosine take sgemm
 *     candidates with a proven error bound and a canonical re-rank (with CBLAS); u8/i8
 *     l2/euclidean/ip the integer path below; everything else the canonical double loop
 *     (params.cpu_path = XKNN_CPU_PATH_LOOP forces the loop everywhere).
 *   - Values whose squared norm exceeds about 1e36 make the CPU BLAS paths fall back to
 *     the exact loop (still exact, slower).
 *   - Memory of the CPU backend: O(query_block * (ref_block + k)) per call, never nq*n.
 *
 * SELF-JOIN (query == NULL: the all-kNN graph)
 *   - Symmetric by default (params.self_join = XKNN_SELF_JOIN_AUTO): every canonical
 *     distance is symmetric in its two points bit for bit, so the CPU computes each
 *     pair once and offers it to both points' selections (triangle of tiles, diagonal
 *     tiles with each point's own id skipped): about half the distance work, the same
 *     ids and distance bits as XKNN_SELF_JOIN_PLAIN. The CPU covers every metric and
 *     dtype this way except the paths whose fast kernels are not symmetric yet: u8/i8
 *     l2/euclidean/ip (exact integer path), f32 ip/cosine with CBLAS (sgemm inner-
 *     product path), cpu_path INT8. The CUDA backend does it on its tensor-core path
 *     (f32 l2/euclidean/ip/cosine, d <= 128; for cosine also unit-length copies of
 *     the rows): the CTA of each row block takes the tiles from its diagonal on, and
 *     each off-diagonal tile's bounds feed both its rows' and its columns'
 *     candidates. When the state of all n points exceeds the device memory budget, the
 *     set is halved (recursively) into triangles and rectangles (the pair kernel of
 *     xknn_search_pair), each merged into the lists as it is done (with a caller's
 *     cuda_context, the rows and the lists stay on the device between the parts: each
 *     row is uploaded once, the parts merge there). Other cases run
 *     the plain search; xknn_self_join_why_plain() says which, and params.verbose
 *     prints it. (f32 l2/euclidean whose values are small integers take the symmetric
 *     sgemm path, not the integer one, in a self-join.)
 *   - xknn_search_pair() is the tile primitive, for distributed layers (xknn_mpi.h).
 *
 * METRICS (canonical values; x_t, y_t are the elements converted exactly to double,
 * t = 0 .. d-1 in order; "fma" is the correctly rounded fused multiply-add; every sum is
 * a left-to-right double chain; the result is rounded ONCE to float at the end)
 *   l2          acc = fma(x_t - y_t, x_t - y_t, acc)            value (float)acc
 *   euclidean   the same acc                                    value (float)sqrt(acc)
 *   l1          acc = acc + |x_t - y_t|                          value (float)acc
 *   minkowski   acc = acc + |x_t - y_t|^p  (integer p: r = a, then r = r*a p-1 times;
 *               other p: exp(p*log(a)), 0 for a = 0)          value (float)(acc^(1/p)):
 *               acc for p = 1, sqrt(acc) for p = 2, else exp(log(acc)/p) (0 if acc = 0)
 *   chebyshev   acc = max(acc, |x_t - y_t|)                     value (float)acc
 *   ip          acc = fma(x_t, y_t, acc)                        value (float)acc; LARGER
 *               is nearer: neighbours are ordered by (-value, id) and the value itself
 *               is reported (the padding of pad_missing reports -inf for ip)
 *   cosine      dot = fma(x_t, y_t, dot), nx = fma(x_t, x_t, nx), ny = fma(y_t, y_t, ny)
 *               c = 1 - dot / sqrt(nx*ny) clipped to [0, 2]      value (float)c;
 *               a zero vector (nx = 0 or ny = 0) has cos = 0: value exactly 1
 *   hellinger   s = sqrt(x_t) - sqrt(y_t), acc = fma(s, s, acc)  value (float)sqrt(acc*0.5)
 *               i.e. ||sqrt(x) - sqrt(y)||_2 / sqrt(2) (in [0, 1] for probability
 *               vectors; inputs are not normalised). Inputs must be >= 0: a negative
 *               value is INVALID_VALUE naming its row and column.
 *   hamming     (BIN) number of differing bits, integer sum     value (float)count
 *   whamming    (BIN) acc = acc + |w_b| over differing bits b in increasing b, w from
 *               params.weights (params.weights_count must equal d; finite)
 *                                                               value (float)acc
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

/* Largest d for which u8/i8 l2/euclidean/ip distances fit int32: 65025 d < 2^31. */
#define XKNN_INT8_EXACT_MAX_D 33025

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
    XKNN_METRIC_L1,          /* Manhattan: sum of |x - y|                  */
    XKNN_METRIC_MINKOWSKI,   /* (sum |x - y|^p)^(1/p), p = params.p >= 1   */
    XKNN_METRIC_CHEBYSHEV,   /* max |x - y|                                */
    XKNN_METRIC_IP,          /* inner product, larger is nearer            */
    XKNN_METRIC_COSINE,      /* 1 - cos; zero vector: 1                    */
    XKNN_METRIC_HELLINGER,   /* ||sqrt x - sqrt y|| / sqrt 2, inputs >= 0  */
    XKNN_METRIC_HAMMING,     /* differing bits (BIN dtype)                 */
    XKNN_METRIC_WHAMMING,    /* sum of |weight| of differing bits (BIN)    */
    XKNN_METRIC_COUNT
} xknn_metric;

typedef enum xknn_dtype {
    XKNN_DTYPE_F32 = 0, /* float32                                                    */
    XKNN_DTYPE_F16,     /* IEEE binary16, stored as uint16 bits                       */
    XKNN_DTYPE_BF16,    /* bfloat16, stored as uint16 bits (high half of a float32)   */
    XKNN_DTYPE_U8,      /* uint8                                                      */
    XKNN_DTYPE_I8,      /* int8                                                       */
    XKNN_DTYPE_BIN,     /* bit-packed: cols bits in uint64 words, ld in words         */
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
    XKNN_CPU_PATH_INT8,     /* f32 data whose values are all integers in [0, 255]
                               (or all in [-128, 127]) with l2, euclidean or ip:
                               converted to 8-bit and searched exactly in int32 */
    XKNN_CPU_PATH_COUNT
} xknn_cpu_path;

/* How a self-join (xknn_search with query == NULL) runs. Results are identical. */
typedef enum xknn_self_join {
    XKNN_SELF_JOIN_AUTO = 0, /* symmetric where supported: each distance d(i, j) is
                                computed once and serves both i and j (about half
                                the distance work); else the plain search          */
    XKNN_SELF_JOIN_PLAIN,    /* plain Q = R search (every distance twice)          */
    XKNN_SELF_JOIN_COUNT
} xknn_self_join;

/* A row-major matrix. Memory space depends on the call (host for xknn_search). */
typedef struct xknn_matrix {
    const void *data; /* rows x cols elements of dtype, row i at data + i*ld      */
    int64_t rows;
    int64_t cols;     /* elements per row (BIN: bits per row)                     */
    int64_t ld;       /* elements between consecutive rows; 0 means cols (BIN:
                         uint64 words between rows; 0 means ceil(cols/64))          */
    xknn_dtype dtype; /* XKNN_DTYPE_F32 ...                                       */
} xknn_matrix;

#define XKNN_MATRIX_F32(ptr, nrows, ncols) \
    { (const void *)(ptr), (int64_t)(nrows), (int64_t)(ncols), 0, XKNN_DTYPE_F32 }
/* Any dtype; for XKNN_DTYPE_BIN ncols is the number of bits. */
#define XKNN_MATRIX_TYPED(ptr, nrows, ncols, dtype) \
    { (const void *)(ptr), (int64_t)(nrows), (int64_t)(ncols), 0, (dtype) }

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
    int num_threads;             /* CPU threads; 0: xknn_thread_budget()             */
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
    double p;                    /* Minkowski exponent, >= 1; 0 (INIT): 2             */
    const float *weights;        /* whamming: one weight per bit (|w| is used), host
                                    memory; NULL otherwise                            */
    int64_t weights_count;       /* number of weights: must equal the bit count d     */
    xknn_self_join self_join;    /* XKNN_SELF_JOIN_AUTO (see SELF-JOIN above)         */
    int values_checked;          /* 1: the caller has checked the rows' values
                                    (xknn_check_input) and they have not changed:
                                    xknn_search and xknn_search_pair skip their
                                    NaN/Inf (and hellinger sign) scan of every row.
                                    Unchecked values with 1: undefined results.
                                    0 (INIT): scanned on every call                   */
} xknn_params;

#define XKNN_PARAMS_INIT                                                                                  \
    { XKNN_BACKEND_AUTO, XKNN_METRIC_L2, 0, 0, 0, 0, 0, 0, 0, XKNN_CPU_PATH_AUTO, -1, 0, 0, 0, NULL, 0.0, NULL, 0, \
      XKNN_SELF_JOIN_AUTO, 0 }

/* Error report filled by calls that take one (may be NULL). message is one line,
 * without a trailing newline, naming the argument, row and column at fault. */
typedef struct xknn_error {
    xknn_status status;
    char message[512];
} xknn_error;

/* Not collective. Static string naming a status ("success", "invalid argument"...). */
XKNN_API const char *xknn_status_string(xknn_status status);
XKNN_API const char *xknn_metric_name(xknn_metric metric);
/* Parse "l2" ("sqeuclidean"), "euclidean", "l1" ("manhattan", "cityblock"),
 * "minkowski", "chebyshev", "ip" ("inner_product", "dot"), "cosine", "hellinger",
 * "hamming", "whamming"; returns XKNN_METRIC_COUNT if unknown. */
XKNN_API xknn_metric xknn_metric_from_name(const char *name);
/* Not collective. "f32", "f16", "bf16", "u8", "i8", "bin"; "unknown" out of range. */
XKNN_API const char *xknn_dtype_name(xknn_dtype dtype);
/* Parses the names above (and "float32", "float16", "bfloat16", "uint8", "int8",
 * "bits"); XKNN_DTYPE_COUNT if unknown. */
XKNN_API xknn_dtype xknn_dtype_from_name(const char *name);
/* Not collective. Bytes of one dense row of cols elements of dtype (BIN: cols bits in
 * ceil(cols/64) uint64 words); 0 for an unknown dtype or cols < 0. */
XKNN_API int64_t xknn_row_bytes(xknn_dtype dtype, int64_t cols);
/* Not collective. Elements of a dense row (its default ld): cols, or ceil(cols/64)
 * words for BIN. */
XKNN_API int64_t xknn_row_elems(xknn_dtype dtype, int64_t cols);
XKNN_API const char *xknn_backend_name(xknn_backend backend);
XKNN_API xknn_params xknn_params_default(void);

/* Not collective. Checks a host matrix for what the metric of params (NULL: l2) allows:
 * NaN/Inf (f32, f16, bf16) -> INVALID_VALUE, a negative value with hellinger ->
 * INVALID_VALUE; the message names `what`, the row (row_offset + i) and the column.
 * Also checks the metric/dtype pair, p and the weights (INVALID_ARGUMENT).
 * xknn_search does this itself; distributed layers call it on their slices. */
XKNN_API xknn_status xknn_check_input(const xknn_params *params, const char *what, const xknn_matrix *m,
                                      int64_t row_offset, xknn_error *err);

/* Not collective. The CPU threads a call uses when params.num_threads is 0: OpenMP's
 * default (the CPUs of the affinity mask, or OMP_NUM_THREADS) capped by the CPUs of the
 * affinity mask now and by the CPU quota of the process's cgroup (cpu.max, or
 * cpu.cfs_quota_us / cpu.cfs_period_us), rounded up; at least 1. The quota is read once
 * per process. Host steps that only move or check a few MiB take fewer (one thread per
 * 8 MiB). */
XKNN_API int xknn_thread_budget(void);

/* Not collective. Tells the library that `ranks` processes of one program share this
 * node's CPUs (xknn_mpi_create calls it with its node's rank count). While the affinity
 * mask holds every online CPU (the ranks are not bound) and OMP_NUM_THREADS is unset,
 * xknn_thread_budget then returns this process's share, online CPUs / ranks (at least
 * 1), instead of every CPU for each rank. ranks <= 1: no sharing (the default). */
XKNN_API void xknn_thread_share(int ranks);

/* The element type in which to search stored rows of type ref against rows of type query
 * (cols elements a row) with metric on backend (as resolved: cpu or cuda): float32 where
 * the stored type has no exact fast path of its own for the metric (l2/euclidean on
 * anything but u8/i8 within XKNN_INT8_EXACT_MAX_D on the CPU backend) and where ref and
 * query differ; else ref itself. Widening to float32 is exact, so the results are those
 * of the stored type either way. */
XKNN_API xknn_dtype xknn_search_dtype(xknn_backend backend, xknn_metric metric, xknn_dtype ref, xknn_dtype query,
                                      int64_t cols);

/* 1 if the backend is compiled into this library (0 for an unknown value). */
XKNN_API int xknn_backend_built(xknn_backend backend);
/* 1 if a CUDA device is usable now (0 when not built or no device). */
XKNN_API int xknn_cuda_device_count(void);

/*
 * Exact k-nearest-neighbour search on host arrays.
 *   ref    n x d reference matrix, host memory, row-major with leading dimension; any
 *          dtype (query the same), d in bits for XKNN_DTYPE_BIN.
 *   query  nq x d query matrix, host memory; NULL: self-join of ref (exclude_self is
 *          forced on and query_id_offset = ref_id_offset).
 *   k      neighbours per query, 1 <= k <= n (n - 1 with exclude_self).
 *   ids    nq x k int64 global ids, host memory, row-major (ld = k). Required.
 *   dist   nq x k float distances, host memory, row-major (ld = k). May be NULL.
 *   err    filled on failure (may be NULL).
 * Synchronous; uses params->num_threads CPU threads, or the CUDA device (host arrays
 * are copied in and results out). Thread-safe: no state is shared between calls.
 * Errors: INVALID_ARGUMENT (also: metric/dtype pair, p, weights), INVALID_VALUE (NaN/Inf, or a
 * negative value with hellinger, with row and column), OUT_OF_MEMORY, NOT_BUILT /
 * NO_DEVICE (backend cuda), DEVICE.
 */
XKNN_API xknn_status xknn_search(const xknn_params *params, const xknn_matrix *ref,
                                 const xknn_matrix *query, int64_t k, int64_t *ids,
                                 float *dist, xknn_error *err);

/*
 * Not collective. NULL when a self-join with these params and dtype (d elements, bits
 * for BIN) takes the symmetric path (see SELF-JOIN), else a static one-line reason why
 * it runs the plain search. backend auto counts as cuda when a CUDA device would take
 * the search. On the cuda backend NULL means "symmetric where the shape allows": the
 * kernel is the tensor-core path's (f32 l2/euclidean/ip/cosine, d <= 128, at least 4k
 * groups of 64 references); where the state of all n points exceeds the device memory
 * budget it runs in blocks (the triangles of halves and their rectangles, as
 * xknn_search_pair does); a shape outside that runs the plain search and params.verbose
 * says why.
 */
XKNN_API const char *xknn_self_join_why_plain(const xknn_params *params, xknn_dtype dtype, int64_t d);

/*
 * Not collective. NULL when xknn_search_pair() takes these params and dtype on the
 * backend that xknn_search() would use, else a static one-line reason. On the cuda
 * backend: f32 l2/euclidean/ip/cosine with d <= 128 (the tensor-core path's). A
 * distributed self-join (xknn_mpi.h) runs its symmetric ring when this is NULL on every
 * rank.
 */
XKNN_API const char *xknn_search_pair_why_not(const xknn_params *params, xknn_dtype dtype, int64_t d);

/*
 * Symmetric tile update, the primitive of the symmetric self-join. Host memory. Not
 * collective. On the backend xknn_search() would use where xknn_search_pair_why_not()
 * is NULL (else on the CPU; backend cuda: INVALID_ARGUMENT with the reason). The cuda
 * backend runs the tensor-core pair kernel (each tile of a x b feeds both sides; a
 * against itself: the symmetric self-join's triangle) and merges into the lists on the
 * host; a pair whose state exceeds the device memory budget runs in parts (halves, each
 * merged as it is done; with a caller's cuda_context both sides' lists stay on the
 * device until the last part, and the parts merge there), and a part too small for the
 * kernel (fewer than 128 k rows on a side) runs on the CPU. Rows that params.cuda_context keeps on the device
 * (xknn_cuda_keep_rows, include/xknn/cuda.h) are read there instead of uploaded. params
 * also: device, cuda_context, cuda_path (auto or mma), device_memory_budget.
 *   a, b         row-major blocks of the same dtype and d (b may be NULL: a against
 *                itself); global ids a_id0 + i and b_id0 + j, ranges not overlapping.
 *   a_ids/a_dist a->rows x k running lists of a's rows (ld = k), sorted by the result
 *                order and padded at the end with id -1 and +inf (-inf for ip); start
 *                from all padding. Updated in place with b's rows as references (with a's
 *                own rows, each row's own id skipped, when b is NULL). l2/euclidean: the
 *                last entry of a row that still ends in padding may carry a bound, a
 *                finite distance with id -1: the caller needs no neighbour beyond it
 *                (ties are kept), and the call may leave those out (a row left short
 *                ends in padding, id -1, whose distance is +inf or the bound).
 *   b_ids/b_dist b->rows x k lists of b's rows, updated with a's rows (unused if b NULL).
 * Each distance is computed once for both lists. After all pairs (i <= j) of blocks of
 * a partition of a reference set have been applied, the lists equal xknn_search's
 * self-join (ids and distance bits). params: metric, p, weights, cpu_path,
 * num_threads, query_block (tile edge; 0: automatic), verbose.
 * Errors: INVALID_ARGUMENT (k < 1, NULL, mismatched d/dtype, metric/dtype), INVALID_VALUE
 * (NaN/Inf, negative with hellinger), OUT_OF_MEMORY.
 */
XKNN_API xknn_status xknn_search_pair(const xknn_params *params, const xknn_matrix *a, int64_t a_id0,
                                      const xknn_matrix *b, int64_t b_id0, int64_t k, int64_t *a_ids, float *a_dist,
                                      int64_t *b_ids, float *b_dist, xknn_error *err);

/*
 * Canonical distance between two float vectors of length d (host memory), the value
 * every backend reports: double accumulation in dimension order with fma, rounded once
 * to float (sqrt of the double sum for XKNN_METRIC_EUCLIDEAN); see METRICS. Real-valued
 * metrics only, minkowski with p = 2; NaN for hamming, whamming and unknown values
 * (use xknn_distance_ex for those, for p, and for other dtypes). No input checks. Not
 * collective.
 */
XKNN_API float xknn_distance(xknn_metric metric, const float *a, const float *b, int64_t d);

/* Not collective. A reported distance beyond float's range is an input error, never a
 * tie at +Inf (finite values near 3e38 overflow l2, for example): INVALID_VALUE naming
 * the first such pair (query row query_row0 + i, reference id), XKNN_SUCCESS otherwise.
 * Entries with a negative id (padding) are skipped. xknn_search checks its results so. */
XKNN_API xknn_status xknn_check_result(xknn_metric metric, int64_t query_row0, int64_t nq, int64_t k,
                                       const int64_t *ids, const float *dist, xknn_error *err);

/*
 * Canonical distance of any metric and dtype (see METRICS above): the value every
 * backend reports (the inner product itself for ip). a, b: one row each of dtype,
 * host memory, d elements (BIN: d bits). params supplies metric, p and weights (NULL:
 * XKNN_PARAMS_INIT). Not collective. Errors: INVALID_ARGUMENT (bad metric/dtype pair,
 * p, weights), INVALID_VALUE (NaN/Inf, negative input for hellinger).
 */
XKNN_API xknn_status xknn_distance_ex(const xknn_params *params, xknn_dtype dtype, const void *a, const void *b,
                                      int64_t d, float *out, xknn_error *err);

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

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(_OPENMP)
#include <omp.h>
#endif

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

static const char *const xknn__metric_names[XKNN_METRIC_COUNT] = {
    "l2", "euclidean", "l1", "minkowski", "chebyshev", "ip", "cosine", "hellinger", "hamming", "whamming",
};

const char *xknn_metric_name(xknn_metric metric)
{
    if ((int)metric < 0 || metric >= XKNN_METRIC_COUNT) return "unknown";
    return xknn__metric_names[metric];
}

/* Another name of an enumerator; a table of them ends with a NULL name. */
typedef struct xknn__alias {
    const char *name;
    int value;
} xknn__alias;

/* The enumerator called name: its index among the count names, else the value of its
 * alias; count when it is neither (or NULL). */
static int xknn__from_name(const char *name, const char *const *names, int count, const xknn__alias *aliases)
{
    int i;
    if (!name) return count;
    for (i = 0; i < count; i++)
        if (!strcmp(name, names[i])) return i;
    for (; aliases->name; aliases++)
        if (!strcmp(name, aliases->name)) return aliases->value;
    return count;
}

static const xknn__alias xknn__metric_aliases[] = {
    {"sqeuclidean", XKNN_METRIC_L2}, {"L2", XKNN_METRIC_L2},            {"manhattan", XKNN_METRIC_L1},
    {"cityblock", XKNN_METRIC_L1},   {"inner_product", XKNN_METRIC_IP}, {"dot", XKNN_METRIC_IP}, {NULL, 0}};

xknn_metric xknn_metric_from_name(const char *name)
{
    return (xknn_metric)xknn__from_name(name, xknn__metric_names, (int)XKNN_METRIC_COUNT, xknn__metric_aliases);
}

static const char *const xknn__dtype_names[XKNN_DTYPE_COUNT] = {"f32", "f16", "bf16", "u8", "i8", "bin"};

const char *xknn_dtype_name(xknn_dtype dtype)
{
    if ((int)dtype < 0 || dtype >= XKNN_DTYPE_COUNT) return "unknown";
    return xknn__dtype_names[dtype];
}

static const xknn__alias xknn__dtype_aliases[] = {
    {"float32", XKNN_DTYPE_F32}, {"float16", XKNN_DTYPE_F16}, {"bfloat16", XKNN_DTYPE_BF16},
    {"uint8", XKNN_DTYPE_U8},    {"int8", XKNN_DTYPE_I8},     {"bits", XKNN_DTYPE_BIN}, {NULL, 0}};

xknn_dtype xknn_dtype_from_name(const char *name)
{
    return (xknn_dtype)xknn__from_name(name, xknn__dtype_names, (int)XKNN_DTYPE_COUNT, xknn__dtype_aliases);
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

xknn_dtype xknn_search_dtype(xknn_backend backend, xknn_metric metric, xknn_dtype ref, xknn_dtype query, int64_t cols)
{
    const int int8 = ref == XKNN_DTYPE_U8 || ref == XKNN_DTYPE_I8;
    if (ref != query) return XKNN_DTYPE_F32;
    if ((metric == XKNN_METRIC_L2 || metric == XKNN_METRIC_EUCLIDEAN) &&
        (!int8 || cols > XKNN_INT8_EXACT_MAX_D || backend != XKNN_BACKEND_CPU))
        return XKNN_DTYPE_F32;
    return ref;
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
    xknn__cm_spec spec;
    if (metric == XKNN_METRIC_L2 || metric == XKNN_METRIC_EUCLIDEAN) return xknn__canonical(metric, a, b, d);
    if ((int)metric < 0 || metric >= XKNN_METRIC_HAMMING) return NAN;
    spec.metric = metric;
    spec.dtype = XKNN_DTYPE_F32;
    spec.p = 2.0;
    spec.weights = NULL;
    return xknn__cm_dist_f32(&spec, a, b, d);
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

#if defined(_OPENMP)
/* The online CPUs (0 where unknown), read once: a benign race, every thread reads the
 * same */
static int xknn__online_cpus(void)
{
    static volatile int online = -1;
    if (online < 0) {
        int c = 0;
        char line[256];
        FILE *f = fopen("/sys/devices/system/cpu/online", "r");
        if (f && fgets(line, sizeof line, f)) /* ranges: "0-63" or "0-3,8-11" */
            for (char *p = line; *p && *p != '\n';) {
                char *e;
                const long a = strtol(p, &e, 10);
                long b = a;
                if (e == p) break;
                if (*e == '-') b = strtol(e + 1, &e, 10);
                c += (int)(b - a + 1);
                p = *e == ',' ? e + 1 : e;
            }
        if (f) fclose(f);
        online = c;
    }
    return online;
}
#endif

/* ceil(quota / period) of the cgroup CPU limit, 0 when there is none or it cannot be
 * read: cgroup v2 (the process's own group from /proc/self/cgroup, then the root), v1. */
static int xknn__cgroup_cpus(void)
{
    char line[512], path[600], q[32];
    long long quota = -1, period = 0;
    FILE *f = fopen("/proc/self/cgroup", "r");
    snprintf(path, sizeof path, "/sys/fs/cgroup/cpu.max");
    if (f) {
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "0::", 3)) {
                line[strcspn(line, "\n")] = '\0';
                snprintf(path, sizeof path, "/sys/fs/cgroup%s/cpu.max", strcmp(line + 3, "/") ? line + 3 : "");
                break;
            }
        fclose(f);
    }
    if ((f = fopen(path, "r")) || (f = fopen("/sys/fs/cgroup/cpu.max", "r"))) {
        if (fscanf(f, "%31s %lld", q, &period) == 2 && strcmp(q, "max") != 0) quota = strtoll(q, NULL, 10);
        fclose(f);
    } else if ((f = fopen("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "r"))) {
        if (fscanf(f, "%lld", &quota) != 1) quota = -1;
        fclose(f);
        if ((f = fopen("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "r"))) {
            if (fscanf(f, "%lld", &period) != 1) period = 0;
            fclose(f);
        }
    }
    return quota > 0 && period > 0 ? (int)((quota + period - 1) / period) : 0;
}

/* xknn_thread_share's rank count (1: no sharing) */
static volatile int xknn__share_ranks = 1;
void xknn_thread_share(int ranks) { xknn__share_ranks = ranks > 1 ? ranks : 1; }

int xknn_thread_budget(void)
{
    /* the quota, read once (-1: not yet): a benign race, every thread computes the same */
    static volatile int cgroup = -1;
    int n = 1;
#if defined(_OPENMP)
    /* OpenMP's default follows the affinity mask it saw at start, but OMP_NUM_THREADS may
     * exceed the mask and the mask may shrink later (taskset -p, sched_setaffinity):
     * omp_get_num_procs() is the mask now under libgomp (the start's under libomp). A
     * minimum, so the mask is never counted twice. */
    const int procs = omp_get_num_procs(), share = xknn__share_ranks;
    n = omp_get_max_threads();
    if (procs > 0 && procs < n) n = procs;
    /* unbound ranks of one node: each its share (a bound rank's mask is its share) */
    if (share > 1 && !getenv("OMP_NUM_THREADS")) {
        const int online = xknn__online_cpus();
        if (online > 0 && procs >= online && online / share < n) n = online / share;
    }
#endif
    if (cgroup < 0) cgroup = xknn__cgroup_cpus();
    if (cgroup > 0 && cgroup < n) n = cgroup;
    return n > 0 ? n : 1;
}

/* The thread policy of the host steps around a search (input scans, staging copies,
 * result copy-out and checks): nt when given, else the budget, and at most one thread
 * per XKNN__STEP_BYTES of memory the step touches, so a step of a few MiB runs on the
 * calling thread alone. A team ends when its slowest member does: on an idle machine a
 * fork and join costs microseconds, but on a busy one any member may wait a scheduler
 * slice (milliseconds) for its core. One core reads or copies 8 MiB in about the time of
 * a small search, so only steps that give each thread that much work take more. Big
 * inputs (the CPU backend's scans of large matrices) still get the whole budget. */
#define XKNN__STEP_BYTES ((int64_t)8 << 20)
int xknn__step_threads(int nt, int64_t bytes); /* (also called by the CUDA backend) */
int xknn__step_threads(int nt, int64_t bytes)
{
    const int64_t want = 1 + (bytes > 0 ? bytes : 0) / XKNN__STEP_BYTES;
    const int cap = nt > 0 ? nt : xknn_thread_budget();
    return want < cap ? (int)want : cap;
}

#if defined(_OPENMP)
/* The input scans: the step policy on the matrix's bytes */
#define XKNN__SCAN_THREADS(nt, m) \
    xknn__step_threads((nt), (m)->rows * xknn_row_bytes((m)->dtype, (m)->cols))
#endif

/* Checks a float matrix for NaN/Inf; reports the first offending row and column.
 * Rows are scanned in parallel (OpenMP when the implementation is compiled with it;
 * threads: params.num_threads). */
static xknn_status xknn__check_finite(const char *what, const xknn_matrix *m, int64_t row_offset, int threads,
                                      xknn_error *err)
{
    const float *base = (const float *)m->data;
    const int64_t ld = m->ld ? m->ld : m->cols;
    int64_t i, j, first = m->rows;
    (void)threads;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) reduction(min : first) num_threads(XKNN__SCAN_THREADS(threads, m))
#endif
    for (i = 0; i < m->rows; i++)
        if (i < first && xknn__row_nonfinite(base + i * ld, m->cols)) first = i;
    if (first < m->rows) {
        const float *row = base + first * ld;
        for (j = 0; j < m->cols; j++)
            if (!isfinite(row[j]))
                return xknn__fail(err, XKNN_ERROR_INVALID_VALUE, "%s row %lld column %lld is %s", what,
                                  (long long)(row_offset + first), (long long)j, isnan(row[j]) ? "NaN" : "Inf");
    }
    return XKNN_SUCCESS;
}

static xknn_status xknn__check_matrix(const char *what, const xknn_matrix *m, xknn_error *err);

/* Elements (BIN: uint64 words) in one row of m, and its leading dimension. */
static int64_t xknn__row_elems(xknn_dtype dtype, int64_t cols)
{
    return dtype == XKNN_DTYPE_BIN ? (cols + 63) / 64 : cols;
}

int64_t xknn_row_elems(xknn_dtype dtype, int64_t cols) { return xknn__row_elems(dtype, cols); }

int64_t xknn_row_bytes(xknn_dtype dtype, int64_t cols)
{
    if ((int)dtype < 0 || dtype >= XKNN_DTYPE_COUNT || cols < 0) return 0;
    return xknn__row_elems(dtype, cols) * (int64_t)xknn__dtype_bytes(dtype);
}

static int64_t xknn__ld(const xknn_matrix *m) { return m->ld ? m->ld : xknn__row_elems(m->dtype, m->cols); }

/* The metric, its parameters and the dtype fit together (d: columns, bits for BIN). */
static xknn_status xknn__check_metric(const xknn_params *p, xknn_dtype dtype, int64_t d, xknn_error *err)
{
    const int bin_metric = p->metric == XKNN_METRIC_HAMMING || p->metric == XKNN_METRIC_WHAMMING;
    int64_t b;
    if ((int)p->metric < 0 || p->metric >= XKNN_METRIC_COUNT)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "unknown metric %d", (int)p->metric);
    if ((int)dtype < 0 || dtype >= XKNN_DTYPE_COUNT)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "unknown dtype %d", (int)dtype);
    if (bin_metric && dtype != XKNN_DTYPE_BIN)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                          "metric '%s' needs bit-packed input (dtype bin), got dtype %s", xknn_metric_name(p->metric),
                          xknn_dtype_name(dtype));
    if (!bin_metric && dtype == XKNN_DTYPE_BIN)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                          "metric '%s' does not accept bit-packed input (dtype bin): use hamming or whamming",
                          xknn_metric_name(p->metric));
    if (p->metric == XKNN_METRIC_MINKOWSKI && p->p != 0.0 && !(p->p >= 1.0 && p->p <= 1e300))
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "minkowski p=%g: need a finite p >= 1", p->p);
    if (p->metric == XKNN_METRIC_WHAMMING) {
        if (!p->weights)
            return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "whamming needs weights (params.weights is NULL)");
        if (p->weights_count != d)
            return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                              "whamming: %lld weights for %lld bits: need exactly one weight per bit",
                              (long long)p->weights_count, (long long)d);
        for (b = 0; b < d; b++)
            if (!isfinite(p->weights[b]))
                return xknn__fail(err, XKNN_ERROR_INVALID_VALUE, "whamming weight %lld is %s", (long long)b,
                                  isnan(p->weights[b]) ? "NaN" : "Inf");
    }
    return XKNN_SUCCESS;
}

/* 1 if a 16-bit float (f16: exponent mask 0x7c00; bf16: 0x7f80) is NaN or Inf. */
static int xknn__row_nonfinite16(const uint16_t *row, int64_t cols, uint16_t mask)
{
    uint32_t bad = 0;
    int64_t j;
    for (j = 0; j < cols; j++) bad |= (uint32_t)((row[j] & mask) == mask);
    return bad != 0;
}

/* Values of one matrix: NaN/Inf (float types), negatives (hellinger). First offending
 * row and column in the message; rows scanned in parallel. */
static xknn_status xknn__check_values(const xknn_params *p, const char *what, const xknn_matrix *m,
                                      int64_t row_offset, xknn_error *err)
{
    const int64_t ld = xknn__ld(m), rows = m->rows, cols = m->cols;
    const int hell = p->metric == XKNN_METRIC_HELLINGER;
    int64_t i, j, first = rows;
    if (m->dtype == XKNN_DTYPE_F32) {
        xknn_status st = xknn__check_finite(what, m, row_offset, p->num_threads, err);
        if (st != XKNN_SUCCESS) return st;
    } else if (m->dtype == XKNN_DTYPE_F16 || m->dtype == XKNN_DTYPE_BF16) {
        const uint16_t *base = (const uint16_t *)m->data;
        const uint16_t mask = m->dtype == XKNN_DTYPE_F16 ? 0x7c00u : 0x7f80u;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) reduction(min : first) num_threads(XKNN__SCAN_THREADS(p->num_threads, m))
#endif
        for (i = 0; i < rows; i++)
            if (i < first && xknn__row_nonfinite16(base + i * ld, cols, mask)) first = i;
        if (first < rows) {
            for (j = 0; j < cols; j++) {
                const uint16_t h = base[first * ld + j];
                if ((h & mask) == mask)
                    return xknn__fail(err, XKNN_ERROR_INVALID_VALUE, "%s row %lld column %lld is %s", what,
                                      (long long)(row_offset + first), (long long)j,
                                      (h & (uint16_t)~(mask | 0x8000u)) ? "NaN" : "Inf");
            }
        }
    }
    if (!hell || m->dtype == XKNN_DTYPE_U8) return XKNN_SUCCESS;
    first = rows;
    {
        const unsigned char *base = (const unsigned char *)m->data;
        const size_t eb = xknn__dtype_bytes(m->dtype);
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) reduction(min : first) num_threads(XKNN__SCAN_THREADS(p->num_threads, m))
#endif
        for (i = 0; i < rows; i++) {
            const void *row = base + (size_t)(i * ld) * eb;
            uint32_t neg = 0;
            int64_t t;
            if (i >= first) continue;
            switch (m->dtype) {
            case XKNN_DTYPE_F32:
                for (t = 0; t < cols; t++) neg |= (uint32_t)(XKNN__CM_LOAD_F32(row, t) < 0.0);
                break;
            case XKNN_DTYPE_F16:
                for (t = 0; t < cols; t++) neg |= (uint32_t)(XKNN__CM_LOAD_F16(row, t) < 0.0);
                break;
            case XKNN_DTYPE_BF16:
                for (t = 0; t < cols; t++) neg |= (uint32_t)(XKNN__CM_LOAD_BF16(row, t) < 0.0);
                break;
            default:
                for (t = 0; t < cols; t++) neg |= (uint32_t)(XKNN__CM_LOAD_I8(row, t) < 0.0);
                break;
            }
            if (neg) first = i;
        }
        if (first < rows) {
            const void *row = base + (size_t)(first * ld) * eb;
            for (j = 0; j < cols; j++) {
                double v;
                switch (m->dtype) {
                case XKNN_DTYPE_F32: v = XKNN__CM_LOAD_F32(row, j); break;
                case XKNN_DTYPE_F16: v = XKNN__CM_LOAD_F16(row, j); break;
                case XKNN_DTYPE_BF16: v = XKNN__CM_LOAD_BF16(row, j); break;
                default: v = XKNN__CM_LOAD_I8(row, j); break;
                }
                if (v < 0.0)
                    return xknn__fail(err, XKNN_ERROR_INVALID_VALUE,
                                      "%s row %lld column %lld is %g: hellinger needs non-negative values", what,
                                      (long long)(row_offset + first), (long long)j, v);
            }
        }
    }
    return XKNN_SUCCESS;
}

static xknn_params xknn__resolved(const xknn_params *params)
{
    xknn_params p = params ? *params : xknn_params_default();
    if (p.metric == XKNN_METRIC_MINKOWSKI && p.p == 0.0) p.p = 2.0;
    return p;
}

xknn_status xknn_check_input(const xknn_params *params, const char *what, const xknn_matrix *m, int64_t row_offset,
                             xknn_error *err)
{
    const xknn_params p = xknn__resolved(params);
    xknn_status st;
    if (err) {
        err->status = XKNN_SUCCESS;
        err->message[0] = '\0';
    }
    if (!m || !what) return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "xknn_check_input: NULL argument");
    if ((st = xknn__check_matrix(what, m, err)) != XKNN_SUCCESS) return st;
    if ((st = xknn__check_metric(&p, m->dtype, m->cols, err)) != XKNN_SUCCESS) return st;
    return xknn__check_values(&p, what, m, row_offset, err);
}

xknn_status xknn_distance_ex(const xknn_params *params, xknn_dtype dtype, const void *a, const void *b, int64_t d,
                             float *out, xknn_error *err)
{
    const xknn_params p = xknn__resolved(params);
    xknn_matrix ma = XKNN_MATRIX_TYPED(a, 1, d, dtype), mb = XKNN_MATRIX_TYPED(b, 1, d, dtype);
    xknn__cm_spec spec;
    xknn_status st;
    if (!out) return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "xknn_distance_ex: out is NULL");
    if ((st = xknn_check_input(&p, "a", &ma, 0, err)) != XKNN_SUCCESS) return st;
    if ((st = xknn_check_input(&p, "b", &mb, 0, err)) != XKNN_SUCCESS) return st;
    spec.metric = p.metric;
    spec.dtype = dtype;
    spec.p = p.p;
    spec.weights = p.weights;
    *out = xknn__cm_distance(&spec, a, b, d);
    return XKNN_SUCCESS;
}

static xknn_status xknn__check_matrix(const char *what, const xknn_matrix *m, xknn_error *err)
{
    if (!m->data) return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "%s data is NULL", what);
    if ((int)m->dtype < 0 || m->dtype >= XKNN_DTYPE_COUNT)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "%s has unknown dtype %d", what, (int)m->dtype);
    if (m->rows <= 0)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "%s has %lld rows: need at least 1", what,
                          (long long)m->rows);
    if (m->cols <= 0)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "%s has dimension d=%lld: need d >= 1",
                          what, (long long)m->cols);
    if (m->ld != 0 && m->ld < xknn__row_elems(m->dtype, m->cols))
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                          m->dtype == XKNN_DTYPE_BIN
                              ? "%s leading dimension %lld is smaller than its row of %lld words"
                              : "%s leading dimension %lld is smaller than its %lld columns",
                          what, (long long)m->ld, (long long)xknn__row_elems(m->dtype, m->cols));
    return XKNN_SUCCESS;
}

/* 1 when xknn_search would run these params on a CUDA device */
static int xknn__takes_cuda(const xknn_params *p)
{
    return p->backend == XKNN_BACKEND_CUDA ||
           (p->backend == XKNN_BACKEND_AUTO && xknn__cuda_built() && xknn__cuda_device_count() > 0);
}

/* What the cuda backend's triangle and pair kernels take (the tensor-core path's): 0, or
 * 1 (not f32 l2/euclidean/ip/cosine) or 2 (d > 128). */
static int xknn__cuda_sym_misfit(const xknn_params *p, xknn_dtype dtype, int64_t d)
{
    if (dtype != XKNN_DTYPE_F32 || (p->metric != XKNN_METRIC_L2 && p->metric != XKNN_METRIC_EUCLIDEAN &&
                                    p->metric != XKNN_METRIC_IP && p->metric != XKNN_METRIC_COSINE))
        return 1;
    return d > 128 ? 2 : 0;
}

const char *xknn_self_join_why_plain(const xknn_params *params, xknn_dtype dtype, int64_t d)
{
    static const char *const why[3] = {
        NULL, "the cuda backend's symmetric kernel takes f32 l2/euclidean/ip/cosine only: plain search",
        "the cuda backend's symmetric kernel takes d <= 128: plain search"};
    const xknn_params p = xknn__resolved(params);
    if (p.self_join == XKNN_SELF_JOIN_PLAIN) return "self_join plain asked for";
    if (xknn__takes_cuda(&p)) return why[xknn__cuda_sym_misfit(&p, dtype, d)];
    return xknn__cpu_sym_why_not(&p, dtype, d);
}

const char *xknn_search_pair_why_not(const xknn_params *params, xknn_dtype dtype, int64_t d)
{
    static const char *const why[3] = {NULL, "the cuda backend's pair kernel takes f32 l2/euclidean/ip/cosine only",
                                       "the cuda backend's pair kernel takes d <= 128"};
    const xknn_params p = xknn__resolved(params);
    if (p.self_join == XKNN_SELF_JOIN_PLAIN) return "self_join plain asked for";
    if (xknn__takes_cuda(&p)) return why[xknn__cuda_sym_misfit(&p, dtype, d)];
    return xknn__cpu_sym_why_not(&p, dtype, d);
}

/* One side of xknn_search_pair as the CPU kernel takes it. */
static xknn__sym_side xknn__sym_side_of(const xknn_matrix *m, int64_t id0, int64_t *ids, float *dist)
{
    xknn__sym_side s;
    s.data = m->data;
    s.rows = m->rows;
    s.ld = xknn__ld(m);
    s.id0 = id0;
    s.ids = ids;
    s.dist = dist;
    return s;
}

/* A side of xknn_search_pair: the matrix and the metric, and the values unless the
 * caller has checked them (values_checked: a ring calls the pair on the same rows many
 * times; the scan of a million rows of d = 128 is about 10 ms of each call). */
static xknn_status xknn__check_pair_side(const xknn_params *p, const char *what, const xknn_matrix *m,
                                         int64_t row_offset, xknn_error *err)
{
    xknn_status st;
    if ((st = xknn__check_matrix(what, m, err)) != XKNN_SUCCESS) return st;
    if ((st = xknn__check_metric(p, m->dtype, m->cols, err)) != XKNN_SUCCESS) return st;
    return p->values_checked ? XKNN_SUCCESS : xknn__check_values(p, what, m, row_offset, err);
}

xknn_status xknn_search_pair(const xknn_params *params, const xknn_matrix *a, int64_t a_id0, const xknn_matrix *b,
                             int64_t b_id0, int64_t k, int64_t *a_ids, float *a_dist, int64_t *b_ids, float *b_dist,
                             xknn_error *err)
{
    xknn_params p = xknn__resolved(params);
    xknn__job job;
    xknn__sym_side sa, sb;
    xknn_status st;
    if (err) {
        err->status = XKNN_SUCCESS;
        err->message[0] = '\0';
    }
    if (!a || !a_ids || !a_dist || (b && (!b_ids || !b_dist)))
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "xknn_search_pair: NULL argument");
    if (k < 1) return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "k=%lld: need k >= 1", (long long)k);
    if ((int)p.cpu_path < 0 || p.cpu_path >= XKNN_CPU_PATH_COUNT || p.num_threads < 0 || p.query_block < 0)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "xknn_search_pair: bad cpu_path, num_threads or query_block");
    if ((st = xknn__check_pair_side(&p, "a", a, a_id0, err)) != XKNN_SUCCESS) return st;
    if (b) {
        if ((st = xknn__check_pair_side(&p, "b", b, b_id0, err)) != XKNN_SUCCESS) return st;
        if (b->cols != a->cols || b->dtype != a->dtype)
            return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                              "xknn_search_pair: a is %s d=%lld, b is %s d=%lld: need the same dtype and d",
                              xknn_dtype_name(a->dtype), (long long)a->cols, xknn_dtype_name(b->dtype),
                              (long long)b->cols);
    }
    memset(&job, 0, sizeof job);
    job.dtype = a->dtype;
    job.d = a->cols;
    job.k = k;
    job.params = p;
    job.msg = err ? err->message : NULL;
    job.msg_size = err ? sizeof err->message : 0;
    sa = xknn__sym_side_of(a, a_id0, a_ids, a_dist);
    if (b) sb = xknn__sym_side_of(b, b_id0, b_ids, b_dist);
    if (xknn__takes_cuda(&p)) {
        const char *why = xknn_search_pair_why_not(&p, a->dtype, a->cols);
        if (!why) {
            if (!xknn__cuda_built())
                return xknn__fail(err, XKNN_ERROR_NOT_BUILT,
                                  "backend cuda: this xknn was built without CUDA (reconfigure with -Dcuda=enabled)");
            if (xknn__cuda_device_count() <= 0)
                return xknn__fail(err, XKNN_ERROR_NO_DEVICE, "backend cuda: no CUDA device is available");
            st = xknn__cuda_pair(&job, &sa, b ? &sb : NULL);
            if (err) err->status = st;
            return st;
        }
        if (p.backend == XKNN_BACKEND_CUDA)
            return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "xknn_search_pair: %s (use backend cpu or auto)", why);
    }
    st = xknn__cpu_sym_pair(&job, &sa, b ? &sb : NULL);
    if (err) err->status = st;
    return st;
}

xknn_status xknn_check_result(xknn_metric metric, int64_t query_row0, int64_t nq, int64_t k, const int64_t *ids,
                              const float *dist, xknn_error *err)
{
    const int64_t m = nq * k;
    int64_t i, first = m;
    /* finite distances pass without a look at the ids (padding is +-inf with id -1); a
     * few MB stay on this thread (a parallel region of one thread still resizes the
     * caller's OpenMP team) */
#if defined(_OPENMP)
    /* (the ids are read only beside a distance that is not finite) */
    const int nt = xknn__step_threads(0, m * (int64_t)sizeof *dist);
    if (nt > 1) {
#pragma omp parallel for schedule(static) reduction(min : first) num_threads(nt)
        for (i = 0; i < m; i++)
            if (!(dist[i] >= -FLT_MAX && dist[i] <= FLT_MAX) && ids[i] >= 0 && i < first) first = i;
    } else
#endif
        for (i = 0; i < m && first == m; i++)
            if (!(dist[i] >= -FLT_MAX && dist[i] <= FLT_MAX) && ids[i] >= 0) first = i;
    if (first < m)
        return xknn__fail(err, XKNN_ERROR_INVALID_VALUE,
                          "the %s distance of query row %lld and reference row %lld overflows float (the values "
                          "are too large for this metric: scale them down)",
                          xknn_metric_name(metric), (long long)(query_row0 + first / k), (long long)ids[first]);
    return XKNN_SUCCESS;
}

xknn_status xknn_search(const xknn_params *params, const xknn_matrix *ref, const xknn_matrix *query,
                        int64_t k, int64_t *ids, float *dist, xknn_error *err)
{
    xknn_params p = xknn__resolved(params);
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
        if (query->dtype != ref->dtype)
            return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                              "dtype mismatch: reference is %s, query is %s", xknn_dtype_name(ref->dtype),
                              xknn_dtype_name(query->dtype));
    } else {
        p.exclude_self = 1;
        p.query_id_offset = p.ref_id_offset;
    }
    if (!ids) return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "output ids is NULL");
    if ((st = xknn__check_metric(&p, ref->dtype, ref->cols, err)) != XKNN_SUCCESS) return st;
    if ((int)p.backend < 0 || p.backend >= XKNN_BACKEND_COUNT)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "unknown backend %d", (int)p.backend);
    if ((int)p.cpu_path < 0 || p.cpu_path >= XKNN_CPU_PATH_COUNT)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "unknown cpu_path %d", (int)p.cpu_path);
    if ((int)p.self_join < 0 || p.self_join >= XKNN_SELF_JOIN_COUNT)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "unknown self_join %d", (int)p.self_join);
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

    /* The values. f32 rows without hellinger's sign check that go to the CUDA backend are
     * its to check (kernels/cuda/finite.cu: on the device after the upload, with this
     * scan's message), so values_checked stays 0; any other scan runs here, on the step
     * policy's threads, and marks the job checked. */
    if (!p.values_checked &&
        !(ref->dtype == XKNN_DTYPE_F32 && p.metric != XKNN_METRIC_HELLINGER && xknn__takes_cuda(&p) &&
          xknn__cuda_built() && xknn__cuda_device_count() > 0)) {
        if ((st = xknn__check_values(&p, "reference", ref, 0, err)) != XKNN_SUCCESS) return st;
        if (query && (st = xknn__check_values(&p, "query", query, 0, err)) != XKNN_SUCCESS) return st;
        p.values_checked = 1;
    }

    memset(&job, 0, sizeof job);
    job.dtype = ref->dtype;
    job.ref_data = ref->data;
    job.query_data = query ? query->data : ref->data;
    job.ref = ref->dtype == XKNN_DTYPE_F32 ? (const float *)ref->data : NULL;
    job.n = ref->rows;
    job.d = ref->cols;
    job.ldr = xknn__ld(ref);
    job.query = ref->dtype == XKNN_DTYPE_F32 ? (const float *)job.query_data : NULL;
    job.nq = query ? query->rows : ref->rows;
    job.ldq = query ? xknn__ld(query) : job.ldr;
    job.k = k;
    job.ids = ids;
    job.dist = dist;
    job.params = p;
    job.msg = err ? err->message : NULL;
    job.msg_size = err ? sizeof err->message : 0;
    job.symmetric = !query && p.self_join == XKNN_SELF_JOIN_AUTO;
    if (job.symmetric && p.verbose && xknn__takes_cuda(&p)) {
        const char *why = xknn_self_join_why_plain(&p, job.dtype, job.d);
        if (why) fprintf(stderr, "xknn: self-join: %s\n", why);
    }

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
    if (st == XKNN_SUCCESS && dist) st = xknn_check_result(p.metric, p.query_id_offset, job.nq, k, ids, dist, err);
    if (err) err->status = st;
    return st;
}

#ifdef __cplusplus
}
#endif

#endif /* XKNN__IMPLEMENTATION_DONE */
#endif /* XKNN_IMPLEMENTATION */
