/* SPDX-License-Identifier: MIT */
/*
 * mpi/ring_schedule.h -- the symmetric ring's schedule (mpi/symmetric.c): which slice
 * pair a rank computes in each step, the rows that balance the ranks' work, and the
 * pieces of P = 2's last pair. Integer arithmetic on the agreed slice table only (no
 * MPI, no threads, no device): every rank computes the same. Not installed.
 */
#ifndef XKNN_MPI_RING_SCHEDULE_H
#define XKNN_MPI_RING_SCHEDULE_H

#include <stdint.h>

/* Distance evaluations of a diagonal of m rows (m(m-1)/2), and of its first h rows:
 * their triangle and their rectangle against the rows after them. */
int64_t xknn__sym_tri(int64_t m);
int64_t xknn__sym_top(int64_t m, int64_t h);

/* The slice rank r holds in step s ((r + s) mod P), and the rank holding slice j in
 * step s ((j - s) mod P): each slice is held by exactly one rank a step. */
int xknn__sym_held(int P, int r, int s);
int xknn__sym_holder(int P, int j, int s);

/* The plan: half[a] = floor(m_a / 2) for a < P/2 (even P; 0 elsewhere), and cut[r], the
 * first rows of slice r's diagonal that rank r - 1 computes in step 1, chosen so that
 * every rank's evaluations are within (m_r - 1)/2 + (m_(r+1) - 1)/2 of the mean
 * wherever the cuts fit in their diagonals (see xknn__sym_plan in ring_schedule.c).
 * m: the P slice sizes; g: scratch of P + 1 values. */
void xknn__sym_plan(int P, const int64_t *m, int64_t *half, int64_t *cut, int64_t *g);

/* One block of a step's work: rows [a0, a1) of side a against rows [b0, b1) of side b,
 * or (b == XKNN__SYM_NONE) among themselves. A side is the rank's own slice or the
 * slice it holds in that step. */
enum { XKNN__SYM_NONE = -1, XKNN__SYM_OWN = 0, XKNN__SYM_HELD = 1 };
typedef struct xknn__sym_rect {
    int a, b;
    int64_t a0, a1, b0, b1;
} xknn__sym_rect;

/* Rank r's blocks of step s = 0 .. P/2, in the order they are computed, with no empty
 * block (no row on a side): step 0, its diagonal less its first cut[r] rows; step 1,
 * slice r + 1's first cut rows (triangle, then rectangle); then the pair (r, r + s):
 * whole for s < P - s, else (even P, s = P/2) split by rows of slice a = min(r, r+s mod
 * P) at half[a]: rows [0, half[a]) on rank a, [half[a], m_a) on rank a + P/2; mirrored
 * (P = 2's pieces): [m_a - half[a], m_a) on rank a, [0, m_a - half[a]) on the other.
 * The pair is the last block returned. Returns the count (at most 3). */
int xknn__sym_step_rects(int P, int r, int s, const int64_t *m, const int64_t *half, const int64_t *cut,
                         int mirrored, xknn__sym_rect *out);

/* Evaluations of one block; whether it is the step's pair (own rows against held). */
int64_t xknn__sym_rect_evals(const xknn__sym_rect *b);
int xknn__sym_is_pair(const xknn__sym_rect *b);

/* Part q of np equal parts of m rows: rows [piece(m, np, q), piece(m, np, q + 1));
 * piece(m, np, 0) = 0, piece(m, np, np) = m, nondecreasing. */
int64_t xknn__sym_piece(int64_t m, int np, int q);

/* P = 2's last pair in pieces of slice 1 (m rows): piece q of np covers rows
 * [slice1(m, np, q), slice1(m, np, q + 1)), the last about half as many as the others
 * (2 np - 1 halves): its lists are the last to travel. */
int64_t xknn__sym_slice1(int64_t m, int np, int q);

/* The first row of piece q of np of a set of m rows that travels piece by piece: slice
 * 1's (s1), or slice 0's rows [0, g) (m = g) in equal parts. */
int64_t xknn__sym_at(int s1, int64_t m, int np, int q);

/* Rows of k-wide lists (12 bytes an entry) in about 8 MiB, at least 1. */
int64_t xknn__sym_block(int64_t k);

#endif /* XKNN_MPI_RING_SCHEDULE_H */
