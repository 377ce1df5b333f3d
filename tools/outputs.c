/* SPDX-License-Identifier: MIT */
/* tools/outputs.c -- see outputs.h: temporaries, pwrite, all-or-nothing rename. */
#define _XOPEN_SOURCE 700 /* realpath */

#include "outputs.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "cmd.h"

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif

/* ---- signals: the temporaries rank 0 created, removed by the handler ------------------ */
static char *volatile knn__sig_tmp[KNN_OUTS_MAX];

static void knn__outs_on_signal(int sig)
{
    int i;
    for (i = 0; i < KNN_OUTS_MAX; i++)
        if (knn__sig_tmp[i]) unlink(knn__sig_tmp[i]); /* async-signal-safe */
    _exit(128 + sig);
}

void knn_outs_catch_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = knn__outs_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

static void knn__sig_register(int i, char *tmp) { knn__sig_tmp[i] = tmp; }

int knn_outs_is_resource_errno(int e)
{
#ifdef EDQUOT
    if (e == EDQUOT) return 1;
#endif
    return e == ENOSPC || e == EFBIG || e == EMFILE || e == ENFILE;
}

/* ---- setup ------------------------------------------------------------------------------ */
void knn_outs_init(knn_outs *o)
{
    memset(o, 0, sizeof *o);
    o->size = 1;
}

#ifdef XKNN_HAVE_MPI
void knn_outs_attach(knn_outs *o, xknn_mpi_context *ctx, MPI_Comm comm)
{
    o->ctx = ctx;
    o->comm = comm;
    o->rank = xknn_mpi_rank(ctx);
    o->size = xknn_mpi_size(ctx);
}
#endif

int knn_outs_add(knn_outs *o, const char *option, const char *path, int rank0_only)
{
    knn_out_file *f = &o->f[o->n];
    f->option = option;
    f->path = path;
    f->tmp = NULL;
    f->fd = -1;
    f->rank0_only = rank0_only;
    return o->n++;
}

static xknn_status knn__outs_agree(knn_outs *o, xknn_status st, xknn_error *err)
{
#ifdef XKNN_HAVE_MPI
    if (o->ctx) {
        int mine = o->no_space, any = mine;
        MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, o->comm);
        o->no_space = any;
        return xknn_mpi_agree(o->ctx, st, err);
    }
#endif
    (void)o;
    (void)err;
    return st;
}

/* ---- collisions -------------------------------------------------------------------------- */
/* The file a path names: its device and inode when it exists; else its directory resolved
 * (realpath) and its last component. 0 on success. */
typedef struct knn__fid {
    int exists;
    dev_t dev;
    ino_t ino;
    char *resolved; /* malloc: absent file */
} knn__fid;

static int knn__fid_of(const char *path, knn__fid *id)
{
    struct stat sb;
    const char *slash = strrchr(path, '/');
    char dir[PATH_MAX], *rdir;
    memset(id, 0, sizeof *id);
    if (stat(path, &sb) == 0) {
        id->exists = 1;
        id->dev = sb.st_dev;
        id->ino = sb.st_ino;
        return 0;
    }
    if (slash && (size_t)(slash - path) >= sizeof dir) return -1;
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) + (slash == path) : 1, slash ? path : ".");
    rdir = realpath(dir, NULL);
    if (!rdir) return -1; /* the directory is missing: opening the output reports it */
    id->resolved = (char *)malloc(strlen(rdir) + strlen(slash ? slash + 1 : path) + 2);
    if (id->resolved) sprintf(id->resolved, "%s/%s", rdir, slash ? slash + 1 : path);
    free(rdir);
    return id->resolved ? 0 : -1;
}

static int knn__fid_same(const knn__fid *a, const knn__fid *b)
{
    if (a->exists || b->exists) return a->exists && b->exists && a->dev == b->dev && a->ino == b->ino;
    return a->resolved && b->resolved && !strcmp(a->resolved, b->resolved);
}

int knn_outs_collision(const knn_outs *o, const char *const *in_opt, const char *const *in_path, int nin, char *msg,
                       size_t msz)
{
    knn__fid out[KNN_OUTS_MAX], in;
    int i, j, hit = 0;
    for (i = 0; i < o->n; i++) knn__fid_of(o->f[i].path, &out[i]);
    for (i = 0; i < o->n && !hit; i++) {
        for (j = 0; j < i && !hit; j++)
            if (knn__fid_same(&out[i], &out[j])) {
                snprintf(msg, msz, "%s %s and %s %s are the same file: give each output its own name",
                         o->f[j].option, o->f[j].path, o->f[i].option, o->f[i].path);
                hit = 1;
            }
        for (j = 0; j < nin && !hit; j++) {
            if (!in_path[j] || knn__fid_of(in_path[j], &in) != 0) continue;
            if (knn__fid_same(&out[i], &in)) {
                snprintf(msg, msz, "%s %s is the input %s %s: an output never overwrites an input", o->f[i].option,
                         o->f[i].path, in_opt[j], in_path[j]);
                hit = 1;
            }
            free(in.resolved);
        }
    }
    for (i = 0; i < o->n; i++) free(out[i].resolved);
    return hit;
}

