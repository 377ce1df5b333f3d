/* SPDX-License-Identifier: MIT */
/*
 * tools/narrow.h -- knn_mpi's one visible GPU per rank.
 *
 * The CUDA driver's start opens every visible GPU in every process: with four ranks on a
 * node of four GPUs that is sixteen openings at once, several times slower than four.
 * Where the launcher names the local rank and CUDA_VISIBLE_DEVICES is unset, the rank
 * sees only the GPU it would choose anyway (local rank mod the node's GPUs, the rule of
 * xknn_mpi_create), so devices, results and messages are those of an unnarrowed run.
 *
 * Guarantees: nothing is narrowed unless the node's GPUs are counted without doubt:
 * every GPU the driver lists (/proc/driver/nvidia/gpus) has a device node this process
 * may open, and there are two or more. A CUDA_VISIBLE_DEVICES set by the user, even to
 * every GPU, is left as it is: that is the way to turn narrowing off.
 */
#ifndef XKNN_TOOLS_NARROW_H
#define XKNN_TOOLS_NARROW_H

/* Sets CUDA_VISIBLE_DEVICES to local_rank mod the node's GPUs where the guarantees above
 * hold; returns 1 when it did. Call before any CUDA call and before other threads start
 * (setenv). */
int knn_narrow_gpus(int local_rank);

/* 1 when knn_narrow_gpus set CUDA_VISIBLE_DEVICES in this process */
int knn_narrowed(void);

/* knn_narrow_gpus with the driver's listing and the device nodes' prefix named (the
 * command passes /proc/driver/nvidia/gpus and /dev/nvidia; tests pass their own) */
int knn_narrow_gpus_at(int local_rank, const char *gpus_dir, const char *dev_prefix);

/* The GPUs listed in gpus_dir when every one has a device node dev_prefix<minor> this
 * process may read and write; 0 when any has not, or none is listed */
int knn_node_gpus(const char *gpus_dir, const char *dev_prefix);

#endif
