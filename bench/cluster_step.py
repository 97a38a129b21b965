# The PyTorch side of the cluster benchmark (bench/cluster_links.py runs it under torchrun on 2 machines x 2
# processes of the namespace cluster): the job of bench/cluster_step.cpp (4 hidden Linear layers of WIDTH with ReLU,
# then 8 outputs; AdamW, batch 32 per process, one thread per process) on Gloo. Strategies:
#   pytorch_ddp    DistributedDataParallel
#   pytorch_fsdp2  fully_shard (FSDP2) on each Linear and on the root, its defaults (resharded after forward)
# Process 0 prints `strategy width steps ms_per_step`.
import os
import sys
import time

import torch
import torch.distributed as dist


def make_mlp(width):
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 8))


def build(strategy, width):
    model = make_mlp(width)
    if strategy == "pytorch_ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    if strategy != "pytorch_fsdp2":
        sys.exit(f"unknown strategy {strategy!r}: pytorch_ddp or pytorch_fsdp2")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def main():
    strategy = sys.argv[1]
    width, steps, warmup = (int(a) for a in sys.argv[2:5])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = build(strategy, width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(1 + rank)
    data = [(torch.randn(32, width), torch.randn(32, 8)) for _ in range(8)]

    def step(i):
        x, y = data[i % len(data)]
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for i in range(warmup):
        step(i)
    dist.barrier()
    start = time.perf_counter()
    for i in range(steps):
        step(i)
    dist.barrier()
    ms = (time.perf_counter() - start) * 1000 / steps
    if rank == 0:
        print(f"{strategy} {width} {steps} {ms:.4f}", flush=True)
    # PyTorch 2.13 sometimes aborts a rank while Gloo is torn down ("terminate called without an active exception"),
    # after the figure is printed: every rank leaves together without tearing down.
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