/* ---- open -------------------------------------------------------------------------------- */
static xknn_status knn__outs_sys_fail(knn_outs *o, xknn_error *err, int e, const char *fmt, const char *a,
                                      const char *b)
{
    char head[3 * 1024];
    if (knn_outs_is_resource_errno(e)) o->no_space = 1;
    snprintf(head, sizeof head, fmt, a, b);
    return knn__fail(err, XKNN_ERROR_IO, "%s: %s", head, strerror(e));
}

/* Rank 0: "DIR/.NAME.xknn-tmp.PID.XXXXXX" made with mkstemp, mode 0666 minus the umask. */
static xknn_status knn__outs_create(knn_outs *o, knn_out_file *f, xknn_error *err)
{
    const char *slash = strrchr(f->path, '/');
    const size_t dir_len = slash ? (size_t)(slash - f->path) + 1 : 0;
    struct stat sb;
    mode_t um;
    long name_max;
    int fd;
    if (stat(f->path, &sb) == 0 && !S_ISREG(sb.st_mode))
        return knn__fail(err, XKNN_ERROR_IO, "%s %s exists and is not a regular file", f->option, f->path);
    f->tmp = (char *)malloc(dir_len + 128);
    if (!f->tmp) return knn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "out of memory");
    /* a name the directory cannot hold fails now, not at the rename after the work */
    snprintf(f->tmp, dir_len + 128, "%.*s", dir_len ? (int)dir_len : 1, dir_len ? f->path : ".");
    name_max = pathconf(f->tmp, _PC_NAME_MAX);
    if (name_max > 0 && strlen(f->path + dir_len) > (size_t)name_max)
        return knn__outs_sys_fail(o, err, ENAMETOOLONG, "cannot write %s %s", f->option, f->path);
    snprintf(f->tmp, dir_len + 128, "%.*s.%.64s.xknn-tmp.%ld.XXXXXX", (int)dir_len, f->path, f->path + dir_len,
             (long)getpid());
    fd = mkstemp(f->tmp);
    if (fd < 0) return knn__outs_sys_fail(o, err, errno, "cannot write %s %s", f->option, f->path);
    knn__sig_register((int)(f - o->f), f->tmp);
    o->created = 1;
    um = umask(0);
    umask(um);
    if (fchmod(fd, 0666 & ~um) != 0) {
        const int e = errno;
        close(fd);
        return knn__outs_sys_fail(o, err, e, "cannot write %s %s", f->option, f->path);
    }
    f->fd = fd;
    return XKNN_SUCCESS;
}

#ifdef XKNN_HAVE_MPI
/* Collective: every rank learns rank 0's temporary names. */
static xknn_status knn__outs_share_names(knn_outs *o, xknn_error *err)
{
    int i, rc = MPI_SUCCESS;
    for (i = 0; i < o->n && rc == MPI_SUCCESS; i++) {
        int64_t len = o->rank == 0 ? (int64_t)strlen(o->f[i].tmp) : 0;
        rc = MPI_Bcast(&len, 1, MPI_INT64_T, 0, o->comm);
        if (rc != MPI_SUCCESS) break;
        if (o->rank != 0 && !(o->f[i].tmp = (char *)malloc((size_t)len + 1)))
            return knn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "rank %d: out of memory", o->rank);
        rc = MPI_Bcast(o->f[i].tmp, (int)len + 1, MPI_CHAR, 0, o->comm);
        /* any rank's SIGINT/SIGTERM handler removes them: mpirun may kill rank 0 before
         * its own handler runs */
        if (rc == MPI_SUCCESS && o->rank != 0) knn__sig_register(i, o->f[i].tmp);
    }
    return rc == MPI_SUCCESS ? XKNN_SUCCESS : knn__mpi_fail(err, o->rank, rc, "MPI_Bcast (output names)");
}
#endif

