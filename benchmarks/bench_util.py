# SPDX-License-Identifier: MIT
"""Helpers shared by the benchmarks' Python scripts (plot.py, scaling_model.py,
peers_torch.py, peers_metrics.py, the device scripts' summaries and
python/bench/gpu_torch.py). Standard library only; torch is passed in by the callers
that time on the GPU, so importing this module imports nothing else."""
import json


def runs_of(doc):
    """The runs of a result document: a list of runs as it is, a single run as [doc]."""
    return doc if isinstance(doc, list) else [doc]


def json_runs(paths):
    """(path, run) for every run of every JSON file in paths, in order; a file that
    cannot be read or parsed raises."""
    for p in paths:
        with open(p) as f:
            doc = json.load(f)
        for run in runs_of(doc):
            yield p, run


def read_json(path):
    """The parsed JSON file, or None after printing "# cannot read PATH: why"."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"# cannot read {path}: {e}")
        return None


def cuda_times_ms(torch, fn, repeats):
    """Milliseconds of each of `repeats` calls of fn() (CUDA events around each, the device
    synchronised after each), after one untimed warm-up call."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return times
