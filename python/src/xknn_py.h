/* SPDX-License-Identifier: MIT */
/*
 * xknn_py.h -- what the two extension modules (_xknn, _xknn_mpi) share: library errors
 * as Python exceptions, host buffers as xknn matrices, and the search parameters.
 * Static functions: each module compiles its own copy.
 */
#ifndef XKNN_PY_H
#define XKNN_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "xknn.h"

/* ValueError for what the caller got wrong, MemoryError, OSError for files, and
 * RuntimeError for the device, MPI and internal failures. The exception carries the
 * library's message; its `status` attribute names the library status. */
static inline PyObject *xknn_py_raise(const xknn_error *err)
{
    PyObject *type, *exc, *name;
    switch (err->status) {
    case XKNN_ERROR_INVALID_ARGUMENT:
    case XKNN_ERROR_INVALID_VALUE:
    case XKNN_ERROR_FORMAT: type = PyExc_ValueError; break;
    case XKNN_ERROR_OUT_OF_MEMORY: type = PyExc_MemoryError; break;
    case XKNN_ERROR_IO: type = PyExc_OSError; break;
    default: type = PyExc_RuntimeError; break;
    }
    exc = PyObject_CallFunction(type, "s", err->message[0] ? err->message : xknn_status_string(err->status));
    if (!exc) return NULL;
    name = PyUnicode_FromString(xknn_status_string(err->status));
    if (name) {
        PyObject_SetAttrString(exc, "status", name);
        Py_DECREF(name);
    }
    PyErr_SetObject(type, exc);
    Py_DECREF(exc);
    return NULL;
}

/* The xknn dtype of a buffer's element format (native byte order), or XKNN_DTYPE_COUNT. */
static inline xknn_dtype xknn_py_dtype_of(const Py_buffer *v)
{
    const char *f = v->format ? v->format : "B";
    if (*f == '@' || *f == '=' || *f == '<') f++;
    if (f[1] != '\0') return XKNN_DTYPE_COUNT;
    if (*f == 'f' && v->itemsize == 4) return XKNN_DTYPE_F32;
    if (*f == 'e' && v->itemsize == 2) return XKNN_DTYPE_F16;
    if (*f == 'B' && v->itemsize == 1) return XKNN_DTYPE_U8;
    if (*f == 'b' && v->itemsize == 1) return XKNN_DTYPE_I8;
    return XKNN_DTYPE_COUNT;
}

/*
 * A C-contiguous 2-D host buffer as a matrix over the buffer's own memory (no copy).
 * bits > 0: uint8 rows of packed bits, bits per row; the row's bytes must be a whole
 * number of 8-byte-aligned uint64 words (the Python layer pads other widths).
 * On success the caller releases *view; on failure a ValueError is set and no view is
 * held.
 */
static inline int xknn_py_matrix(PyObject *obj, const char *what, int64_t bits, int writable, xknn_matrix *m,
                          Py_buffer *view)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    xknn_dtype dt;
    if (PyObject_GetBuffer(obj, view, flags) != 0) return -1;
    if (view->ndim != 2) {
        PyErr_Format(PyExc_ValueError, "%s must be a 2-D array (n, d); got %d dimensions", what, view->ndim);
        PyBuffer_Release(view);
        return -1;
    }
    dt = xknn_py_dtype_of(view);
    if (dt == XKNN_DTYPE_COUNT || (bits > 0 && dt != XKNN_DTYPE_U8)) {
        PyErr_Format(PyExc_ValueError, "%s has element format '%s': need %s", what, view->format ? view->format : "?",
                     bits > 0 ? "uint8 rows of packed bits" : "float32, float16, uint8 or int8");
        PyBuffer_Release(view);
        return -1;
    }
    m->data = view->buf;
    m->rows = (int64_t)view->shape[0];
    m->cols = (int64_t)view->shape[1];
    m->ld = 0;
    m->dtype = dt;
    if (bits > 0) {
        const int64_t bytes = (int64_t)view->shape[1];
        if (bytes % 8 != 0 || ((uintptr_t)view->buf % 8) != 0 || bits > 8 * bytes) {
            PyErr_Format(PyExc_ValueError, "%s: packed rows of %lld bytes cannot hold %lld bits as aligned words",
                         what, (long long)bytes, (long long)bits);
            PyBuffer_Release(view);
            return -1;
        }
        m->dtype = XKNN_DTYPE_BIN;
        m->cols = bits;
        m->ld = bytes / 8;
    }
    return 0;
}

/* A writable 1-byte-or-wider buffer of exactly `bytes` bytes (results the Python layer
 * allocated), C-contiguous. */
static inline int xknn_py_out(PyObject *obj, const char *what, Py_ssize_t bytes, Py_buffer *view)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) != 0) return -1;
    if (view->len != bytes) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, need %zd", what, view->len, bytes);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Search parameters from the Python layer's already validated names; a ValueError with
 * the accepted names otherwise. weights: a float32 buffer held in *wview when given
 * (wheld = 1), released by the caller. */
static inline int xknn_py_params(const char *metric, double p, const char *backend, int threads, PyObject *weights,
                          xknn_params *out, Py_buffer *wview, int *wheld)
{
    xknn_params prm = xknn_params_default();
    *wheld = 0;
    prm.metric = xknn_metric_from_name(metric);
    if (prm.metric == XKNN_METRIC_COUNT) {
        PyErr_Format(PyExc_ValueError,
                     "unknown metric '%s': l2 (sqeuclidean), euclidean, l1 (manhattan, cityblock), minkowski, "
                     "chebyshev, ip (inner_product, dot), cosine, hellinger, hamming, whamming",
                     metric);
        return -1;
    }
    if (!strcmp(backend, "auto")) prm.backend = XKNN_BACKEND_AUTO;
    else if (!strcmp(backend, "cpu")) prm.backend = XKNN_BACKEND_CPU;
    else if (!strcmp(backend, "cuda")) prm.backend = XKNN_BACKEND_CUDA;
    else {
        PyErr_Format(PyExc_ValueError, "unknown backend '%s': auto, cpu or cuda", backend);
        return -1;
    }
    if (threads < 0) {
        PyErr_Format(PyExc_ValueError, "threads=%d: need threads >= 1 (or None)", threads);
        return -1;
    }
    prm.num_threads = threads;
    prm.p = p;
    if (weights && weights != Py_None) {
        if (PyObject_GetBuffer(weights, wview, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) return -1;
        *wheld = 1;
        if (wview->ndim != 1 || xknn_py_dtype_of(wview) != XKNN_DTYPE_F32) {
            PyErr_SetString(PyExc_ValueError, "weights must be a 1-D float32 array");
            PyBuffer_Release(wview);
            *wheld = 0;
            return -1;
        }
        prm.weights = (const float *)wview->buf;
        prm.weights_count = (int64_t)wview->shape[0];
    }
    *out = prm;
    return 0;
}

/* Defines `static struct PyModuleDef var`: the module `name` with docstring `doc` over the
 * methods given (PyMethodDef initialisers, at least one; the sentinel is added), single-phase
 * initialisation without per-module state. */
#define XKNN_PY_MODULE_DEF(var, name, doc, ...)                                \
    static PyMethodDef var##_methods[] = {__VA_ARGS__, {NULL, NULL, 0, NULL}}; \
    static struct PyModuleDef var = {PyModuleDef_HEAD_INIT, name, doc, -1, var##_methods, NULL, NULL, NULL, NULL}

#endif /* XKNN_PY_H */