xknn_status knn_outs_open(knn_outs *o, xknn_error *err)
{
    xknn_status st = XKNN_SUCCESS;
    int i;
    if (o->rank == 0)
        for (i = 0; i < o->n && st == XKNN_SUCCESS; i++) st = knn__outs_create(o, &o->f[i], err);
    if ((st = knn__outs_agree(o, st, err)) != XKNN_SUCCESS) return st;
#ifdef XKNN_HAVE_MPI
    if (o->ctx && o->size > 1) {
        st = knn__outs_share_names(o, err);
        for (i = 0; i < o->n && st == XKNN_SUCCESS && o->rank != 0; i++) {
            if (o->f[i].rank0_only) continue;
            do o->f[i].fd = open(o->f[i].tmp, O_WRONLY);
            while (o->f[i].fd < 0 && errno == EINTR);
            if (o->f[i].fd < 0)
                st = knn__outs_sys_fail(o, err, errno, "cannot open the temporary of %s %s", o->f[i].option,
                                        o->f[i].path);
            if (st != XKNN_SUCCESS) knn__prefix_rank(err, o->rank, o->size);
        }
        st = knn__outs_agree(o, st, err);
    }
#endif
    return st;
}

/* ---- write ------------------------------------------------------------------------------- */
xknn_status knn_outs_write(knn_outs *o, int i, int64_t off, const void *buf, int64_t len, const char *what,
                           xknn_error *err)
{
    knn_out_file *f = &o->f[i];
    const unsigned char *p = (const unsigned char *)buf;
    while (len > 0) {
        const size_t c = (size_t)(len < ((int64_t)1 << 30) ? len : ((int64_t)1 << 30));
        const ssize_t w = pwrite(f->fd, p, c, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            const int e = w < 0 ? errno : ENOSPC; /* no progress on a regular file: no room */
            if (knn_outs_is_resource_errno(e)) o->no_space = 1;
            return knn__fail(err, XKNN_ERROR_IO, "writing %s of %s %s: %s", what, f->option, f->path, strerror(e));
        }
        off += w;
        p += w;
        len -= w;
    }
    return XKNN_SUCCESS;
}

/* ---- commit and discard --------------------------------------------------------------------- */
static xknn_status knn__outs_close_all(knn_outs *o, xknn_error *err)
{
    xknn_status st = XKNN_SUCCESS;
    int i;
    for (i = 0; i < o->n; i++) {
        knn_out_file *f = &o->f[i];
        if (f->fd < 0) continue;
        if (st == XKNN_SUCCESS && fsync(f->fd) != 0 && errno != EINVAL)
            st = knn__outs_sys_fail(o, err, errno, "writing %s %s", f->option, f->path);
        if (close(f->fd) != 0 && st == XKNN_SUCCESS)
            st = knn__outs_sys_fail(o, err, errno, "writing %s %s", f->option, f->path);
        f->fd = -1;
    }
    return st;
}

/* Rank 0: sizes checked, then every temporary renamed; a failed rename removes the
 * outputs already renamed by this run (their earlier contents are gone with the
 * rename, so none of the set stays). */
static xknn_status knn__outs_rename_all(knn_outs *o, const int64_t *size, xknn_error *err)
{
    struct stat sb;
    int i;
    for (i = 0; i < o->n; i++)
        if (size && size[i] >= 0 && (stat(o->f[i].tmp, &sb) != 0 || (int64_t)sb.st_size != size[i]))
            return knn__fail(err, XKNN_ERROR_IO, "%s %s is incomplete (%lld of %lld bytes written)", o->f[i].option,
                             o->f[i].path, stat(o->f[i].tmp, &sb) == 0 ? (long long)sb.st_size : -1LL,
                             (long long)size[i]);
    for (i = 0; i < o->n; i++) {
        if (rename(o->f[i].tmp, o->f[i].path) != 0) {
            const int e = errno, bad = i;
            while (--i >= 0) unlink(o->f[i].path);
            return knn__outs_sys_fail(o, err, e, "cannot rename the temporary of %s %s", o->f[bad].option,
                                      o->f[bad].path);
        }
        knn__sig_register(i, NULL);
        free(o->f[i].tmp);
        o->f[i].tmp = NULL;
    }
    o->created = 0;
    return XKNN_SUCCESS;
}

xknn_status knn_outs_commit(knn_outs *o, xknn_status st, const int64_t *size, xknn_error *err)
{
    if ((st = knn__outs_agree(o, st, err)) == XKNN_SUCCESS) st = knn__outs_agree(o, knn__outs_close_all(o, err), err);
    if (st == XKNN_SUCCESS && o->rank == 0) st = knn__outs_rename_all(o, size, err);
    st = knn__outs_agree(o, st, err);
    if (st != XKNN_SUCCESS) knn_outs_discard(o);
    return st;
}

void knn_outs_discard(knn_outs *o)
{
    int i;
    for (i = 0; i < o->n; i++) {
        knn_out_file *f = &o->f[i];
        if (f->fd >= 0) close(f->fd);
        f->fd = -1;
        if (o->rank == 0 && o->created && f->tmp) {
            knn__sig_register(i, NULL);
            unlink(f->tmp);
        }
        knn__sig_register(i, NULL);
        free(f->tmp);
        f->tmp = NULL;
    }
    o->created = 0;
}
