/* SPDX-License-Identifier: MIT */
/* particles_mpi: a time-stepping particle code over MPI ranks on a resident distributed
 * index (xknn_mpi_index_*), its slices on the CPU ranks or on their GPUs.
 *
 * N particles move in the unit cube with reflecting walls. Rank r owns particles
 * [row0, row0 + rows) of xknn_mpi_slice() for the whole run (ownership by id, not by
 * space); the index is created once over these slices. Every step each rank moves its own
 * particles with a speed that drops in crowded places, v * min(1, r_k / h), r_k the
 * distance to the k-th neighbour of the previous step; writes the moved positions into the
 * index (xknn_mpi_index_update, collective); then every rank in turn is the query root of
 * its own particles and gets the k nearest other particles back, with global ids
 * (xknn_mpi_index_search_gather). The move needs only the particle's own state and its
 * neighbour distances, so no rank ever needs another rank's positions.
 *
 * Check: rank 0 runs the same simulation serially with a brute-force neighbour search
 * (every pair through xknn_distance, ordered by (distance, id)) and, every step,
 * compares the gathered neighbour ids and distance bits and the positions bit for bit.
 * The exact search makes the trajectory independent of the rank count and the backend.
 * Run: mpirun -np 3 ./particles_mpi [N [K [STEPS [cpu|cuda]]]]   (defaults 400 8 10 cpu);
 * cuda keeps each slice on the rank's GPU (local rank mod device count). Exit 0 when every
 * step matched, 1 otherwise, 77 (skip) for cuda where a rank sees no CUDA device; the
 * same on every rank.
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xknn.h>
#include <xknn_mpi.h>

#define D 3

typedef struct particles {
    int64_t n, k;
    float *x, *v;     /* n x D positions and velocities */
    int64_t *ids;     /* n x k neighbour ids            */
    float *dist;      /* n x k squared distances (l2)   */
} particles;

/* A value in [0, 1) on a grid of 1/m steps (coarse grids give exact ties). */
static float hash01(uint64_t h, uint64_t m)
{
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9u;
    h ^= h >> 29;
    h *= 0x94D049BB133111EBu;
    h ^= h >> 32;
    return (float)(h % m) / (float)m;
}

/* Initial state of global particle g, the same whichever rank makes it: positions on
 * a grid of 1/32 steps, so the first steps have neighbours at equal distances. */
static void init_particle(int64_t g, float *x, float *v)
{
    int j;
    for (j = 0; j < D; j++) {
        x[j] = hash01((uint64_t)g * 2654435761u + (uint64_t)j * 97u + 1u, 32);
        v[j] = hash01((uint64_t)g * 40503u + (uint64_t)j * 131u + 7u, 4096) - 0.5f;
    }
}

/* One step of one particle from its k-th neighbour's squared distance. */
static void move_particle(float *x, float *v, float dk2)
{
    const float dt = 0.02f, h = 0.05f;
    float s = sqrtf(dk2) / h;
    int j;
    if (s > 1.0f) s = 1.0f;
    for (j = 0; j < D; j++) {
        x[j] += dt * s * v[j];
        if (x[j] < 0.0f) { x[j] = -x[j]; v[j] = -v[j]; }
        if (x[j] > 1.0f) { x[j] = 2.0f - x[j]; v[j] = -v[j]; }
    }
}

static int alloc_particles(particles *s, int64_t n, int64_t k)
{
    s->n = n;
    s->k = k;
    s->x = malloc((size_t)(n ? n : 1) * D * sizeof *s->x);
    s->v = malloc((size_t)(n ? n : 1) * D * sizeof *s->v);
    s->ids = malloc((size_t)(n ? n : 1) * (size_t)k * sizeof *s->ids);
    s->dist = malloc((size_t)(n ? n : 1) * (size_t)k * sizeof *s->dist);
    return s->x && s->v && s->ids && s->dist;
}

static void free_particles(particles *s)
{
    free(s->x);
    free(s->v);
    free(s->ids);
    free(s->dist);
}

