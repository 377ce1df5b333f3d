/* SPDX-License-Identifier: MIT */
/* ring-schedule-t: the symmetric ring's schedule (mpi/ring_schedule.c) without MPI.
 * For P = 1..9 and many slicings (the standard one, empty slices, all rows on one rank):
 * every pair of rows is evaluated exactly once over all ranks and steps (the pieces'
 * mirrored split of P = 2 included), each slice is held by one rank a step, the plan's
 * rows stay inside their slices, and where the plan promises it (every slice of the
 * standard slicing above 1.5 P rows) each rank's evaluations are within
 * (m_r - 1)/2 + (m_(r+1) - 1)/2 of the mean. Then the pieces of P = 2's last pair:
 * contiguous, covering [0, m), the last piece about half; and the sink's block. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ring_schedule.h"
#include "tap/tap.h"

#define MAXP 9
#define MAXN 96 /* rows of the slicings whose pairs are counted one by one */

typedef struct slicing {
    int P;
    int64_t m[MAXP], row0[MAXP], n;
} slicing;

static void standard(slicing *sl, int P, int64_t n)
{
    int r;
    sl->P = P;
    sl->n = n;
    for (r = 0; r < P; r++) {
        sl->row0[r] = n * r / P;
        sl->m[r] = n * (r + 1) / P - n * r / P;
    }
}

static void custom(slicing *sl, int P, const int64_t *m)
{
    int r;
    sl->P = P;
    sl->n = 0;
    for (r = 0; r < P; r++) {
        sl->row0[r] = sl->n;
        sl->m[r] = m[r];
        sl->n += m[r];
    }
}

/* Every row pair's count over all ranks and steps (one slicing, plan given): 0 when
 * each pair i < j is counted once and no row is paired with itself; else 1 with a
 * diagnostic. *evals: the ranks' evaluations, summed over the blocks. */
static int covers(const slicing *sl, const int64_t *half, const int64_t *cut, int mirrored, int64_t *evals)
{
    static unsigned char cnt[MAXN][MAXN];
    const int P = sl->P;
    int r, s, i;
    int64_t x, y;
    memset(cnt, 0, sizeof cnt);
    for (r = 0; r < P; r++) {
        evals[r] = 0;
        for (s = 0; s <= P / 2; s++) {
            xknn__sym_rect blk[3];
            const int nb = xknn__sym_step_rects(P, r, s, sl->m, half, cut, mirrored, blk);
            const int j = xknn__sym_held(P, r, s);
            for (i = 0; i < nb; i++) {
                const xknn__sym_rect *b = &blk[i];
                const int64_t ga = b->a == XKNN__SYM_OWN ? sl->row0[r] : sl->row0[j];
                const int64_t gb = b->b == XKNN__SYM_OWN ? sl->row0[r] : sl->row0[j];
                const int64_t ma = b->a == XKNN__SYM_OWN ? sl->m[r] : sl->m[j];
                const int64_t mb = b->b == XKNN__SYM_OWN ? sl->m[r] : sl->m[j];
                if (b->a0 < 0 || b->a1 > ma || b->a0 >= b->a1 ||
                    (b->b != XKNN__SYM_NONE && (b->b0 < 0 || b->b1 > mb || b->b0 >= b->b1))) {
                    diag("P=%d n=%lld rank %d step %d: block %d out of its slice or empty", P, (long long)sl->n, r,
                         s, i);
                    return 1;
                }
                evals[r] += xknn__sym_rect_evals(b);
                for (x = b->a0; x < b->a1; x++) {
                    if (b->b == XKNN__SYM_NONE) {
                        for (y = x + 1; y < b->a1; y++) cnt[ga + x][ga + y]++;
                    } else {
                        for (y = b->b0; y < b->b1; y++) {
                            const int64_t u = ga + x, v = gb + y;
                            cnt[u < v ? u : v][u < v ? v : u]++;
                        }
                    }
                }
            }
        }
    }
    for (x = 0; x < sl->n; x++)
        for (y = x; y < sl->n; y++)
            if (cnt[x][y] != (x < y)) {
                diag("P=%d n=%lld mirrored=%d: rows %lld and %lld paired %d times", P, (long long)sl->n, mirrored,
                     (long long)x, (long long)y, cnt[x][y]);
                return 1;
            }
    return 0;
}

