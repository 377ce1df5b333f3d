/* SPDX-License-Identifier: MIT */
/*
 * _xknn_mpi.c -- xknn.mpi's extension over xknn_mpi.h. The communicator comes from
 * mpi4py as the address of its MPI_Comm handle (MPI._addressof); the library dups it,
 * so its traffic never meets the caller's. Every function here is collective over that
 * communicator and ends the same way on every rank: an error raises the same exception
 * with the same message everywhere. The GIL is released during each collective call.
 */
#include <mpi.h>

#include "xknn_py.h"
#include "xknn_mpi.h"

#define XKNN_PY_MPI_CAPSULE "xknn.mpi_context"

/* The capsule holds a pointer to this box, so destroy() can empty it: a context is
 * freed by the collective destroy() only, never by the garbage collector (which would
 * run at a different moment on each rank). */
typedef struct xknn_py_mpi_box {
    xknn_mpi_context *ctx;
} xknn_py_mpi_box;

static void xknn_py_mpi_box_free(PyObject *cap)
{
    PyMem_Free(PyCapsule_GetPointer(cap, XKNN_PY_MPI_CAPSULE));
}

static xknn_mpi_context *xknn_py_mpi_ctx(PyObject *cap)
{
    xknn_py_mpi_box *box = (xknn_py_mpi_box *)PyCapsule_GetPointer(cap, XKNN_PY_MPI_CAPSULE);
    if (!box) return NULL;
    if (!box->ctx) PyErr_SetString(PyExc_ValueError, "this xknn MPI context was closed");
    return box->ctx;
}

/* create(comm_address, device, query_block): a context over a dup of *comm_address. */
static PyObject *py_create(PyObject *self, PyObject *args)
{
    PyObject *addr_o, *cap;
    int device;
    long long query_block;
    MPI_Comm comm;
    xknn_mpi_config cfg = XKNN_MPI_CONFIG_INIT;
    xknn_py_mpi_box *box;
    xknn_error err;
    xknn_status st;
    void *addr;
    int inited = 0, finalized = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "OiL", &addr_o, &device, &query_block)) return NULL;
    addr = PyLong_AsVoidPtr(addr_o);
    if (!addr) return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_ValueError, "communicator address is NULL");
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized) return PyErr_Format(PyExc_RuntimeError, "MPI is not initialised (import mpi4py.MPI)");
    comm = *(MPI_Comm *)addr;
    cfg.device = device;
    cfg.query_block = query_block;
    if (!(box = (xknn_py_mpi_box *)PyMem_Malloc(sizeof *box))) return PyErr_NoMemory();
    box->ctx = NULL;
    Py_BEGIN_ALLOW_THREADS
    st = xknn_mpi_create(comm, &cfg, &box->ctx, &err);
    Py_END_ALLOW_THREADS
    if (st != XKNN_SUCCESS) {
        PyMem_Free(box);
        return xknn_py_raise(&err);
    }
    if (!(cap = PyCapsule_New(box, XKNN_PY_MPI_CAPSULE, xknn_py_mpi_box_free))) {
        PyMem_Free(box); /* the context stays allocated: freeing it is collective */
        return NULL;
    }
    return cap;
}

/* destroy(ctx): frees the context and its communicator; again is a no-op. */
static PyObject *py_destroy(PyObject *self, PyObject *args)
{
    PyObject *cap;
    xknn_py_mpi_box *box;
    xknn_status st;
    (void)self;
    if (!PyArg_ParseTuple(args, "O", &cap)) return NULL;
    if (!(box = (xknn_py_mpi_box *)PyCapsule_GetPointer(cap, XKNN_PY_MPI_CAPSULE))) return NULL;
    if (box->ctx) {
        xknn_mpi_context *ctx = box->ctx;
        box->ctx = NULL;
        Py_BEGIN_ALLOW_THREADS
        st = xknn_mpi_destroy(ctx);
        Py_END_ALLOW_THREADS
        if (st != XKNN_SUCCESS) return PyErr_Format(PyExc_RuntimeError, "xknn_mpi_destroy: %s", xknn_status_string(st));
    }
    Py_RETURN_NONE;
}

/* agree(ctx, message): message is this rank's failure (None: success). Raises on every
 * rank where any rank failed, with the lowest failing rank's message. */
static PyObject *py_agree(PyObject *self, PyObject *args)
{
    PyObject *cap;
    const char *msg;
    xknn_mpi_context *ctx;
    xknn_error err;
    xknn_status st;
    (void)self;
    if (!PyArg_ParseTuple(args, "Oz", &cap, &msg)) return NULL;
    if (!(ctx = xknn_py_mpi_ctx(cap))) return NULL;
    err.status = msg ? XKNN_ERROR_INVALID_ARGUMENT : XKNN_SUCCESS;
    snprintf(err.message, sizeof err.message, "%s", msg ? msg : "");
    Py_BEGIN_ALLOW_THREADS
    st = xknn_mpi_agree(ctx, err.status, &err);
    Py_END_ALLOW_THREADS
    if (st != XKNN_SUCCESS) {
        err.status = st;
        return xknn_py_raise(&err);
    }
    Py_RETURN_NONE;
}

/* rank_size(ctx): (rank, size) of the context's communicator. */
static PyObject *py_rank_size(PyObject *self, PyObject *args)
{
    PyObject *cap;
    xknn_mpi_context *ctx;
    (void)self;
    if (!PyArg_ParseTuple(args, "O", &cap)) return NULL;
    if (!(ctx = xknn_py_mpi_ctx(cap))) return NULL;
    return Py_BuildValue("(ii)", xknn_mpi_rank(ctx), xknn_mpi_size(ctx));
}

