#define _POSIX_C_SOURCE 200809L
/* The header-only host code of xknn/softknn.h, compiled once into libxknn. xknn.h's own
 * host code is compiled by src/xknn.c: its done-guard is set here so that it is not
 * compiled a second time. */
#define XKNN__IMPLEMENTATION_DONE
#define XKNN_IMPLEMENTATION
#include "xknn.h"
#include "xknn/softknn.h"
