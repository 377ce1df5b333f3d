/* SPDX-License-Identifier: MIT */
/* libFuzzer target: the .npy reader (v1/v2 headers, dtype and shape parsing). The
 * bytes are the whole file. */
#include "fuzz_io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = xknn_fuzz_path("in.npy");
    if (xknn_fuzz_write(path, data, size)) return 0;
    xknn_fuzz_probe_read(path, NULL);
    unlink(path);
    return 0;
}