/* Brute force: the k nearest other particles of each particle, by (distance, id),
 * by insertion into a sorted list. */
static void brute_force(particles *s)
{
    int64_t i, j, m, t;
    for (i = 0; i < s->n; i++) {
        int64_t *id = s->ids + i * s->k;
        float *dd = s->dist + i * s->k;
        m = 0;
        for (j = 0; j < s->n; j++) {
            float e;
            if (j == i) continue;
            e = xknn_distance(XKNN_METRIC_L2, s->x + i * D, s->x + j * D, D);
            if (m == s->k && !(e < dd[m - 1])) continue; /* ids rise: a tie keeps the older */
            t = m < s->k ? m++ : m - 1;
            for (; t > 0 && e < dd[t - 1]; t--) {
                dd[t] = dd[t - 1];
                id[t] = id[t - 1];
            }
            dd[t] = e;
            id[t] = j;
        }
    }
}

/* The k nearest other particles from the k + 1 nearest of all, both by (distance, id):
 * the list without the particle's own id, cut at k (its first k when k + 1 others tie
 * ahead of the particle). */
static void drop_self(int64_t self, int64_t k, const int64_t *ids1, const float *dist1, int64_t *ids, float *dist)
{
    int64_t j, m = 0;
    for (j = 0; j <= k && m < k; j++) {
        if (ids1[j] == self) continue;
        ids[m] = ids1[j];
        dist[m] = dist1[j];
        m++;
    }
}

/* The distributed search of one step: every rank, in turn, is the root of its own
 * particles' queries and gathers their neighbours into mine->ids and mine->dist.
 * The index's parameters, query ids included, are fixed at create while each root's
 * particles start at another global id; so the index searches k + 1 without
 * exclude_self and the root drops each particle's own id (drop_self): exclude_self's
 * lists. ids1 and dist1 hold mine->n x (k + 1). */
static xknn_status search_step(xknn_mpi_index *index, int size, int rank, particles *mine, int64_t n,
                               int64_t row0, int64_t *ids1, float *dist1, xknn_error *err)
{
    const int64_t k = mine->k;
    xknn_matrix q = XKNN_MATRIX_F32(mine->x, mine->n, D);
    int64_t i;
    int r;
    for (r = 0; r < size; r++) {
        int64_t r0, rn;
        xknn_status st;
        xknn_mpi_slice(n, r, size, &r0, &rn);
        if (rn == 0) continue; /* the same on every rank */
        st = xknn_mpi_index_search_gather(index, r == rank ? &q : NULL, r, k + 1, r, ids1, dist1, err);
        if (st != XKNN_SUCCESS) return st;
    }
    for (i = 0; i < mine->n; i++)
        drop_self(row0 + i, k, ids1 + i * (k + 1), dist1 + i * (k + 1), mine->ids + i * k, mine->dist + i * k);
    return XKNN_SUCCESS;
}

/* This rank's moved positions into the index (collective; an empty slice writes none). */
static xknn_status update_step(xknn_mpi_index *index, const particles *mine, xknn_error *err)
{
    xknn_matrix m = XKNN_MATRIX_F32(mine->x, mine->n, D);
    return xknn_mpi_index_update(index, 0, mine->n > 0 ? &m : NULL, err);
}

/* Rank 0: gathers every rank's neighbours and positions (before the move) and compares
 * them with the serial brute force; then moves the serial copy. Returns 0 when equal. */
