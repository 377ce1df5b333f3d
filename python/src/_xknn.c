/* SPDX-License-Identifier: MIT */
/*
 * _xknn.c -- the xknn package's extension: host searches, value checks, the file
 * readers and the result writer, and the device-pointer search of xknn/cuda.h.
 * Arrays arrive through the buffer protocol and are read in place; results go into
 * arrays the Python layer allocated. The GIL is released around every library call
 * that touches rows or files.
 */
#include "xknn_py.h"

#include "xknn/cuda.h"
#include "xknn/io.h"

/* search(ref, query, ids, dist, k, metric, p, backend, threads, weights, bits,
 *        ref_checked): exact k-NN of query (None: self-join) among ref into ids (int64)
 * and dist (float32), nq x k. ref_checked = 1: ref's values were checked by check()
 * and have not changed since; the query is checked here, then the library skips its
 * scan of both. */
static PyObject *py_search(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"ref",     "query",   "ids",     "dist", "k",           "metric", "p",
                            "backend", "threads", "weights", "bits", "ref_checked", NULL};
    PyObject *ref_o, *query_o, *ids_o, *dist_o, *weights_o;
    const char *metric, *backend;
    long long k, bits;
    double p;
    int threads, ref_checked, wheld = 0, ok = 0;
    Py_buffer rv, qv, iv, dv, wv;
    int have_q = 0, have_i = 0, have_d = 0;
    xknn_matrix rm, qm;
    xknn_params prm;
    xknn_error err;
    xknn_status st = XKNN_SUCCESS;
    int64_t nq, no_ids = 0;
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOLsdsiOLp", names, &ref_o, &query_o, &ids_o, &dist_o, &k, &metric,
                                     &p, &backend, &threads, &weights_o, &bits, &ref_checked))
        return NULL;
    if (xknn_py_params(metric, p, backend, threads, weights_o, &prm, &wv, &wheld) != 0) return NULL;
    if (xknn_py_matrix(ref_o, "reference", bits, 0, &rm, &rv) != 0) goto done_w;
    if (query_o != Py_None) {
        if (xknn_py_matrix(query_o, "query", bits, 0, &qm, &qv) != 0) goto done;
        have_q = 1;
    }
    nq = have_q ? qm.rows : rm.rows;
    if (k > 0 && nq > 0 && k <= PY_SSIZE_T_MAX / 8 / nq) {
        if (xknn_py_out(ids_o, "ids", (Py_ssize_t)(nq * k * 8), &iv) != 0) goto done;
        have_i = 1;
        if (xknn_py_out(dist_o, "dist", (Py_ssize_t)(nq * k * 4), &dv) != 0) goto done;
        have_d = 1;
    }
    Py_BEGIN_ALLOW_THREADS
    if (ref_checked && have_q) {
        prm.values_checked = 0;
        st = xknn_check_input(&prm, "query", &qm, 0, &err);
    }
    if (st == XKNN_SUCCESS) {
        prm.values_checked = ref_checked;
        /* without outputs (k < 1, or k beyond any array) the library refuses k with its
         * own message before it writes anything */
        st = xknn_search(&prm, &rm, have_q ? &qm : NULL, (int64_t)k, have_i ? (int64_t *)iv.buf : &no_ids,
                         have_d ? (float *)dv.buf : NULL, &err);
    }
    Py_END_ALLOW_THREADS
    if (st == XKNN_SUCCESS && !have_i) {
        err.status = XKNN_ERROR_INTERNAL;
        snprintf(err.message, sizeof err.message, "k=%lld with %lld queries does not fit an array", k,
                 (long long)nq);
        st = err.status;
    }
    if (st != XKNN_SUCCESS) xknn_py_raise(&err);
    else ok = 1;
done:
    if (have_d) PyBuffer_Release(&dv);
    if (have_i) PyBuffer_Release(&iv);
    if (have_q) PyBuffer_Release(&qv);
    PyBuffer_Release(&rv);
done_w:
    if (wheld) PyBuffer_Release(&wv);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* check(rows, what, metric, p, weights, bits, row_offset): xknn_check_input on a host
 * array (rows named what, row_offset + i in messages). */
static PyObject *py_check(PyObject *self, PyObject *args)
{
    PyObject *rows_o, *weights_o;
    const char *what, *metric;
    double p;
    long long bits, row_offset;
    int wheld = 0;
    Py_buffer rv, wv;
    xknn_matrix m;
    xknn_params prm;
    xknn_error err;
    xknn_status st;
    (void)self;
    if (!PyArg_ParseTuple(args, "OssdOLL", &rows_o, &what, &metric, &p, &weights_o, &bits, &row_offset)) return NULL;
    if (xknn_py_params(metric, p, "auto", 0, weights_o, &prm, &wv, &wheld) != 0) return NULL;
    if (xknn_py_matrix(rows_o, what, bits, 0, &m, &rv) != 0) {
        if (wheld) PyBuffer_Release(&wv);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    st = xknn_check_input(&prm, what, &m, (int64_t)row_offset, &err);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&rv);
    if (wheld) PyBuffer_Release(&wv);
    if (st != XKNN_SUCCESS) return xknn_py_raise(&err);
    Py_RETURN_NONE;
}

