/* SPDX-License-Identifier: MIT */
/* libFuzzer target: big-ann readers (.fbin .u8bin .i8bin .ibin, and .bin with each
 * --dtype). Byte 0 picks the extension (and for .bin the element type); the remaining
 * bytes are the file. */
#include "fuzz_io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const ext[8] = { "in.fbin", "in.u8bin", "in.i8bin", "in.ibin",
                                        "in.bin",  "in.bin",   "in.bin",   "in.bin" };
    static const xknn_elem bin_dtype[8] = { XKNN_ELEM_F32, XKNN_ELEM_F32, XKNN_ELEM_F32, XKNN_ELEM_F32,
                                            XKNN_ELEM_F32, XKNN_ELEM_F16, XKNN_ELEM_U8,  XKNN_ELEM_I8 };
    xknn_read_opts opts = XKNN_READ_OPTS_INIT;
    const char *path;
    unsigned sel;
    if (size < 1) return 0;
    sel = data[0] % 8u;
    opts.bin_dtype = bin_dtype[sel];
    path = xknn_fuzz_path(ext[sel]);
    if (xknn_fuzz_write(path, data + 1, size - 1)) return 0;
    xknn_fuzz_probe_read(path, &opts);
    unlink(path);
    return 0;
}
