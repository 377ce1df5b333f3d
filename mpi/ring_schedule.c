/* SPDX-License-Identifier: MIT */
/*
 * mpi/ring_schedule.c -- the symmetric ring's schedule (see ring_schedule.h).
 *
 * In step s = 0 .. S, S = floor(P/2), rank r holds slice (r + s) mod P and works on the
 * pair (slice r, slice (r + s) mod P). With (b - a) mod P = s, the pair {a, b} is rank
 * a's step s when s < P - s and rank b's step P - s when s > P - s; only for even P is
 * s = P - s = P/2 reached from both ends, by rank a < P/2 and rank a + P/2 in step S,
 * each holding the other's slice: they split the pair by rows of slice a. So every pair
 * of slices, and every slice's diagonal, is computed exactly once.
 */
#include <stddef.h>
#include <stdint.h>

#include "ring_schedule.h"

int64_t xknn__sym_tri(int64_t m)
{
    return m > 1 ? m * (m - 1) / 2 : 0;
}

int64_t xknn__sym_top(int64_t m, int64_t h)
{
    return xknn__sym_tri(h) + h * (m - h);
}

int xknn__sym_held(int P, int r, int s)
{
    return (r + s) % P;
}

int xknn__sym_holder(int P, int j, int s)
{
    return ((j - s) % P + P) % P;
}

/* Appends block (a [a0, a1) against b [b0, b1)) unless a side has no row. */
static int xknn__sym_put(xknn__sym_rect *out, int n, int a, int64_t a0, int64_t a1, int b, int64_t b0, int64_t b1)
{
    if (a1 <= a0 || (b != XKNN__SYM_NONE && b1 <= b0)) return n;
    out[n].a = a;
    out[n].a0 = a0;
    out[n].a1 = a1;
    out[n].b = b;
    out[n].b0 = b0;
    out[n].b1 = b1;
    return n + 1;
}

int xknn__sym_step_rects(int P, int r, int s, const int64_t *m, const int64_t *half, const int64_t *cut,
                         int mirrored, xknn__sym_rect *out)
{
    const int j = xknn__sym_held(P, r, s);
    const int64_t mr = m[r], mj = m[j];
    int n = 0;
    if (s == 0) return xknn__sym_put(out, 0, XKNN__SYM_OWN, cut ? cut[r] : 0, mr, XKNN__SYM_NONE, 0, 0);
    if (s == 1 && cut && cut[j] > 0) {
        /* the first cut rows of the next slice's diagonal */
        n = xknn__sym_put(out, n, XKNN__SYM_HELD, 0, cut[j], XKNN__SYM_NONE, 0, 0);
        n = xknn__sym_put(out, n, XKNN__SYM_HELD, 0, cut[j], XKNN__SYM_HELD, cut[j], mj);
    }
    if (s < P - s) return xknn__sym_put(out, n, XKNN__SYM_OWN, 0, mr, XKNN__SYM_HELD, 0, mj);
    if (r < P / 2) {
        /* rows of the own slice a = r against slice r + P/2 */
        const int64_t h = half[r];
        return mirrored ? xknn__sym_put(out, n, XKNN__SYM_OWN, mr - h, mr, XKNN__SYM_HELD, 0, mj)
                        : xknn__sym_put(out, n, XKNN__SYM_OWN, 0, h, XKNN__SYM_HELD, 0, mj);
    }
    /* the other rows of slice a = r - P/2 (held) against the own */
    return mirrored ? xknn__sym_put(out, n, XKNN__SYM_HELD, 0, mj - half[j], XKNN__SYM_OWN, 0, mr)
                    : xknn__sym_put(out, n, XKNN__SYM_HELD, half[j], mj, XKNN__SYM_OWN, 0, mr);
}

int64_t xknn__sym_rect_evals(const xknn__sym_rect *b)
{
    return b->b == XKNN__SYM_NONE ? xknn__sym_tri(b->a1 - b->a0) : (b->a1 - b->a0) * (b->b1 - b->b0);
}

int xknn__sym_is_pair(const xknn__sym_rect *b)
{
    return b->b != XKNN__SYM_NONE && b->a != b->b;
}

