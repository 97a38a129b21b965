#!/usr/bin/env python3
"""What crosses the machines' links, and how fast a step is when the links are slow: accel against PyTorch on the
namespace cluster (tests/scripts/cluster.py: 2 machines of 2 processes, each machine a network namespace joined to
the other by a veth link). Root only (the cluster makes namespaces); otherwise it says why and exits with 77.

usage: cluster_links.py ACCEL BENCH_CLUSTER_STEP PYTHON_WITH_TORCH [ROUNDS] [--only=bytes|time]

1. Bytes per step crossing machine1's link (the counters of the switch's end of its veth), for accel's
   data_parallel, zero2, fully_sharded and hybrid_sharded (dp_replicate 2 across the machines x dp_shard 2 within
   each), and PyTorch 2.13's DDP and FSDP2 for comparison, on unlimited links. Each job runs twice, for 10 and for 30
   timed steps; the difference of the two runs' bytes, less what the links carry while the launchers alone run (their
   heartbeats: the idle baseline, per second, times the runs' difference in length), divided by 20, is one step's:
   start-up, the first broadcast and the teardown cancel out. accel's figures are checked against `link_formula`,
   what Gloo's algorithms send for the collectives each policy issues (below): a step must carry at least the
   formula's payload, and at most that plus what TCP/IP adds to it (HEADERS); a mismatch is printed as such.
2. Milliseconds per step with each link limited to 1 Gbit/s and to 100 Mbit/s (tc tbf, both directions), every job
   in each round (in an order that rotates), ROUNDS rounds (default 3), the medians, and each job's median ratio to
   PyTorch's DDP and FSDP2 of the same round.

The model is bench/cluster_step.cpp's and bench/cluster_step.py's: 4 hidden Linear layers of width 512 with ReLU,
then 8 outputs (1,054,728 float32 parameters, 4.2 MB: every tensor's size a multiple of 8, so that no collective
pads); AdamW, batch 32 per process, one thread per process, Gloo over the machines' eth0.
"""
import io
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "scripts"))
import cluster as harness  # noqa: E402

WIDTH = 512
PORT = "29500"
RATES = {"1 Gbit/s": 1_000_000_000, "100 Mbit/s": 100_000_000}
STEPS = {"1 Gbit/s": (20, 3), "100 Mbit/s": (8, 2)}  # timed steps, warm-up steps
BYTE_RUNS = (10, 30)  # the two run lengths (timed steps after 2 warm-up ones) whose difference is 20 steps
ACCEL = ["data_parallel", "zero2", "fully_sharded", "hybrid_sharded"]
PYTORCH = ["pytorch_ddp", "pytorch_fsdp2"]
JOB_TIMEOUT = 300
# What the link carries beyond Gloo's payload: Ethernet, IP and TCP headers (66 bytes a packet; a veth passes
# TSO/GSO packets of up to 64 kB, each counted with one set of headers), the acknowledgements of the other direction's
# packets, and Gloo's own messages (a 48-byte preamble per send and per ready notice). 0.24% to 0.33% measured
# (2026-11-27, docs/performance.md); 1% bounds it.
HEADERS = 0.01

# ---- What Gloo's algorithms send (gloo/allreduce.cc, allgather.cc, alltoall.cc, broadcast.cc, as bundled with
# ---- PyTorch 2.13's ProcessGroupGloo). Each returns the (sender, receiver, bytes) of every message.


