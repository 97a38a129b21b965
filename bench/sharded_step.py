# The PyTorch side of the sharded benchmark: the job of bench/sharded_step.cpp (MLP, AdamW, batch 32 per process,
# one thread per process) on Gloo, started by `accel launch`. Strategies:
#   pytorch_ddp    DistributedDataParallel + AdamW
#   pytorch_zero   DistributedDataParallel + ZeroRedundancyOptimizer(AdamW)
#   pytorch_fsdp2  fully_shard (FSDP2) on each Linear and on the root, AdamW
#   pytorch_fsdp2_whole  fully_shard on the root only, reshard_after_forward=False (the whole model gathered once
#                  per step, as accel's fully_sharded does), AdamW
# Process 0 prints `strategy width ms_per_step optimizer_state_bytes_per_process`, or `strategy width unsupported
# REASON` when this PyTorch cannot run the strategy on the CPU.
import os
import sys

import torch
import torch.distributed as dist

from ddp_step import make_mlp, ms_per_step, wide_batches


def local_bytes(tensor):
    tensor = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return tensor.numel() * tensor.element_size()


def state_bytes(optimizer):
    return sum(local_bytes(v) for state in optimizer.state.values() for k, v in state.items()
               if torch.is_tensor(v) and k != "step")


def build(strategy, width):
    model = make_mlp(width)
    if strategy == "pytorch_ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3), None
    if strategy == "pytorch_zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        model = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3)
        return model, optimizer, optimizer.optim
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    if strategy == "pytorch_fsdp2_whole":
        fully_shard(model, mesh=mesh, reshard_after_forward=False)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3), None
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3), None


def unsupported(strategy, width, error):
    """The line process 0 prints for a strategy this PyTorch cannot run on the CPU."""
    if dist.get_rank() == 0:
        print(f"{strategy} {width} unsupported {type(error).__name__}: {str(error).splitlines()[0][:120]}",
              flush=True)


def adamw_step(model, optimizer, data):
    """One step of the MLP on batch i % len(data)."""
    def step(i):
        x, y = data[i % len(data)]
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def leave_together():
    """PyTorch 2.13 sometimes aborts a rank while Gloo is torn down ("terminate called without an active exception"),
    after the figure is printed: every rank leaves together without tearing down."""
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def main():
    strategy = sys.argv[1]
    width, steps, warmup = (int(a) for a in sys.argv[2:5])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    try:
        model, optimizer, inner = build(strategy, width)
    except Exception as error:  # noqa: BLE001 - reported, not hidden
        unsupported(strategy, width, error)
        leave_together()
    step = adamw_step(model, optimizer, wide_batches(width, rank))
    try:
        step(0)
    except Exception as error:  # noqa: BLE001 - reported, not hidden
        unsupported(strategy, width, error)
        dist.destroy_process_group()
        return
    ms = ms_per_step(step, steps, warmup)
    if rank == 0:
        print(f"{strategy} {width} {ms:.4f} {state_bytes(inner or optimizer)}", flush=True)
    leave_together()


if __name__ == "__main__":
    main()
