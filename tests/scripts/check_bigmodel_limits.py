"""bigmodel.limits.P<N>: training beyond one process (issue 33). Each of N Gloo processes runs in a memory cgroup of
its own (cgroup v1, a child of this process's group) with the same limit L. The model built whole is killed under L;
built by accel::construct_sharded it trains 20 steps under L, and its parameters equal, bit for bit, those of the
same run built whole without a limit. Prints each process's memory.max_usage_in_bytes for every job.

L is set from what is measured here, so that the arithmetic holds on any machine: L = B + 3 M / 4, where B is the
largest peak of a process that starts the job, fills its flight recorder's ring, and ends (LibTorch, Gloo, the
recorder: its own resident set) and M the model's
bytes. Whole, a process needs B + M at least (the model alone does not fit beside the baseline); sharded at N = 8,
B + 2 M / N (its slices and their gradients) + a few units whole and their buffers (its LibTorch tensors peak at
0.52 M, counted by accel's allocator).

Then checkpoints under the same limits: the sharded job saves the sharded format under L; jobs of N and N / 2
processes load it under L and 2 L, each process's loaded slices equal to the saved ones bit for bit; `accel
merge-weights` merges it in one process under B_merge + M / 2 (B_merge: the merge's own LibTorch baseline, itself
more than M), its file equal to the whole-model run's tensors bit for bit. And the estimate: each sharded process's
accel::estimate_training_bytes figure within 10% of the tensor storage accel's allocator counted, and, with B added,
of its group's memory.max_usage_in_bytes; the same for each loading process; and `accel estimate-memory` of the merged
file, its shard units named by --shard_units, within 10% of what process 0 of the sharded job counted.

Usage: check_bigmodel_limits.py ACCEL_CLI WORKER WORK_DIR PROCESSES
Exit 77 (skipped, with the reason) where the cgroup v1 memory controller is missing or not writable.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zlib

from checks import CheckFailed, check, job_environment

SKIP = 77
MEMORY_ROOT = "/sys/fs/cgroup/memory"


def own_memory_group():
    """This process's memory cgroup directory (cgroup v1), or None."""
    with open("/proc/self/cgroup") as lines:
        for line in lines:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if "memory" in controllers.split(","):
                return os.path.join(MEMORY_ROOT, path.lstrip("/"))
    return None


def read_number(group, name):
    with open(os.path.join(group, name)) as f:
        return int(f.read().split()[0])


def oom_kills(group):
    """OOM kills inside the group (memory.oom_control's oom_kill, where the kernel reports it), else its failcnt."""
    with open(os.path.join(group, "memory.oom_control")) as f:
        for line in f:
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    return read_number(group, "memory.failcnt")


class Groups:
    """N cgroups PARENT/accel-bigmodel-PID-<rank>, made afresh for each job and removed after it, even on failure:
    any process still in one (only this test's workers go there) is killed first."""

    def __init__(self, parent, count):
        self.prefix = os.path.join(parent, "accel-bigmodel-%d-" % os.getpid())
        self.paths = [self.prefix + str(r) for r in range(count)]

    def make(self, limit):
        self.remove()
        for path in self.paths:
            os.mkdir(path)
            if limit is not None:
                with open(os.path.join(path, "memory.limit_in_bytes"), "w") as f:
                    f.write(str(limit))
                swap = os.path.join(path, "memory.memsw.limit_in_bytes")
                if os.path.exists(swap):  # no swapping past the limit: over it, a process is killed
                    with open(swap, "w") as f:
                        f.write(str(limit))

    def remove(self):
        for path in self.paths:
            if not os.path.isdir(path):
                continue
            for _ in range(100):
                with open(os.path.join(path, "cgroup.procs")) as f:
                    pids = [int(p) for p in f.read().split()]
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                try:
                    os.rmdir(path)
                    break
                except OSError:
                    time.sleep(0.05)


