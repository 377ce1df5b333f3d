/* SPDX-License-Identifier: MIT */
/* libFuzzer target: the IDX reader (MNIST / Fashion-MNIST), plain and .gz. Byte 0
 * picks the name and the path: plain "-idx3-ubyte", the rest gzip-compressed as
 * "-idx3-ubyte.gz", or the rest taken as a raw .gz stream; the remaining bytes are
 * the file. */
#include "fuzz_io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const name[2] = { "in-idx3-ubyte", "in.idx" };
    char file[32];
    unsigned mode;
    if (size < 1) return 0;
    mode = data[0] % 3u;
#ifndef XKNN_HAVE_ZLIB
    mode = 0;
#endif
    snprintf(file, sizeof file, "%s%s", name[(data[0] / 3u) % 2u], mode ? ".gz" : "");
    return xknn_fuzz_run_file(file, mode == 1, data + 1, size - 1);
}
