/* The header-only host code of xknn, compiled once into libxknn. */
#define XKNN_IMPLEMENTATION
#include "xknn.h"