static int check_step(MPI_Comm comm, const particles *mine, particles *all, int step, const int *counts,
                      const int *displs)
{
    int rank, size, i, bad = 0;
    int *c = NULL, *o = NULL;
    int64_t *ids = NULL, q;
    float *dist = NULL, *x = NULL;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    if (rank == 0) {
        c = malloc((size_t)size * 2 * sizeof *c);
        ids = malloc((size_t)all->n * (size_t)all->k * sizeof *ids);
        dist = malloc((size_t)all->n * (size_t)all->k * sizeof *dist);
        x = malloc((size_t)all->n * D * sizeof *x);
        bad = !c || !ids || !dist || !x;
        if (c) o = c + size;
    }
    MPI_Bcast(&bad, 1, MPI_INT, 0, comm);
    if (bad) goto done;
    /* ids, distances and positions travel as counts of rows times their row sizes */
    for (i = 0; rank == 0 && i < size; i++) {
        c[i] = counts[i] * (int)all->k;
        o[i] = displs[i] * (int)all->k;
    }
    MPI_Gatherv(mine->ids, (int)(mine->n * mine->k), MPI_INT64_T, ids, c, o, MPI_INT64_T, 0, comm);
    MPI_Gatherv(mine->dist, (int)(mine->n * mine->k), MPI_FLOAT, dist, c, o, MPI_FLOAT, 0, comm);
    for (i = 0; rank == 0 && i < size; i++) {
        c[i] = counts[i] * D;
        o[i] = displs[i] * D;
    }
    MPI_Gatherv(mine->x, (int)(mine->n * D), MPI_FLOAT, x, c, o, MPI_FLOAT, 0, comm);
    if (rank == 0) {
        brute_force(all);
        if (memcmp(x, all->x, (size_t)all->n * D * sizeof *x)) {
            fprintf(stderr, "particles_mpi: step %d: positions differ from the serial run\n", step);
            bad = 1;
        }
        for (q = 0; !bad && q < all->n; q++) {
            size_t row = (size_t)q * (size_t)all->k, bytes = (size_t)all->k;
            if (memcmp(ids + row, all->ids + row, bytes * sizeof *ids) ||
                memcmp(dist + row, all->dist + row, bytes * sizeof *dist)) {
                size_t j = 0;
                while (ids[row + j] == all->ids[row + j] && !memcmp(dist + row + j, all->dist + row + j, sizeof *dist)) j++;
                fprintf(stderr, "particles_mpi: step %d: particle %lld, neighbour %zu: %lld at %.9g, brute force %lld at %.9g\n",
                        step, (long long)q, j, (long long)ids[row + j], dist[row + j], (long long)all->ids[row + j],
                        all->dist[row + j]);
                bad = 1;
            }
        }
        for (q = 0; q < all->n; q++)
            move_particle(all->x + q * D, all->v + q * D, all->dist[(q + 1) * all->k - 1]);
    }
done:
    MPI_Bcast(&bad, 1, MPI_INT, 0, comm);
    free(c);
    free(ids);
    free(dist);
    free(x);
    return bad;
}

static int64_t arg_or(int argc, char **argv, int i, int64_t dflt)
{
    return argc > i ? strtoll(argv[i], NULL, 10) : dflt;
}

/* The backend named by argv[i] (cpu when absent); XKNN_BACKEND_COUNT for another name. */
static xknn_backend backend_arg(int argc, char **argv, int i)
{
    if (argc <= i || !strcmp(argv[i], "cpu")) return XKNN_BACKEND_CPU;
    return !strcmp(argv[i], "cuda") ? XKNN_BACKEND_CUDA : XKNN_BACKEND_COUNT;
}

/* Collective: 1 on every rank when some rank sees no CUDA device (none visible, or a
 * build without CUDA), 0 on every rank otherwise. */