/* What one search call holds: the buffers to release. */
typedef struct xknn_py_mpi_call {
    Py_buffer rv, qv, iv, dv, wv;
    int have_r, have_q, have_i, have_d, have_w;
} xknn_py_mpi_call;

static void xknn_py_mpi_release(xknn_py_mpi_call *c)
{
    if (c->have_d) PyBuffer_Release(&c->dv);
    if (c->have_i) PyBuffer_Release(&c->iv);
    if (c->have_q) PyBuffer_Release(&c->qv);
    if (c->have_r) PyBuffer_Release(&c->rv);
    if (c->have_w) PyBuffer_Release(&c->wv);
}

/* This rank's pending Python exception as its message for agree(), cleared. */
static void xknn_py_mpi_take_error(xknn_error *err)
{
    PyObject *type, *value, *tb, *str;
    PyErr_Fetch(&type, &value, &tb);
    str = value ? PyObject_Str(value) : NULL;
    err->status = XKNN_ERROR_INVALID_ARGUMENT;
    snprintf(err->message, sizeof err->message, "%s", str && PyUnicode_Check(str) ? PyUnicode_AsUTF8(str) : "bad argument");
    PyErr_Clear();
    Py_XDECREF(str);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

/* This rank's arguments as the library's: params and the buffers. A failure leaves a
 * Python exception set. */
static int xknn_py_mpi_args(xknn_py_mpi_call *c, PyObject *const o[5], const char *metric, double p,
                            const char *backend, int threads, int64_t bits, xknn_params *prm, xknn_matrix *rm,
                            xknn_matrix *qm)
{
    if (xknn_py_params(metric, p, backend, threads, o[4], prm, &c->wv, &c->have_w) != 0) return -1;
    if (o[0] != Py_None) {
        if (xknn_py_matrix(o[0], "reference", bits, 0, rm, &c->rv) != 0) return -1;
        c->have_r = 1;
    }
    if (o[1] != Py_None) {
        if (xknn_py_matrix(o[1], "query", bits, 0, qm, &c->qv) != 0) return -1;
        c->have_q = 1;
    }
    if (o[2] != Py_None) {
        if (PyObject_GetBuffer(o[2], &c->iv, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) != 0) return -1;
        c->have_i = 1;
    }
    if (o[3] != Py_None) {
        if (PyObject_GetBuffer(o[3], &c->dv, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) != 0) return -1;
        c->have_d = 1;
    }
    return 0;
}

/*
 * search(ctx, ref, ref_offset, query, root, self_join, k, ids, dist, metric, p, backend,
 *        threads, weights, bits, local_error): xknn_mpi_search_gather. ref: this rank's
 * slice (None: empty); query: the queries on root (None elsewhere and in a self-join);
 * ids/dist: the nq x k outputs on root (None elsewhere). local_error: this rank's
 * message from the Python layer's own checks (None: fine). Every rank first agrees on
 * the arguments, so a bad argument on one rank raises everywhere instead of leaving
 * the others in the search.
 */
static PyObject *py_search(PyObject *self, PyObject *args)
{
    PyObject *cap, *o[5];
    const char *metric, *backend, *local;
    long long ref_offset, k, bits;
    int root, self_join, threads;
    double p;
    xknn_py_mpi_call c;
    xknn_mpi_context *ctx;
    xknn_matrix rm, qm;
    xknn_params prm;
    xknn_error err;
    xknn_status st;
    (void)self;
    memset(&c, 0, sizeof c);
    memset(&rm, 0, sizeof rm);
    memset(&qm, 0, sizeof qm);
    if (!PyArg_ParseTuple(args, "OOLOipLOOsdsiOLz", &cap, &o[0], &ref_offset, &o[1], &root, &self_join, &k, &o[2],
                          &o[3], &metric, &p, &backend, &threads, &o[4], &bits, &local))
        return NULL;
    if (!(ctx = xknn_py_mpi_ctx(cap))) return NULL;
    err.status = XKNN_SUCCESS;
    err.message[0] = '\0';
    if (local) {
        err.status = XKNN_ERROR_INVALID_ARGUMENT;
        snprintf(err.message, sizeof err.message, "%s", local);
    } else if (xknn_py_mpi_args(&c, o, metric, p, backend, threads, bits, &prm, &rm, &qm) != 0) {
        xknn_py_mpi_take_error(&err);
    }
    Py_BEGIN_ALLOW_THREADS
    st = xknn_mpi_agree(ctx, err.status, &err);
    if (st == XKNN_SUCCESS)
        st = xknn_mpi_search_gather(ctx, &prm, c.have_r ? &rm : NULL, ref_offset, c.have_q ? &qm : NULL,
                                    self_join ? XKNN_MPI_SELF_JOIN : root, k, root,
                                    c.have_i ? (int64_t *)c.iv.buf : NULL, c.have_d ? (float *)c.dv.buf : NULL,
                                    &err);
    Py_END_ALLOW_THREADS
    xknn_py_mpi_release(&c);
    if (st != XKNN_SUCCESS) {
        err.status = st;
        return xknn_py_raise(&err);
    }
    Py_RETURN_NONE;
}

XKNN_PY_MODULE_DEF(xknn_py_mpi_module, "_xknn_mpi", "xknn.mpi's C extension (use xknn.mpi)",
    {"create", py_create, METH_VARARGS, "collective: a context over a dup of the communicator"},
    {"destroy", py_destroy, METH_VARARGS, "collective: frees the context"},
    {"agree", py_agree, METH_VARARGS, "collective: agree on this rank's outcome"},
    {"rank_size", py_rank_size, METH_VARARGS, "(rank, size)"},
    {"search", py_search, METH_VARARGS, "collective: distributed exact k-NN gathered on root"});

PyMODINIT_FUNC PyInit__xknn_mpi(void) { return PyModule_Create(&xknn_py_mpi_module); }