/* read(path, bin_dtype, as_float32, alloc): probes the file, calls alloc(rows, cols,
 * dtype_name) for a C-contiguous array of that many elements, and reads every row into
 * it: the file's own type (u8, i8, f16, f32; others as float32) or float32. */
static PyObject *py_read(PyObject *self, PyObject *args)
{
    const char *path, *bin_dtype;
    int as_f32;
    PyObject *alloc, *arr;
    xknn_read_opts opts = XKNN_READ_OPTS_INIT;
    xknn_file_info info;
    xknn_error err;
    xknn_status st;
    xknn_dtype dt;
    Py_buffer v;
    (void)self;
    if (!PyArg_ParseTuple(args, "szpO", &path, &bin_dtype, &as_f32, &alloc)) return NULL;
    if (bin_dtype) {
        opts.bin_dtype = xknn_elem_from_name(bin_dtype);
        if (opts.bin_dtype == XKNN_ELEM_COUNT) return PyErr_Format(PyExc_ValueError, "unknown bin_dtype '%s'", bin_dtype);
    }
    Py_BEGIN_ALLOW_THREADS
    st = xknn_file_probe(path, &opts, &info, &err);
    Py_END_ALLOW_THREADS
    if (st != XKNN_SUCCESS) return xknn_py_raise(&err);
    dt = as_f32 ? XKNN_DTYPE_F32 : xknn_file_native_dtype(&info);
    arr = PyObject_CallFunction(alloc, "LLs", (long long)info.rows, (long long)info.cols, xknn_dtype_name(dt));
    if (!arr) return NULL;
    if (xknn_py_out(arr, "read buffer", (Py_ssize_t)xknn_row_bytes(dt, info.cols) * (Py_ssize_t)info.rows, &v) != 0) {
        Py_DECREF(arr);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    st = xknn_file_read_rows_as(path, &info, 0, info.rows, dt, v.buf, &err);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
    if (st != XKNN_SUCCESS) {
        Py_DECREF(arr);
        return xknn_py_raise(&err);
    }
    return arr;
}

/* write_result(path, ids, dist, fmt): xknn_result_write of an nq x k int64 ids array and
 * a float32 dist array (None for .ivecs); fmt "auto", "bin", "bin64" or "ivecs". */
static PyObject *py_write_result(PyObject *self, PyObject *args)
{
    const char *path, *fmt_name;
    PyObject *ids_o, *dist_o;
    Py_buffer iv, dv;
    int have_d = 0;
    long long nq, k;
    xknn_result_format fmt;
    xknn_error err;
    xknn_status st;
    (void)self;
    if (!PyArg_ParseTuple(args, "sOOLLs", &path, &ids_o, &dist_o, &nq, &k, &fmt_name)) return NULL;
    if (!strcmp(fmt_name, "auto")) fmt = XKNN_RESULT_AUTO;
    else if (!strcmp(fmt_name, "bin")) fmt = XKNN_RESULT_BIN;
    else if (!strcmp(fmt_name, "bin64")) fmt = XKNN_RESULT_BIN64;
    else if (!strcmp(fmt_name, "ivecs")) fmt = XKNN_RESULT_IVECS;
    else return PyErr_Format(PyExc_ValueError, "unknown result format '%s': auto, bin, bin64 or ivecs", fmt_name);
    if (nq < 0 || k < 0 || (k > 0 && nq > PY_SSIZE_T_MAX / 8 / k))
        return PyErr_Format(PyExc_ValueError, "result of %lld x %lld is too large", nq, k);
    if (xknn_py_out(ids_o, "ids", (Py_ssize_t)(nq * k * 8), &iv) != 0) return NULL;
    if (dist_o != Py_None) {
        if (xknn_py_out(dist_o, "dist", (Py_ssize_t)(nq * k * 4), &dv) != 0) {
            PyBuffer_Release(&iv);
            return NULL;
        }
        have_d = 1;
    }
    Py_BEGIN_ALLOW_THREADS
    st = xknn_result_write(path, fmt, (int64_t)nq, (int64_t)k, (const int64_t *)iv.buf,
                           have_d ? (const float *)dv.buf : NULL, &err);
    Py_END_ALLOW_THREADS
    if (have_d) PyBuffer_Release(&dv);
    PyBuffer_Release(&iv);
    if (st != XKNN_SUCCESS) return xknn_py_raise(&err);
    Py_RETURN_NONE;
}

/* info(): what this build holds: (cuda built, CUDA devices usable now). */
static PyObject *py_info(PyObject *self, PyObject *args)
{
    (void)self;
    (void)args;
    return Py_BuildValue("(ii)", xknn_backend_built(XKNN_BACKEND_CUDA), xknn_cuda_device_count());
}

/* ---- device arrays (xknn/cuda.h) ------------------------------------------------------ */

#define XKNN_PY_CUDA_CAPSULE "xknn.cuda_context"

/* cuda_context(device): a context on that device ordinal, kept by the caller for the
 * life of the process (its destruction needs the device idle, which a capsule
 * destructor at exit cannot promise). */
static PyObject *py_cuda_context(PyObject *self, PyObject *args)
{
    int device;
    xknn_cuda_context *ctx = NULL;
    xknn_error err;
    xknn_status st;
    (void)self;
    if (!PyArg_ParseTuple(args, "i", &device)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = xknn_cuda_context_create(device, &ctx, &err);
    Py_END_ALLOW_THREADS
    if (st != XKNN_SUCCESS) return xknn_py_raise(&err);
    return PyCapsule_New(ctx, XKNN_PY_CUDA_CAPSULE, NULL);
}

/* Parameters of a device search: metric (l2, euclidean, ip, cosine) and p unused. */
static int xknn_py_cuda_params(const char *metric, xknn_params *prm)
{
    Py_buffer wv;
    int wheld;
    return xknn_py_params(metric, 0.0, "cuda", 0, NULL, prm, &wv, &wheld);
}

/* cuda_workspace_size(ctx, metric, n, nq, d, k): preferred workspace bytes. */
static PyObject *py_cuda_workspace_size(PyObject *self, PyObject *args)
{
    PyObject *cap;
    const char *metric;
    long long n, nq, d, k;
    xknn_cuda_context *ctx;
    xknn_params prm;
    xknn_error err;
    xknn_status st;
    size_t bytes = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "OsLLLL", &cap, &metric, &n, &nq, &d, &k)) return NULL;
    if (!(ctx = (xknn_cuda_context *)PyCapsule_GetPointer(cap, XKNN_PY_CUDA_CAPSULE))) return NULL;
    if (xknn_py_cuda_params(metric, &prm) != 0) return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = xknn_cuda_workspace_size(ctx, &prm, n, nq, d, k, &bytes, &err);
    Py_END_ALLOW_THREADS
    if (st != XKNN_SUCCESS) return xknn_py_raise(&err);
    return PyLong_FromSize_t(bytes);
}