static int cuda_missing(void)
{
    int none = !xknn_backend_built(XKNN_BACKEND_CUDA) || xknn_cuda_device_count() <= 0;
    MPI_Allreduce(MPI_IN_PLACE, &none, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return none;
}

int main(int argc, char **argv)
{
    int64_t n = arg_or(argc, argv, 1, 400), k = arg_or(argc, argv, 2, 8), row0, rows, i;
    int steps = (int)arg_or(argc, argv, 3, 10), rank, size, step, bad = 0, r;
    const xknn_backend backend = backend_arg(argc, argv, 4);
    int *counts = NULL, *displs = NULL;
    int64_t *ids1 = NULL;
    float *dist1 = NULL;
    particles mine = {0}, all = {0};
    xknn_mpi_context *ctx = NULL;
    xknn_mpi_index *index = NULL;
    const char *what = "xknn_mpi_create";
    xknn_error err;
    xknn_status st;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (n < 2 || k < 1 || k > n - 1 || steps < 1 || n > INT32_MAX / (k > D ? k : D) ||
        backend == XKNN_BACKEND_COUNT) {
        if (rank == 0) fprintf(stderr, "usage: particles_mpi [N >= 2 [1 <= K < N [STEPS >= 1 [cpu|cuda]]]]\n");
        MPI_Finalize();
        return 1;
    }
    if (backend == XKNN_BACKEND_CUDA && cuda_missing()) {
        if (rank == 0) printf("particles_mpi: skipped: cuda needs a CUDA device on every rank\n");
        MPI_Finalize();
        return 77;
    }
    xknn_mpi_slice(n, rank, size, &row0, &rows);
    counts = malloc((size_t)size * 2 * sizeof *counts);
    ids1 = malloc((size_t)(rows ? rows : 1) * (size_t)(k + 1) * sizeof *ids1);
    dist1 = malloc((size_t)(rows ? rows : 1) * (size_t)(k + 1) * sizeof *dist1);
    bad = !counts || !ids1 || !dist1 || !alloc_particles(&mine, rows, k) ||
          (rank == 0 && !alloc_particles(&all, n, k));
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (bad) {
        if (rank == 0) fprintf(stderr, "particles_mpi: out of memory\n");
        goto done;
    }
    displs = counts + size;
    for (r = 0; r < size; r++) {
        int64_t r0, rn;
        xknn_mpi_slice(n, r, size, &r0, &rn);
        counts[r] = (int)rn;
        displs[r] = (int)r0;
    }
    for (i = 0; i < rows; i++) init_particle(row0 + i, mine.x + i * D, mine.v + i * D);
    for (i = 0; rank == 0 && i < n; i++) init_particle(i, all.x + i * D, all.v + i * D);

    st = xknn_mpi_create(MPI_COMM_WORLD, NULL, &ctx, &err);
    if (st == XKNN_SUCCESS) { /* the index copies the slice: on the GPU too with cuda */
        xknn_params p = XKNN_PARAMS_INIT;
        xknn_matrix m = XKNN_MATRIX_F32(mine.x, rows, D);
        p.backend = backend;
        what = "xknn_mpi_index_create";
        st = xknn_mpi_index_create(ctx, &p, rows > 0 ? &m : NULL, row0, &index, &err);
    }
    for (step = 0; st == XKNN_SUCCESS && !bad && step < steps; step++) {
        if (step > 0) { /* the move from the previous step's neighbours, into the index */
            for (i = 0; i < rows; i++) move_particle(mine.x + i * D, mine.v + i * D, mine.dist[(i + 1) * k - 1]);
            what = "xknn_mpi_index_update";
            st = update_step(index, &mine, &err);
            if (st != XKNN_SUCCESS) break;
        }
        what = "xknn_mpi_index_search_gather";
        st = search_step(index, size, rank, &mine, n, row0, ids1, dist1, &err);
        if (st != XKNN_SUCCESS) break;
        bad = check_step(MPI_COMM_WORLD, &mine, &all, step, counts, displs);
    }
    if (st != XKNN_SUCCESS) {
        if (rank == 0) fprintf(stderr, "particles_mpi: %s: %s\n", what, err.message); /* the same on every rank */
        bad = 1;
    }
    if (xknn_mpi_index_destroy(index) != XKNN_SUCCESS || xknn_mpi_destroy(ctx) != XKNN_SUCCESS) {
        fprintf(stderr, "particles_mpi: rank %d: destroying the index or the context failed\n", rank);
        bad = 1;
    }
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0 && !bad)
        printf("particles_mpi: n=%lld k=%lld steps=%d ranks=%d backend=%s: neighbours and positions equal the "
               "serial brute force at every step\n", (long long)n, (long long)k, steps, size,
               backend == XKNN_BACKEND_CUDA ? "cuda" : "cpu");
done:
    free_particles(&mine);
    if (rank == 0) free_particles(&all);
    free(counts);
    free(ids1);
    free(dist1);
    MPI_Finalize();
    return bad;
}
