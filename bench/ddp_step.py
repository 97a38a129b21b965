# The PyTorch side of the DDP benchmark: the same job as bench/ddp_step.cpp (MLP, SGD, batch 32 per process, one
# thread per process) with torch.nn.parallel.DistributedDataParallel on Gloo. Started by `accel launch`, which sets
# the variables that init_process_group("gloo", init_method="env://") reads. Process 0 prints
# `pytorch_ddp WIDTH MS_PER_STEP`.
import sys
import time

import torch
import torch.distributed as dist


def make_mlp(width):
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))


def wide_batches(width, rank):
    """16 batches of (32 x width, 32 x 1), different on each process (bench/support.hpp's wide_batches)."""
    torch.manual_seed(1 + rank)
    return [(torch.randn(32, width), torch.randn(32, 1)) for _ in range(16)]


def ms_per_step(step, steps, warmup):
    """Milliseconds per call of step(i) over `steps` calls after `warmup` untimed ones, all processes together."""
    for i in range(warmup):
        step(i)
    dist.barrier()
    start = time.perf_counter()
    for i in range(steps):
        step(i)
    dist.barrier()
    return (time.perf_counter() - start) * 1000 / steps


def time_training(model, width, steps, warmup, label):
    """SGD steps of the DDP `model` on this process's wide batches, timed; process 0 prints `LABEL WIDTH MS_PER_STEP`.
    Ends the process group."""
    rank = dist.get_rank()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = wide_batches(width, rank)

    def step(i):
        x, y = data[i % len(data)]
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    ms = ms_per_step(step, steps, warmup)
    if rank == 0:
        print(f"{label} {width} {ms:.4f}", flush=True)
    # Both ranks tear Gloo down together: PyTorch 2.13 sometimes aborts a rank that destroys its group while the
    # other is still leaving ("terminate called without an active exception"), after the figure is printed.
    dist.barrier()
    dist.destroy_process_group()


def main():
    width, steps, warmup = (int(a) for a in sys.argv[1:4])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    time_training(torch.nn.parallel.DistributedDataParallel(make_mlp(width)), width, steps, warmup, "pytorch_ddp")


if __name__ == "__main__":
    main()
