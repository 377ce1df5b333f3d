/* SPDX-License-Identifier: MIT */
/* launch-t: knn_mpi's one visible GPU per rank (tools/launch.c) on a made-up driver
 * listing: GPUs are counted only when every listed one has an openable device node and
 * a readable minor number; CUDA_VISIBLE_DEVICES is set to local rank mod GPUs only
 * where it was unset, the local rank is known and there are two GPUs or more. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "launch.h"
#include "tap/tap.h"

static char root[256], gpus[300], dev[300];

static void put(const char *path, const char *text, mode_t mode)
{
    FILE *f = fopen(path, "w");
    if (!f) bail("cannot write %s", path);
    fputs(text, f);
    fclose(f);
    if (chmod(path, mode) != 0) bail("cannot chmod %s", path);
}

/* GPU entry i (a PCI address as its name) with the given information text */
static void gpu(int i, const char *info)
{
    char path[400];
    snprintf(path, sizeof path, "%s/0000:%02x:00.0", gpus, i + 4);
    mkdir(path, 0755);
    strcat(path, "/information");
    put(path, info, 0644);
}

static void node(int minor, mode_t mode)
{
    char path[400];
    snprintf(path, sizeof path, "%s%d", dev, minor);
    put(path, "", mode);
}

static const char *cvd(void) { return getenv("CUDA_VISIBLE_DEVICES"); }

int main(void)
{
    char info[128];
    int i;
    const char *tmp = getenv("TMPDIR");
    snprintf(root, sizeof root, "%s/launch-t.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(root)) bail("mkdtemp failed");
    snprintf(gpus, sizeof gpus, "%s/gpus", root);
    snprintf(dev, sizeof dev, "%s/nvidia", root);
    plan(25);
    unsetenv("CUDA_VISIBLE_DEVICES");

    is_int(knn_node_gpus(gpus, dev), 0, "no listing: no GPUs counted");
    mkdir(gpus, 0755);
    is_int(knn_node_gpus(gpus, dev), 0, "an empty listing: none");
    for (i = 0; i < 4; i++) {
        snprintf(info, sizeof info, "Model: \t\t NVIDIA H200\nIRQ:   \t\t 42\nDevice Minor: \t %d\n", 3 - i);
        gpu(i, info);
        node(3 - i, 0666);
    }
    is_int(knn_node_gpus(gpus, dev), 4, "four listed GPUs, each with its node: 4");
    ok(!knn_narrow_gpus_at(-1, gpus, dev) && !cvd(), "no local rank: nothing set");
    ok(knn_narrow_gpus_at(6, gpus, dev) && cvd() && !strcmp(cvd(), "2") && knn_narrowed(),
       "local rank 6 of a node of 4 GPUs: CUDA_VISIBLE_DEVICES=2");
    ok(!knn_narrow_gpus_at(1, gpus, dev) && !strcmp(cvd(), "2"), "already set: left as it is");
    setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3", 1);
    ok(!knn_narrow_gpus_at(0, gpus, dev) && !strcmp(cvd(), "0,1,2,3"), "set by the user to every GPU: left as it is");
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    ok(!knn_narrow_gpus_at(0, gpus, dev) && !strcmp(cvd(), ""), "set empty by the user: left empty");
    unsetenv("CUDA_VISIBLE_DEVICES");

    node(1, 0444);
    if (geteuid() == 0)
        skip(1, "root may open any node");
    else
        is_int(knn_node_gpus(gpus, dev), 0, "one node not writable: none counted");
    node(1, 0666);
    {
        char path[400];
        snprintf(path, sizeof path, "%s1", dev);
        unlink(path);
    }
    is_int(knn_node_gpus(gpus, dev), 0, "one node missing: none counted");
    ok(!knn_narrow_gpus_at(0, gpus, dev) && !cvd(), "and nothing set");
    node(1, 0666);
    is_int(knn_node_gpus(gpus, dev), 4, "the node back: 4");
    gpu(1, "Model: \t\t NVIDIA H200\nDevice Minor: \t x\n");
    is_int(knn_node_gpus(gpus, dev), 0, "a malformed minor number: none counted");
    gpu(1, "Model: \t\t NVIDIA H200\n");
    is_int(knn_node_gpus(gpus, dev), 0, "no minor number: none counted");
    gpu(1, "Device Minor: \t 2\n");
    is_int(knn_node_gpus(gpus, dev), 4, "repaired: 4");

    /* one GPU: nothing to narrow */
    snprintf(gpus, sizeof gpus, "%s/one", root);
    mkdir(gpus, 0755);
    gpu(0, "Device Minor: 0\n");
    ok(!knn_narrow_gpus_at(0, gpus, dev) && !cvd(), "a node of one GPU: nothing set");

    /* the launcher's local rank, in its order of sources */
    unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
    unsetenv("MPI_LOCALRANKID");
    unsetenv("SLURM_LOCALID");
    is_int(knn_launcher_local_rank(), -1, "no launcher: no local rank");
    setenv("SLURM_LOCALID", "3", 1);
    setenv("MPI_LOCALRANKID", "2x", 1);
    is_int(knn_launcher_local_rank(), 3, "a malformed MPI_LOCALRANKID passed over: SLURM_LOCALID's 3");
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    is_int(knn_launcher_local_rank(), 1, "Open MPI's first: 1");

    /* the one-node pml */
    unsetenv("OMPI_MCA_pml");
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    ok(!knn_one_node_pml() && !getenv("OMPI_MCA_pml"), "no Open MPI launcher: no pml set");
    setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
    ok(!knn_one_node_pml() && !getenv("OMPI_MCA_pml"), "8 ranks, 4 on this node: no pml set");
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4x", 1);
    ok(!knn_one_node_pml() && !getenv("OMPI_MCA_pml"), "a malformed local size: no pml set");
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
    setenv("OMPI_MCA_pml", "ucx", 1);
    ok(!knn_one_node_pml() && !strcmp(getenv("OMPI_MCA_pml"), "ucx"), "a pml chosen: left as it is");
    unsetenv("OMPI_MCA_pml");
    ok(knn_one_node_pml() && getenv("OMPI_MCA_pml") && !strcmp(getenv("OMPI_MCA_pml"), "ob1"),
       "4 ranks, all on this node: OMPI_MCA_pml=ob1");
    unsetenv("OMPI_MCA_pml");
    setenv("OMPI_COMM_WORLD_SIZE", "1", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1", 1);
    ok(knn_one_node_pml() && !strcmp(getenv("OMPI_MCA_pml"), "ob1"), "one rank: ob1");

    {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
        if (system(cmd) != 0) diag("could not remove %s", root);
    }
    return tap_done();
}
