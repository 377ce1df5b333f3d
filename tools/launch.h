/* SPDX-License-Identifier: MIT */
/*
 * tools/launch.h -- what knn_mpi sets in its own environment before MPI_Init and the CUDA
 * driver's start, from what the launcher exports. Both only where the user chose nothing,
 * and neither changes a result.
 *
 * One visible GPU per rank. The driver's start opens every visible GPU in every process:
 * four ranks on a node of four GPUs make sixteen openings at once, several times slower
 * than four. Where the launcher names the local rank and CUDA_VISIBLE_DEVICES is unset,
 * the rank sees only the GPU it would choose anyway (local rank mod the node's GPUs, the
 * rule of xknn_mpi_create). Only when the node's GPUs are counted without doubt: every
 * GPU the driver lists (/proc/driver/nvidia/gpus) has a device node this process may
 * open, and there are two or more. A CUDA_VISIBLE_DEVICES of the user's, even one naming
 * every GPU, is left as it is: that is how to turn this off.
 *
 * Shared-memory messaging on one node. Where Open MPI's launcher says every rank of the
 * job is on this node and no point-to-point layer is chosen (OMPI_MCA_pml unset; mpirun's
 * --mca pml sets it), OMPI_MCA_pml=ob1: its shared-memory transport serves a one-node
 * job, while choosing among the layers probes network libraries the job does not use
 * (UCX; cm's libfabric), most of MPI_Init's time otherwise. knn_mpi passes MPI host
 * memory only, so nothing depends on a CUDA-aware transport.
 */
#ifndef XKNN_TOOLS_LAUNCH_H
#define XKNN_TOOLS_LAUNCH_H

/* The local rank the launcher exports (Open MPI, MPICH/Hydra, Slurm), or -1 */
int knn_launcher_local_rank(void);

/* Sets CUDA_VISIBLE_DEVICES to local_rank mod the node's GPUs where the rules above
 * allow; returns 1 when it did. Call before any CUDA call and before other threads
 * start (setenv). */
int knn_narrow_gpus(int local_rank);

/* 1 when knn_narrow_gpus set CUDA_VISIBLE_DEVICES in this process */
int knn_narrowed(void);

/* knn_narrow_gpus with the driver's listing and the device nodes' prefix named (the
 * command passes /proc/driver/nvidia/gpus and /dev/nvidia; tests pass their own) */
int knn_narrow_gpus_at(int local_rank, const char *gpus_dir, const char *dev_prefix);

/* The GPUs listed in gpus_dir when every one has a device node dev_prefix<minor> this
 * process may read and write; 0 when any has not, or none is listed */
int knn_node_gpus(const char *gpus_dir, const char *dev_prefix);

/* Sets OMPI_MCA_pml=ob1 where the rules above allow; returns 1 when it did. Call before
 * MPI_Init and before other threads start. */
int knn_one_node_pml(void);

#endif