/* cuda_search(ctx, metric, ref, n, d, query, nq, k, ids, dist, ws, ws_bytes, stream):
 * pointers as integers (device memory; query 0: self-join; stream 0: the legacy default
 * stream). Enqueues the search on the stream and returns; the caller's array library
 * orders later work on that stream after it. */
static PyObject *py_cuda_search(PyObject *self, PyObject *args)
{
    PyObject *cap;
    const char *metric;
    unsigned long long ref, query, ids, dist, ws, stream;
    long long n, d, nq, k, ws_bytes;
    xknn_cuda_context *ctx;
    xknn_matrix rm, qm;
    xknn_params prm;
    xknn_error err;
    xknn_status st;
    (void)self;
    if (!PyArg_ParseTuple(args, "OsKLLKLLKKKLK", &cap, &metric, &ref, &n, &d, &query, &nq, &k, &ids, &dist, &ws,
                          &ws_bytes, &stream))
        return NULL;
    if (!(ctx = (xknn_cuda_context *)PyCapsule_GetPointer(cap, XKNN_PY_CUDA_CAPSULE))) return NULL;
    if (xknn_py_cuda_params(metric, &prm) != 0) return NULL;
    rm.data = (const void *)(uintptr_t)ref;
    rm.rows = n;
    rm.cols = d;
    rm.ld = 0;
    rm.dtype = XKNN_DTYPE_F32;
    qm = rm;
    qm.data = (const void *)(uintptr_t)query;
    qm.rows = nq;
    Py_BEGIN_ALLOW_THREADS
    st = xknn_cuda_search(ctx, &prm, &rm, query ? &qm : NULL, k, (int64_t *)(uintptr_t)ids,
                          (float *)(uintptr_t)dist, (void *)(uintptr_t)ws, (size_t)ws_bytes, &err,
                          (struct CUstream_st *)(uintptr_t)stream);
    Py_END_ALLOW_THREADS
    if (st != XKNN_SUCCESS) return xknn_py_raise(&err);
    Py_RETURN_NONE;
}

XKNN_PY_MODULE_DEF(xknn_py_module, "_xknn", "xknn's C extension (use the xknn package)",
    {"search", (PyCFunction)(void (*)(void))py_search, METH_VARARGS | METH_KEYWORDS, "exact k-NN on host arrays"},
    {"check", py_check, METH_VARARGS, "xknn_check_input on a host array"},
    {"read", py_read, METH_VARARGS, "read a data file"},
    {"write_result", py_write_result, METH_VARARGS, "write a result file"},
    {"info", py_info, METH_NOARGS, "(cuda built, CUDA devices)"},
    {"cuda_context", py_cuda_context, METH_VARARGS, "a CUDA context on a device"},
    {"cuda_workspace_size", py_cuda_workspace_size, METH_VARARGS, "device workspace bytes"},
    {"cuda_search", py_cuda_search, METH_VARARGS, "exact k-NN on device pointers"});

PyMODINIT_FUNC PyInit__xknn(void)
{
    PyObject *m = PyModule_Create(&xknn_py_module);
    if (m && PyModule_AddStringConstant(m, "__version__", XKNN_PY_VERSION) != 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