def ceil_div(a, b):
    return -(-a // b)


def ring_allreduce(group, nbytes, element=4):
    """gloo::allreduce (ring): the buffer cut into 2 x len(group) segments (rounded up to elements), each rank sends
    len(group) x 2 - 2 segments to the rank before it while reduce-scattering, as many while all-gathering (a segment
    past the end of the buffer is shorter, or not sent)."""
    size = len(group)
    if size == 1:
        return []
    segment = ceil_div(ceil_div(nbytes, 2 * size), element) * element  # maxSegmentSize: unlimited in c10d
    segments = ceil_div(max(ceil_div(nbytes, segment), 2 * size), size) * size
    per_rank = segments // size
    messages = []
    for index, rank in enumerate(group):
        to = group[(index - 1) % size]
        for phase_start in (index + 1, index):  # reduce-scatter's first segment, then all-gather's
            for i in range(segments - 2):
                offset = ((phase_start * per_rank + i) * segment) % (segments * segment)
                length = min(segment, nbytes - offset)
                if length > 0:
                    messages.append((rank, to, length))
    return messages


def ring_allgather(group, nbytes):
    """gloo::allgather (ring; c10d's _allgather_base): each rank sends len(group) - 1 chunks of nbytes / len(group)
    to the rank after it, each chunk in two halves."""
    size = len(group)
    chunk = nbytes // size
    return [(rank, group[(index + 1) % size], chunk) for index, rank in enumerate(group) for _ in range(size - 1)]


def alltoall(group, nbytes):
    """gloo::alltoall: each rank sends its nbytes / len(group) segment for each other rank straight to it."""
    chunk = nbytes // len(group)
    return [(rank, other, chunk) for rank in group for other in group if other != rank]


def binomial_broadcast(group, root_index, nbytes):
    """gloo::broadcast: a binomial tree from the root, lowest bit first (virtual rank v sends to v + 1, then v and
    v + 1 to v + 2 and v + 3, ...), virtual ranks counted from the root."""
    size = len(group)
    messages, step = [], 1
    while step < size:
        for virtual in range(step):
            if virtual + step < size:
                messages.append((group[(virtual + root_index) % size], group[(virtual + step + root_index) % size],
                                 nbytes))
        step *= 2
    return messages


def gather_in_place(group, nbytes):
    """accel's in-place all-gather (gloo_communicator::all_gather_into): each rank's part broadcast from it."""
    return [m for root in range(len(group)) for m in binomial_broadcast(group, root, nbytes // len(group))]


# ---- Which collectives each accel policy issues per step (docs/sharded.md, gloo_communicator.hpp,
# ---- optimizer_shards.hpp): per-step bytes are sums over tensors, exact because every size divides evenly.
DIRECT_GATHER_BYTES = 1 << 20  # optimizer_shards.hpp: a parameter this large that splits evenly is gathered in place


def model_tensors(width=WIDTH):
    """The bench model's parameter sizes in bytes: 4 Linear(width, width) then Linear(width, 8), weight then bias."""
    sizes = []
    for out in [width] * 4 + [8]:
        sizes += [out * width * 4, out * 4]
    return sizes


def parameter_gather(group, tensors):
    """The sharded policies' all-gather of the parameters: each large parameter that splits evenly in place
    (broadcasts from each rank), the others through buffers (Gloo's ring all-gather)."""
    direct = [t for t in tensors if t >= DIRECT_GATHER_BYTES and (t // 4) % len(group) == 0]
    staged = sum(tensors) - sum(direct)
    return [m for t in direct for m in gather_in_place(group, t)] + ring_allgather(group, staged)


def policy_messages(policy, tensors):
    """Every message one step of `policy` sends on 2 machines x 2 processes (ranks 0, 1 on machine0; 2, 3 on
    machine1)."""
    everyone, total = [0, 1, 2, 3], sum(tensors)
    if policy == "data_parallel":  # gradient buckets all-reduced
        return ring_allreduce(everyone, total)
    if policy in ("zero2", "fully_sharded"):
        # Gradient buckets reduce-scattered (an all-to-all, then a local sum), the stepped slices gathered (zero2:
        # after the step; fully_sharded: before forward, the whole model at once).
        return alltoall(everyone, total) + parameter_gather(everyone, tensors)
    if policy == "hybrid_sharded":
        # Shard groups are the machines: reduce-scatter and gather within them; each reduced segment all-reduced
        # across the replicas (ranks r and r + 2).
        within = [m for group in ([0, 1], [2, 3]) for m in alltoall(group, total) + parameter_gather(group, tensors)]
        return within + [m for group in ([0, 2], [1, 3]) for m in ring_allreduce(group, total // 2)]
    raise ValueError(policy)


def link_formula(policy, tensors=None):
    """(bytes machine1 sends, bytes it receives) per step of `policy`, Gloo's payload: the formula."""
    machine = lambda rank: rank // 2  # noqa: E731
    messages = policy_messages(policy, tensors or model_tensors())
    sent = sum(b for src, dst, b in messages if machine(src) == 1 and machine(dst) == 0)
    received = sum(b for src, dst, b in messages if machine(src) == 0 and machine(dst) == 1)
    return sent, received


# ---- Running the jobs on the cluster.


def job_command(name, accel, bench, python, steps, warmup):
    launch = ["--nnodes", "2", "--node_rank", "{node_rank}", "--nproc_per_node", "2", "--master_addr",
              "{master_addr}", "--master_port", PORT]
    args = [name, str(WIDTH), str(steps), str(warmup)]
    if name in PYTORCH:
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cluster_step.py")
        return [python, "-m", "torch.distributed.run", *launch, script, *args]
    mesh = (["--parallelism_config_dp_replicate_size", "2", "--parallelism_config_dp_shard_size", "2"]
            if name == "hybrid_sharded" else [])
    return [accel, "launch", *launch, *mesh, bench, *args]


def environment():
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1", ACCEL_CONFIG_FILE="")
    return env


def run_everywhere(cluster, command):
    """Runs `command` on both machines to its end; returns (its output, bytes machine1 sent and received, seconds)."""
    output = io.StringIO()
    before, started = cluster.link_bytes(1), time.monotonic()
    codes = harness.run_everywhere(cluster, command, JOB_TIMEOUT, env=environment(), output=output)
    seconds, after = time.monotonic() - started, cluster.link_bytes(1)
    if codes != [0, 0]:
        sys.exit(f"job failed ({codes}): {' '.join(command)}\n{output.getvalue()}")
    return output.getvalue(), (after[0] - before[0], after[1] - before[1]), seconds


def run_job(cluster, command):
    """Runs a benchmark job; returns (the fields of machine0's last figure line, bytes machine1 sent and received,
    seconds)."""
    text, crossed, seconds = run_everywhere(cluster, command)
    lines = [line.split()[1:] for line in text.splitlines() if line.startswith("[machine0] ") and
             len(line.split()) == 5 and line.split()[1] in ACCEL + PYTORCH]
    if not lines:
        sys.exit(f"no figure from: {' '.join(command)}\n{text}")
    return lines[-1], crossed, seconds


def idle_rate(cluster, accel):
    """Bytes per second crossing machine1's link (each way) while only the launchers run (`sleep 8` as the job):
    their heartbeats, the links' own chatter."""
    _, crossed, seconds = run_everywhere(cluster, [accel, "launch", "--nnodes", "2", "--node_rank", "{node_rank}",
                                                   "--nproc_per_node", "2", "--master_addr", "{master_addr}",
                                                   "--master_port", PORT, "sleep", "8"])
    return crossed[0] / seconds, crossed[1] / seconds


def measure_bytes(accel, bench, python):
    """Per-step bytes machine1 sends and receives for each job, and for accel's the formula's."""
    rows = {}
    with harness.Cluster(2, lifetime=3600) as cluster:
        idle = idle_rate(cluster, accel)
        print(f"idle baseline (launchers' heartbeats): {idle[0]:.0f} B/s sent, {idle[1]:.0f} B/s received")
        for name in ACCEL + PYTORCH:
            runs = [run_job(cluster, job_command(name, accel, bench, python, steps, 2)) for steps in BYTE_RUNS]
            (_, short, short_s), (_, long, long_s) = runs
            per_step = [(long[i] - short[i] - idle[i] * (long_s - short_s)) / (BYTE_RUNS[1] - BYTE_RUNS[0])
                        for i in (0, 1)]
            rows[name] = per_step
    return rows


def measure_times(accel, bench, python, rounds):
    """ms per step of every job at each rate: {rate: {job: [per round]}}."""
    names = ACCEL + PYTORCH
    times = {}
    for label, rate in RATES.items():
        steps, warmup = STEPS[label]
        times[label] = {name: [] for name in names}
        with harness.Cluster(2, rate=rate, lifetime=3600) as cluster:
            for r in range(rounds):
                for name in names[r % len(names):] + names[:r % len(names)]:
                    fields, _, _ = run_job(cluster, job_command(name, accel, bench, python, steps, warmup))
                    times[label][name].append(float(fields[3]))
                print(f"{label}, round {r + 1}: " +
                      ", ".join(f"{n} {times[label][n][-1]:.1f}" for n in names), flush=True)
    return times


def report_bytes(rows):
    print("\nbytes per step crossing machine1's link (sent, received), 2 machines x 2 processes")
    print(f"{'job':>15} {'sent':>12} {'received':>12} {'formula':>12} {'sent/formula':>13} {'recv/formula':>13}")
    mismatches = []
    for name, (sent, received) in rows.items():
        if name in ACCEL:
            f_sent, f_received = link_formula(name)
            ratios = (sent / f_sent, received / f_received)
            within = all(1.0 <= r <= 1.0 + HEADERS for r in ratios)
            if not within:
                mismatches.append(name)
            print(f"{name:>15} {sent:>12.0f} {received:>12.0f} {f_sent:>12} {ratios[0]:>13.4f} {ratios[1]:>13.4f}"
                  f"{'' if within else '  MISMATCH'}")
        else:
            print(f"{name:>15} {sent:>12.0f} {received:>12.0f} {'-':>12}")
    return mismatches


def report_times(times):
    for label, jobs in times.items():
        print(f"\nms per step, links limited to {label} (median of {len(jobs['data_parallel'])} rounds)")
        print(f"{'job':>15} {'ms/step':>9} {'/pytorch_ddp':>13} {'/pytorch_fsdp2':>15}")
        for name, values in jobs.items():
            ratios = [statistics.median(a / b for a, b in zip(values, jobs[base])) for base in PYTORCH]
            print(f"{name:>15} {statistics.median(values):>9.1f} {ratios[0]:>13.3f} {ratios[1]:>15.3f}")


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--only")]
    only = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--only=")), None)
    if len(args) not in (3, 4):
        sys.exit(__doc__)
    accel, bench, python = (os.path.abspath(a) if os.sep in a else a for a in args[:3])
    rounds = int(args[3]) if len(args) > 3 else 3
    try:
        harness.check_host(rate=True)
    except harness.ClusterUnavailable as e:
        print(f"cluster_links.py: SKIPPED: {e}")
        sys.exit(harness.SKIP)
    print(f"2 machines x 2 processes, MLP width {WIDTH} ({sum(model_tensors()) // 4} float32 parameters), AdamW, "
          f"batch 32 per process, one thread per process, Gloo")
    mismatches = []
    if only in (None, "bytes"):
        mismatches = report_bytes(measure_bytes(accel, bench, python))
    if only in (None, "time"):
        report_times(measure_times(accel, bench, python, rounds))
    if mismatches:
        print(f"\naccel's bytes differ from the formula for: {', '.join(mismatches)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