/* Balance. Work is counted in distance evaluations. With equal slices m, before the
 * cuts every rank does m(m-1)/2 + (P-1)/2 m^2 (odd P: (P-1)/2 full pairs; even P: P/2 - 1
 * full pairs and two halves of m^2/2), which sums to N(N-1)/2, N = P m. Unequal slices
 * leave rank r's base work B_r off the mean T/P by a few rows' worth; the cuts move
 * diagonal rows between neighbours to absorb that: with g_r = P top(m_r, cut[r]) the work
 * rank r hands to rank r - 1 (scaled by P), rank r does W_r = B_r - top_r + top_(r+1),
 * and g_(r+1) = g_r - (P B_r - T) makes every P W_r - T zero; g_r = G - sum_(j<r) (P B_j
 * - T), G the largest prefix, keeps g >= 0. cut[r] is the row count whose top() is
 * nearest to g_r / P: top grows by m_r - 1 per row, so each cut is off by at most
 * (m_r - 1)/2 and |W_r - T/P| <= (m_r - 1)/2 + (m_(r+1) - 1)/2 whenever the cuts fit in
 * their diagonals (g_r <= P m_r(m_r-1)/2; with the standard slicing, whenever every slice
 * has more than 1.5 P rows); tiny or skewed slices get the nearest fit. Above P n^2 ~
 * 2^61 the plan keeps cut = 0 rather than overflow. */
void xknn__sym_plan(int P, const int64_t *m, int64_t *half, int64_t *cut, int64_t *g)
{
    const int S = P / 2;
    int64_t n = 0, T = 0, G = 0;
    int r, s, i;
    for (r = 0; r < P; r++) {
        half[r] = P % 2 == 0 && r < S ? m[r] / 2 : 0;
        cut[r] = 0;
        n += m[r];
    }
    if (P < 2 || n < 2) return;
    /* P * (prefix sums of P B_r - T) stays within 4 P T <= 2 P n^2 */
    if (n > INT64_C(2000000000) || n * n > INT64_MAX / 4 / P) return;
    for (r = 0; r < P; r++) {
        /* base work B_r (no cut rows), kept in g[r] for now */
        int64_t b = 0;
        for (s = 0; s <= S; s++) {
            xknn__sym_rect blk[3];
            const int nb = xknn__sym_step_rects(P, r, s, m, half, NULL, 0, blk);
            for (i = 0; i < nb; i++) b += xknn__sym_rect_evals(&blk[i]);
        }
        g[r] = b;
        T += b;
    }
    /* g[r] <- sum_(j<r) (P B_j - T) */
    {
        int64_t pre = 0;
        for (r = 0; r < P; r++) {
            const int64_t d = P * g[r] - T;
            g[r] = pre;
            pre += d;
            if (g[r] > G) G = g[r];
        }
    }
    for (r = 0; r < P; r++) {
        /* the cut whose P * top() is nearest to G - prefix: top() is nondecreasing */
        const int64_t want = G - g[r];
        int64_t lo = 0, hi = m[r];
        while (lo < hi) {
            const int64_t mid = lo + (hi - lo) / 2;
            if (P * xknn__sym_top(m[r], mid) >= want)
                hi = mid;
            else
                lo = mid + 1;
        }
        if (lo > 0 && want - P * xknn__sym_top(m[r], lo - 1) < P * xknn__sym_top(m[r], lo) - want) lo--;
        cut[r] = lo;
    }
}

int64_t xknn__sym_piece(int64_t m, int np, int q)
{
    return m / np * q + m % np * q / np;
}

int64_t xknn__sym_slice1(int64_t m, int np, int q)
{
    return q >= np ? m : m / (2 * np - 1) * 2 * q + m % (2 * np - 1) * 2 * q / (2 * np - 1);
}

int64_t xknn__sym_at(int s1, int64_t m, int np, int q)
{
    return s1 ? xknn__sym_slice1(m, np, q) : xknn__sym_piece(m, np, q);
}

int64_t xknn__sym_block(int64_t k)
{
    const int64_t rows = ((int64_t)8 << 20) / (k * 12);
    return rows > 0 ? rows : 1;
}
