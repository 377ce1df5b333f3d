/* SPDX-License-Identifier: MIT */
/* libFuzzer target: TEXMEX readers (.fvecs .ivecs .bvecs, plain and .gz).
 * Byte 0 picks the extension and the path (plain file, gzip of the rest, or the rest
 * taken as a raw .gz stream); the remaining bytes are the file. */
#include "fuzz_io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const ext[3] = { "in.fvecs", "in.ivecs", "in.bvecs" };
    char name[32];
    unsigned sel, mode;
    if (size < 1) return 0;
    sel = data[0] % 3u;
    mode = (data[0] / 3u) % 3u;
#ifndef XKNN_HAVE_ZLIB
    mode = 0;
#endif
    snprintf(name, sizeof name, "%s%s", ext[sel], mode ? ".gz" : "");
    return xknn_fuzz_run_file(name, mode == 1, data + 1, size - 1);
}