/* The slicings of P ranks whose pairs are counted: the standard one for n = 0 .. 3P + 4
 * and a few larger n, empty slices between full ones, all rows on one rank. */
static int slicings(int P, slicing *out)
{
    int c = 0, r;
    int64_t n, m[MAXP];
    for (n = 0; n <= 3 * P + 4; n++) standard(&out[c++], P, n);
    standard(&out[c++], P, 7 * P + 3);
    standard(&out[c++], P, MAXN);
    for (r = 0; r < P; r++) m[r] = r % 2 ? 0 : 3 + r;
    custom(&out[c++], P, m);
    for (r = 0; r < P; r++) m[r] = r % 2 ? 2 * r + 1 : 0;
    custom(&out[c++], P, m);
    for (r = 0; r < P; r++) m[r] = r == P / 2 ? 11 : 0;
    custom(&out[c++], P, m);
    for (r = 0; r < P; r++) m[r] = r == 0 ? 9 : 1;
    custom(&out[c++], P, m);
    return c;
}

static void check_ranks(int P)
{
    slicing sl[64];
    const int ns = slicings(P, sl);
    int bad_cover = 0, bad_sum = 0, bad_plan = 0, bad_hold = 0, i, r, s;
    for (i = 0; i < ns; i++) {
        int64_t half[MAXP], cut[MAXP], g[MAXP + 1], ev[MAXP], sum = 0;
        xknn__sym_plan(P, sl[i].m, half, cut, g);
        for (r = 0; r < P; r++)
            if (cut[r] < 0 || cut[r] > sl[i].m[r] || half[r] != (P % 2 == 0 && r < P / 2 ? sl[i].m[r] / 2 : 0)) {
                diag("P=%d n=%lld: rank %d's plan half=%lld cut=%lld outside its %lld rows", P, (long long)sl[i].n, r,
                     (long long)half[r], (long long)cut[r], (long long)sl[i].m[r]);
                bad_plan++;
            }
        bad_cover += covers(&sl[i], half, cut, 0, ev);
        for (r = 0; r < P; r++) sum += ev[r];
        if (sum != xknn__sym_tri(sl[i].n)) {
            diag("P=%d n=%lld: %lld evaluations, want %lld", P, (long long)sl[i].n, (long long)sum,
                 (long long)xknn__sym_tri(sl[i].n));
            bad_sum++;
        }
        /* P = 2's pieces split the last pair the other way round (no cut rows in slice 0) */
        if (P == 2 && cut[0] == 0) bad_cover += covers(&sl[i], half, cut, 1, ev);
    }
    for (s = 0; s <= P / 2; s++) {
        int seen[MAXP] = {0};
        for (r = 0; r < P; r++) {
            const int j = xknn__sym_held(P, r, s);
            if (j < 0 || j >= P || xknn__sym_holder(P, j, s) != r || (s == 0 && j != r)) bad_hold++;
            else seen[j]++;
        }
        for (r = 0; r < P; r++) bad_hold += seen[r] != 1;
    }
    ok(bad_cover == 0, "P=%d: every pair of rows once, %d slicings", P, ns);
    ok(bad_sum == 0, "P=%d: the ranks' evaluations sum to n(n-1)/2", P);
    ok(bad_plan == 0, "P=%d: half and cut rows inside their slices", P);
    ok(bad_hold == 0, "P=%d: each slice held by one rank a step, rank r holds r + s", P);
}

/* |W_r - T/P| <= (m_r - 1)/2 + (m_(r+1) - 1)/2, in integers, for the standard slicing of
 * n rows whenever every slice has more than 1.5 P rows. */
static int balanced(int P, int64_t n, int64_t *worst)
{
    slicing sl;
    int64_t half[MAXP], cut[MAXP], g[MAXP + 1], T = 0, w[MAXP];
    int r, s, i;
    standard(&sl, P, n);
    xknn__sym_plan(P, sl.m, half, cut, g);
    for (r = 0; r < P; r++) {
        w[r] = 0;
        for (s = 0; s <= P / 2; s++) {
            xknn__sym_rect blk[3];
            const int nb = xknn__sym_step_rects(P, r, s, sl.m, half, cut, 0, blk);
            for (i = 0; i < nb; i++) w[r] += xknn__sym_rect_evals(&blk[i]);
        }
        T += w[r];
    }
    for (r = 0; r < P; r++) {
        const int64_t off = 2 * P * w[r] - 2 * T, lim = (int64_t)P * (sl.m[r] - 1 + sl.m[(r + 1) % P] - 1);
        const int64_t a = off < 0 ? -off : off;
        if (a - lim > *worst) *worst = a - lim;
        if (a > lim) {
            diag("P=%d n=%lld: rank %d does %lld evaluations, mean %lld/%d, off by more than %lld/%d", P,
                 (long long)n, r, (long long)w[r], (long long)T, P, (long long)lim, 2 * P);
            return 0;
        }
    }
    return 1;
}

