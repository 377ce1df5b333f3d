/* SPDX-License-Identifier: MIT */
/*
 * tools/launch.c -- knn_mpi's launch environment (tools/launch.h).
 */
#define _POSIX_C_SOURCE 200809L
#include "launch.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int knn__narrowed;

/* The device minor number of one GPU's entry, from its information file; -1 if none */
static int knn__gpu_minor(const char *dir, const char *name)
{
    char path[1024], line[256];
    FILE *f;
    int minor = -1;
    if (snprintf(path, sizeof path, "%s/%s/information", dir, name) >= (int)sizeof path) return -1;
    if (!(f = fopen(path, "r"))) return -1;
    while (minor < 0 && fgets(line, sizeof line, f))
        if (sscanf(line, " Device Minor: %d", &minor) != 1 || minor < 0) minor = -1;
    fclose(f);
    return minor;
}

int knn_node_gpus(const char *gpus_dir, const char *dev_prefix)
{
    DIR *d = opendir(gpus_dir);
    struct dirent *e;
    int count = 0, ok = 1;
    if (!d) return 0;
    while (ok && (e = readdir(d)) != NULL) {
        char dev[1024];
        int minor;
        if (e->d_name[0] == '.') continue;
        minor = knn__gpu_minor(gpus_dir, e->d_name);
        ok = minor >= 0 && snprintf(dev, sizeof dev, "%s%d", dev_prefix, minor) < (int)sizeof dev &&
             access(dev, R_OK | W_OK) == 0;
        count++;
    }
    closedir(d);
    return ok ? count : 0;
}

int knn_narrow_gpus_at(int local_rank, const char *gpus_dir, const char *dev_prefix)
{
    char v[16];
    int n;
    if (local_rank < 0 || getenv("CUDA_VISIBLE_DEVICES")) return 0;
    if ((n = knn_node_gpus(gpus_dir, dev_prefix)) < 2) return 0;
    snprintf(v, sizeof v, "%d", local_rank % n);
    knn__narrowed = setenv("CUDA_VISIBLE_DEVICES", v, 1) == 0;
    return knn__narrowed;
}

int knn_narrow_gpus(int local_rank)
{
    return knn_narrow_gpus_at(local_rank, "/proc/driver/nvidia/gpus", "/dev/nvidia");
}

int knn_narrowed(void) { return knn__narrowed; }

/* The variable's value as a whole number in [0, 2^30), or -1 when unset or malformed */
static long knn__env_int(const char *name)
{
    const char *v = getenv(name);
    char *end;
    long x;
    if (!v || !*v) return -1;
    x = strtol(v, &end, 10);
    return !*end && x >= 0 && x < (1L << 30) ? x : -1;
}

int knn_launcher_local_rank(void)
{
    static const char *const names[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"};
    size_t i;
    for (i = 0; i < sizeof names / sizeof names[0]; i++) {
        const long x = knn__env_int(names[i]);
        if (x >= 0) return (int)x;
    }
    return -1;
}

int knn_one_node_pml(void)
{
    const long size = knn__env_int("OMPI_COMM_WORLD_SIZE");
    if (getenv("OMPI_MCA_pml") || size < 1 || knn__env_int("OMPI_COMM_WORLD_LOCAL_SIZE") != size) return 0;
    return setenv("OMPI_MCA_pml", "ob1", 1) == 0;
}
