/* SPDX-License-Identifier: MIT */
#define _POSIX_C_SOURCE 200809L
/* The header-only host code of xknn, compiled once into libxknn. */
#define XKNN_IMPLEMENTATION
#include "xknn.h"
#include "xknn/io.h"
#include "xknn/learn.h"
#include "xknn/softknn.h"