static void check_balance(int P)
{
    /* the smallest n whose standard slices all exceed 1.5 P rows */
    const int64_t n0 = (int64_t)P * ((3 * P) / 2 + 1);
    static const int64_t big[] = {1000, 4099, 65537, 1000003, 123456789};
    int64_t n, worst = INT64_MIN;
    int bad = 0, tried = 0;
    size_t i;
    for (n = n0; n < n0 + 40 * P; n++, tried++) bad += !balanced(P, n, &worst);
    for (i = 0; i < sizeof big / sizeof big[0]; i++, tried++)
        if (big[i] >= n0) bad += !balanced(P, big[i], &worst);
    ok(bad == 0, "P=%d: every rank within the promised bound of the mean, %d row counts from %lld", P,
       tried, (long long)n0);
}

static void check_pieces(void)
{
    int np, q, bad_s1 = 0, bad_half = 0, bad_piece = 0, bad_at = 0;
    int64_t m;
    for (np = 1; np <= 16; np++) {
        for (m = 0; m <= 200; m++) {
            int64_t lo = INT64_MAX, hi = 0;
            if (xknn__sym_slice1(m, np, 0) != 0 || xknn__sym_slice1(m, np, np) != m) bad_s1++;
            if (xknn__sym_piece(m, np, 0) != 0 || xknn__sym_piece(m, np, np) != m) bad_piece++;
            for (q = 0; q < np; q++) {
                const int64_t a = xknn__sym_slice1(m, np, q), b = xknn__sym_slice1(m, np, q + 1);
                const int64_t pa = xknn__sym_piece(m, np, q), pb = xknn__sym_piece(m, np, q + 1);
                if (b < a) bad_s1++;
                if (pb < pa) bad_piece++;
                if (q < np - 1 && b - a < lo) lo = b - a;
                if (q < np - 1 && b - a > hi) hi = b - a;
                if (pb - pa < m / np || pb - pa > (m + np - 1) / np) bad_piece++;
                if (xknn__sym_at(1, m, np, q) != a || xknn__sym_at(0, m, np, q) != pa) bad_at++;
            }
            if (np > 1) {
                /* 2 np - 1 halves: the last is one of them, the others two */
                const int64_t last = m - xknn__sym_slice1(m, np, np - 1);
                if (hi > 2 * last || 2 * last > lo + 2 || hi - lo > 1) {
                    diag("m=%lld np=%d: pieces of %lld..%lld rows, the last %lld", (long long)m, np, (long long)lo,
                         (long long)hi, (long long)last);
                    bad_half++;
                }
            }
        }
    }
    ok(bad_s1 == 0, "P = 2's pieces of slice 1: contiguous, from 0 to m, m = 0..200, 1..16 pieces");
    ok(bad_half == 0, "P = 2's pieces of slice 1: the last about half the others");
    ok(bad_piece == 0, "equal parts: contiguous, from 0 to m, sizes floor or ceil of m/np");
    ok(bad_at == 0, "the first row of a travelling piece: slice 1's pieces or equal parts");
}

static void check_block(void)
{
    int bad = 0;
    int64_t k;
    for (k = 1; k <= INT64_C(1) << 22; k = k * 3 + 1) {
        const int64_t rows = xknn__sym_block(k);
        if (rows < 1 || (rows > 1 && rows * k * 12 > (INT64_C(8) << 20))) bad++;
    }
    ok(bad == 0, "the sink's block of lists: at least a row, else within 8 MiB");
}

int main(void)
{
    int P;
    plan(5 * MAXP + 5);
    for (P = 1; P <= MAXP; P++) {
        check_ranks(P);
        check_balance(P);
    }
    check_pieces();
    check_block();
    return tap_done();
}