def run_job(cli, worker, work_dir, groups, mode, limit):
    """Runs one job of len(groups.paths) processes, each in its group under `limit` (None: no limit); returns the
    launcher's exit code, each group's peak and OOM kills."""
    groups.make(limit)
    env = job_environment()
    env["ACCEL_TEST_CGROUP_PREFIX"] = groups.prefix
    # glibc raises its mmap threshold each time a large block is freed, after which the unit-sized blocks a sharded
    # step allocates and frees come from its heaps, which keep what is freed: the resident set then grows with what
    # was ever allocated (176 MiB against 85 MiB at P = 4, measured), not with what is held. Fixed at glibc's default.
    env["MALLOC_MMAP_THRESHOLD_"] = "131072"
    processes = len(groups.paths)
    command = [cli, "launch", "--nproc_per_node", str(processes), "--master_port", "0", worker, mode, work_dir]
    started = time.monotonic()
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    seconds = time.monotonic() - started
    peaks = [read_number(g, "memory.max_usage_in_bytes") for g in groups.paths]
    kills = [oom_kills(g) for g in groups.paths]
    groups.remove()
    shown = "unlimited" if limit is None else "limit %.1f MiB" % (limit / 2**20)
    print("%-8s P = %d  %-18s exit %3d  %.1f s  peaks (MiB): %s  oom kills: %s" % (
        mode, processes, shown, result.returncode, seconds, " ".join("%.1f" % (p / 2**20) for p in peaks), kills))
    return result, peaks, kills


def read_parameters(work_dir):
    """(name, elements) of every parameter in order, as the whole-model job wrote them."""
    with open(os.path.join(work_dir, "parameters")) as f:
        return [(name, int(n)) for name, n in (line.split() for line in f)]


