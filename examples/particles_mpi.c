/* SPDX-License-Identifier: MIT */
/* particles_mpi: a time-stepping particle code on the CPU over MPI ranks.
 *
 * N particles move in the unit cube with reflecting walls. Rank r owns particles
 * [row0, row0 + rows) of xknn_mpi_slice() for the whole run (ownership by id, not by
 * space). Every step, each rank asks xknn_mpi_search for the k nearest other particles
 * of its own particles (it is the query root in its turn, with exclude_self and its
 * slice's global ids) and gets them back gathered on itself; then it moves its own
 * particles with a speed that drops in crowded places: v * min(1, r_k / h), r_k the
 * distance to the k-th neighbour. The update needs only the particle's own state and its
 * neighbour distances, so no rank ever needs another rank's positions.
 *
 * Check: rank 0 runs the same simulation serially with a brute-force neighbour search
 * (every pair through xknn_distance, ordered by (distance, id)) and, every step,
 * compares the gathered neighbour ids and distance bits and the positions bit for bit.
 * The exact search makes the trajectory independent of the rank count.
 * Run: mpirun -np 3 ./particles_mpi [N [K [STEPS]]]   (defaults 400 8 10); exit 0 when
 * every step matched, 1 otherwise, the same on every rank.
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

/* The distributed search of one step: every rank, in turn, is the root of its own
 * particles' queries and gathers their neighbours. */
static xknn_status search_step(xknn_mpi_context *ctx, particles *mine, int64_t n, int64_t row0, xknn_error *err)
{
    int rank = xknn_mpi_rank(ctx), size = xknn_mpi_size(ctx), r;
    xknn_matrix ref = XKNN_MATRIX_F32(mine->x, mine->n, D);
    for (r = 0; r < size; r++) {
        int64_t r0, rn;
        xknn_params p = XKNN_PARAMS_INIT;
        xknn_mpi_output out = XKNN_MPI_OUTPUT_INIT;
        xknn_status st;
        xknn_mpi_slice(n, r, size, &r0, &rn);
        if (rn == 0) continue;
        p.backend = XKNN_BACKEND_CPU;
        p.exclude_self = 1;
        p.query_id_offset = r0; /* the root's particles are references r0.. too */
        out.gather_root = r;
        out.ids = mine->ids;
        out.dist = mine->dist;
        st = xknn_mpi_search(ctx, &p, &ref, row0, r == rank ? &ref : NULL, r, mine->k, &out, NULL, err);
        if (st != XKNN_SUCCESS) return st;
    }
    return XKNN_SUCCESS;
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

int main(int argc, char **argv)
{
    int64_t n = arg_or(argc, argv, 1, 400), k = arg_or(argc, argv, 2, 8), row0, rows, i;
    int steps = (int)arg_or(argc, argv, 3, 10), rank, size, step, bad = 0, r;
    int *counts = NULL, *displs = NULL;
    particles mine = {0}, all = {0};
    xknn_mpi_context *ctx = NULL;
    xknn_error err;
    xknn_status st;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (n < 2 || k < 1 || k > n - 1 || steps < 1 || n > INT32_MAX / (k > D ? k : D)) {
        if (rank == 0) fprintf(stderr, "usage: particles_mpi [N >= 2 [1 <= K < N [STEPS >= 1]]]\n");
        MPI_Finalize();
        return 1;
    }
    xknn_mpi_slice(n, rank, size, &row0, &rows);
    counts = malloc((size_t)size * 2 * sizeof *counts);
    bad = !counts || !alloc_particles(&mine, rows, k) || (rank == 0 && !alloc_particles(&all, n, k));
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
    for (step = 0; st == XKNN_SUCCESS && !bad && step < steps; step++) {
        st = search_step(ctx, &mine, n, row0, &err);
        if (st != XKNN_SUCCESS) break;
        bad = check_step(MPI_COMM_WORLD, &mine, &all, step, counts, displs);
        for (i = 0; i < rows; i++) move_particle(mine.x + i * D, mine.v + i * D, mine.dist[(i + 1) * k - 1]);
    }
    if (st != XKNN_SUCCESS) {
        if (rank == 0) fprintf(stderr, "particles_mpi: %s\n", err.message); /* the same on every rank */
        bad = 1;
    } else if (rank == 0 && !bad) {
        printf("particles_mpi: n=%lld k=%lld steps=%d ranks=%d: neighbours and positions equal the serial "
               "brute force at every step\n", (long long)n, (long long)k, steps, size);
    }
    xknn_mpi_destroy(ctx);
done:
    free_particles(&mine);
    if (rank == 0) free_particles(&all);
    free(counts);
    MPI_Finalize();
    return bad;
}