def owned_span(elements, processes, rank):
    """Process `rank`'s slice of a tensor of `elements`: chunks of ceil(n / P) of the flattened elements."""
    chunk = -(-elements // processes)
    begin = min(elements, rank * chunk)
    return begin, min(elements, begin + chunk)


def whole_parameters(work_dir, prefix, parameters, processes):
    """Each parameter's bytes whole (float32), assembled from the slices files PREFIX-rank<R>.bin of a job of
    `processes`."""
    pieces = {name: [] for name, _ in parameters}
    for r in range(processes):
        with open(os.path.join(work_dir, "%s-rank%d.bin" % (prefix, r)), "rb") as f:
            data = f.read()
        offset = 0
        for name, elements in parameters:
            begin, end = owned_span(elements, processes, r)
            pieces[name].append(data[offset:offset + 4 * (end - begin)])
            offset += 4 * (end - begin)
        check(offset == len(data),
              "%s-rank%d.bin holds %d B, not the %d B of its slices" % (prefix, r, len(data), offset))
    return {name: b"".join(parts) for name, parts in pieces.items()}


def check_loaded(work_dir, parameters, reference, processes):
    """Every process's loaded slices (the bytes and CRC-32 it wrote, load-P<N>-rank<R>.crc) against its slice of the
    saved parameters."""
    for r in range(processes):
        with open(os.path.join(work_dir, "load-P%d-rank%d.crc" % (processes, r))) as f:
            got = tuple(int(x) for x in f.read().split())
        expected = b"".join(reference[name][4 * b:4 * e] for name, n in parameters
                            for b, e in [owned_span(n, processes, r)])
        check(len(expected) > 0 and got == (len(expected), zlib.crc32(expected)),
              "process %d of %d: the loaded parameters (%s B, CRC-32 %s) differ from the saved ones (%d B, %d)" % (
                  r, processes, got[0], got[-1], len(expected), zlib.crc32(expected)))
    print("load at P = %d: every process's parameters equal the saved ones, bit for bit (bytes and CRC-32)" % processes)


def read_safetensors(path):
    """{name: bytes} of a safetensors file."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
        data = f.read()
    return {name: data[entry["data_offsets"][0]:entry["data_offsets"][1]]
            for name, entry in header.items() if name != "__metadata__"}


def run_in_group(parent, limit, command):
    """Runs `command` in a memory group of its own under `limit` (None: no limit); returns its result, the group's
    peak and OOM kills, and the seconds it took."""
    group = Groups(parent, 1)
    group.make(limit)

    def enter():
        with open(os.path.join(group.paths[0], "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    try:
        started = time.monotonic()
        result = subprocess.run(command, env=job_environment(), capture_output=True, text=True, timeout=120,
                                preexec_fn=enter)
        seconds = time.monotonic() - started
        return result, read_number(group.paths[0], "memory.max_usage_in_bytes"), oom_kills(group.paths[0]), seconds
    finally:
        group.remove()


def merge_baseline(cli, parent):
    """The peak of `accel merge-weights` that starts (LibTorch: it runs accel-selftest) and stops at once, refusing a
    missing checkpoint: the merge's own baseline."""
    command = [cli, "merge-weights", "/nonexistent-accel-checkpoint", "/nonexistent"]
    result, peak, _, _ = run_in_group(parent, None, command)
    check(result.returncode != 0 and "no checkpoint at" in result.stderr,
          "merge-weights of a missing checkpoint did not refuse it: " + result.stdout + result.stderr)
    return peak


def run_merge(cli, work_dir, parent, limit):
    """`accel merge-weights` of the saved checkpoint, in a group of its own under `limit`; returns the directory it
    wrote."""
    merged = os.path.join(work_dir, "merged")
    shutil.rmtree(merged, ignore_errors=True)
    result, peak, kills, seconds = run_in_group(
        parent, limit, [cli, "merge-weights", os.path.join(work_dir, "checkpoint"), merged])
    print("merge    P = 1  limit %.1f MiB  exit %3d  %.1f s  peak (MiB): %.1f  oom kills: %d" % (
        limit / 2**20, result.returncode, seconds, peak / 2**20, kills))
    check(result.returncode == 0 and kills == 0, "merge-weights failed under its limit (oom kills %d):\n%s%s" % (
        kills, result.stdout, result.stderr))
    return merged


def print_estimates(work_dir, job, processes, peaks, baseline):
    """Prints accel::estimate_training_bytes' peak for the job beside each process's measured peaks; returns
    (estimate, counted tensor storage) per process."""
    figures = []
    for r in range(processes):
        with open(os.path.join(work_dir, "%s-P%d-estimate-rank%d" % (job, processes, r))) as f:
            estimate, counted = (int(x) for x in f.read().split())
        print("%s P = %d process %d: estimate %.2f MiB, counted %.2f MiB (%+.1f%%); B + estimate %.1f MiB, "
              "measured %.1f MiB (%+.1f%%)" % (
                  job, processes, r, estimate / 2**20, counted / 2**20, 100.0 * (estimate / counted - 1),
                  (baseline + estimate) / 2**20, peaks[r] / 2**20, 100.0 * ((baseline + estimate) / peaks[r] - 1)))
        figures.append((estimate, counted))
    return figures


def check_estimates(work_dir, job, processes, peaks, baseline):
    """accel::estimate_training_bytes' peak for the job against each process's measured peaks: within 10% of the
    tensor storage counted by accel's allocator, and, with the baseline B added, of memory.max_usage_in_bytes."""
    for r, (estimate, counted) in enumerate(print_estimates(work_dir, job, processes, peaks, baseline)):
        check(abs(estimate / counted - 1) <= 0.10, "%s P = %d process %d: the estimate %d B is not within 10%% of "
              "the %d B of tensor storage counted" % (job, processes, r, estimate, counted))
        check(abs((baseline + estimate) / peaks[r] - 1) <= 0.10, "%s P = %d process %d: B + the estimate, %d B, is "
              "not within 10%% of the measured peak %d B" % (job, processes, r, baseline + estimate, peaks[r]))


def train_under_limit(cli, worker, work_dir, parent, processes):
    """The training jobs: the baseline, the whole model unlimited and under L (killed), construct_sharded under L
    (which saves the sharded checkpoint). Returns B (the baseline job's median peak), L, M and the sharded job's
    peaks."""
    groups = Groups(parent, processes)
    try:
        baseline, baseline_peaks, _ = run_job(cli, worker, work_dir, groups, "baseline", None)
        check(baseline.returncode == 0, "the baseline job failed:\n" + baseline.stdout + baseline.stderr)
        reference, whole_peaks, _ = run_job(cli, worker, work_dir, groups, "whole", None)
        check(reference.returncode == 0, "the unlimited whole-model job failed:\n" + reference.stdout + reference.stderr)
        with open(os.path.join(work_dir, "model_bytes")) as f:
            model_bytes = int(f.read())
        limit = max(baseline_peaks) + 3 * model_bytes // 4
        print("baseline B = %.1f MiB (largest), model M = %.1f MiB, limit L = B + 3 M / 4 = %.1f MiB" % (
            max(baseline_peaks) / 2**20, model_bytes / 2**20, limit / 2**20))
        check(max(whole_peaks) > limit, "the whole-model job peaked at %d B, under L = %d B" % (max(whole_peaks), limit))
        for name in os.listdir(work_dir):
            if name.startswith("whole-rank"):
                os.rename(os.path.join(work_dir, name), os.path.join(work_dir, "reference-" + name))
        killed, _, kills = run_job(cli, worker, work_dir, groups, "whole", limit)
        check(killed.returncode != 0 and sum(kills) > 0,
              "the whole-model job was not killed under L (exit %d, oom kills %s)" % (killed.returncode, kills))
        sharded, sharded_peaks, kills = run_job(cli, worker, work_dir, groups, "sharded", limit)
        check(sharded.returncode == 0 and sum(kills) == 0,
              "the sharded job failed under L (oom kills %s):\n%s%s" % (kills, sharded.stdout, sharded.stderr))
        check(max(sharded_peaks) <= limit, "a sharded process peaked over L")
    finally:
        groups.remove()
    for r in range(processes):
        with open(os.path.join(work_dir, "reference-whole-rank%d.bin" % r), "rb") as f:
            expected = f.read()
        with open(os.path.join(work_dir, "sharded-rank%d.bin" % r), "rb") as f:
            got = f.read()
        check(len(expected) > 0 and got == expected,
              "process %d's trained slices differ from the unlimited whole-model run's" % r)
    print("the sharded run's parameters equal the unlimited whole-model run's, bit for bit, on every process")
    print("above the baseline: whole %.1f MiB, sharded %.1f MiB (the largest process)" % (
        (max(whole_peaks) - max(baseline_peaks)) / 2**20, (max(sharded_peaks) - max(baseline_peaks)) / 2**20))
    # For the estimate, the median: a process's own LibTorch baseline. The largest (for L, the safe side) can carry
    # library pages that process faulted in first, charged to its group alone (65.3 MiB against 57.4 once).
    return sorted(baseline_peaks)[len(baseline_peaks) // 2], limit, model_bytes, sharded_peaks


def cache_files(directory):
    """Reads every file under `directory`, so that its pages are in the page cache, charged to this driver's group:
    a process that then reads them is charged its own memory only, not, depending on whether the files were still
    cached, the page cache of what it read (6.4 MiB once at P = 8: its shard file read again from disk)."""
    for root, _, names in os.walk(directory):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                while f.read(1 << 20):
                    pass


def load_under_limit(cli, worker, work_dir, parent, processes, limit, parameters, reference):
    """Loads the sharded checkpoint on `processes` processes, each under `limit`; returns their peaks."""
    cache_files(os.path.join(work_dir, "checkpoint"))
    groups = Groups(parent, processes)
    try:
        loaded, peaks, kills = run_job(cli, worker, work_dir, groups, "load", limit)
    finally:
        groups.remove()
    check(loaded.returncode == 0 and sum(kills) == 0, "the load at P = %d failed under %d B (oom kills %s):\n%s%s" % (
        processes, limit, kills, loaded.stdout, loaded.stderr))
    check(max(peaks) <= limit, "a loading process peaked over its limit")
    check_loaded(work_dir, parameters, reference, processes)
    return peaks


def merge_under_limit(cli, work_dir, parent, model_bytes, reference):
    """`accel merge-weights` in one process under B_merge + M / 2, its own baseline and half the model: the merged
    file holds every parameter of the whole-model reference, bit for bit."""
    baseline = merge_baseline(cli, parent)
    limit = baseline + model_bytes // 2
    print("merge-weights: baseline B_merge = %.1f MiB, limit B_merge + M / 2 = %.1f MiB" % (
        baseline / 2**20, limit / 2**20))
    merged = run_merge(cli, work_dir, parent, limit)
    tensors = read_safetensors(os.path.join(merged, "model.safetensors"))
    check(sorted(tensors) == sorted(reference), "the merged file's tensors %s are not the model's %s" % (
        sorted(tensors)[:4], sorted(reference)[:4]))
    for name, data in reference.items():
        check(tensors[name] == data, "the merged %s differs from the whole-model run's" % name)
    print("merge-weights: every tensor equals the unlimited whole-model run's, bit for bit")


def check_cli_estimate(cli, work_dir, processes):
    """`accel estimate-memory` of the merged model.safetensors (the model's headers alone) with its shard units named:
    its fully_sharded step peak at P = N within 10% of the tensor storage process 0 of the sharded job counted."""
    merged = os.path.join(work_dir, "merged", "model.safetensors")
    figures = {}
    for units in ([], ["--shard_units", r"block[0-9]+"]):
        result = subprocess.run([cli, "estimate-memory", merged, "--num_processes", str(processes), "--optimizer",
                                 "sgd", "--mixed_precision", "no", "--bytes"] + units,
                                capture_output=True, text=True, timeout=60)
        check(result.returncode == 0, "accel estimate-memory failed:\n" + result.stdout + result.stderr)
        rows = [line.split() for line in result.stdout.splitlines()]
        figures[bool(units)] = next(int(row[4]) for row in rows if row[1] == "fully_sharded")
    with open(os.path.join(work_dir, "sharded-P%d-estimate-rank0" % processes)) as f:
        counted = int(f.read().split()[1])
    print("accel estimate-memory --shard_units 'block[0-9]+': fully_sharded step peak at P = %d %.2f MiB, counted "
          "%.2f MiB (%+.1f%%); without --shard_units (the whole model gathered) %.2f MiB (%+.1f%%)" % (
              processes, figures[True] / 2**20, counted / 2**20, 100.0 * (figures[True] / counted - 1),
              figures[False] / 2**20, 100.0 * (figures[False] / counted - 1)))
    check(abs(figures[True] / counted - 1) <= 0.10, "accel estimate-memory's step peak %d B is not within 10%% of "
          "the %d B process 0 counted" % (figures[True], counted))


def main():
    cli, worker, work_dir, processes = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    parent = own_memory_group()
    if parent is None or not os.path.isfile(os.path.join(parent, "memory.limit_in_bytes")):
        print("skipped: no cgroup v1 memory controller here (%s/<group>/memory.limit_in_bytes)" % MEMORY_ROOT)
        return SKIP
    probe = os.path.join(parent, "accel-bigmodel-probe-%d" % os.getpid())
    try:
        os.mkdir(probe)
        os.rmdir(probe)
    except OSError as error:
        print("skipped: cannot make a memory cgroup under %s (%s); the test needs root" % (parent, error))
        return SKIP
    shutil.rmtree(work_dir, ignore_errors=True)
    os.makedirs(work_dir)
    try:
        baseline, limit, model_bytes, sharded_peaks = train_under_limit(cli, worker, work_dir, parent, processes)
        check_estimates(work_dir, "sharded", processes, sharded_peaks, baseline)
        parameters = read_parameters(work_dir)
        reference = whole_parameters(work_dir, "reference-whole", parameters, processes)
        for count, job_limit in ((processes, limit), (processes // 2, 2 * limit)):
            peaks = load_under_limit(cli, worker, work_dir, parent, count, job_limit, parameters, reference)
            check_estimates(work_dir, "load", count, peaks, baseline)
        merge_under_limit(cli, work_dir, parent, model_bytes, reference)
        check_cli_estimate(cli, work_dir, processes)
    except CheckFailed as failure:
        print("FAILED: %s" % failure)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
