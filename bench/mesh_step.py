# The PyTorch side of the mesh benchmark: the job of bench/mesh_step.cpp (MLP, AdamW, batch 32 per process, one
# thread per process) on Gloo, started by `accel launch` with the mesh sizes in PARALLELISM_CONFIG_DP_REPLICATE_SIZE
# and PARALLELISM_CONFIG_DP_SHARD_SIZE (as Accelerate's ParallelismConfig reads them). Strategies:
#   pytorch_hsdp        FSDP2 on a 2-D mesh: fully_shard(mesh=init_device_mesh("cpu", (R, S))) on each Linear and
#                       on the root (HSDP: sharded over dp_shard, replicated over dp_replicate), AdamW
#   pytorch_hsdp_whole  the same on the root only, reshard_after_forward=False (the shard group's parameters gathered
#                       once per step, as accel's hybrid_sharded without units), AdamW
#   pytorch_tp          DTensor tensor parallelism: parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(),
#                       "2": RowwiseParallel(), "4": ColwiseParallel(), "6": RowwiseParallel()}) on PARALLELISM_CONFIG_
#                       TP_SIZE processes, and with more processes FSDP2 over "dp" (fully_shard(mesh=mesh["dp"]):
#                       PyTorch's 2-D recipe), AdamW
# Process 0 prints `strategy width ms_per_step optimizer_state_bytes_per_process first_bytes second_bytes` (mesh_step.cpp's
# fields: dp_shard and dp_replicate for HSDP, tp and dp for tensor parallelism; the bytes counted by wrapping the
# collectives FSDP2 and DTensor call, on one step after the timed ones), or `strategy width unsupported REASON`.
import os
import sys

import torch
import torch.distributed as dist

from ddp_step import make_mlp, ms_per_step, wide_batches
from sharded_step import adamw_step, leave_together, state_bytes, unsupported


class CollectiveCounter:
    """What one step hands to each group's collectives, with a ring's share of it sent by each process: (n-1)/n of
    what is all-gathered or reduce-scattered, 2 (n-1)/n of what is all-reduced. Wraps torch.distributed's functions,
    which FSDP2 calls through the module at each use."""

    def __init__(self, groups, functional=None):
        self.groups = groups  # name -> ProcessGroup
        self.functional = functional  # the dimension of DTensor's functional collectives (tensor parallelism's)
        self.sent = {name: 0.0 for name in groups}
        self.saved = []

    def _add(self, group, tensor, factor):
        for name, known in self.groups.items():
            if group is known:
                n = dist.get_world_size(group)
                self.sent[name] += tensor.numel() * tensor.element_size() * factor * (n - 1) / n
                return
        raise RuntimeError(f"a collective on a group outside the mesh: {group}")

    def _add_functional(self, tensor, factor, result_factor=1):
        n = dist.get_world_size(self.groups[self.functional])
        self.sent[self.functional] += tensor.numel() * tensor.element_size() * factor * result_factor * (n - 1) / n

    def __enter__(self):
        import torch.distributed._functional_collectives as funcol

        def wrap(module, name, counted):
            original = getattr(module, name)
            self.saved.append((module, name, original))

            def counting(*args, **kwargs):
                counted(*args, **kwargs)
                return original(*args, **kwargs)
            setattr(module, name, counting)

        wrap(dist, "all_gather_single", lambda output, input, group=None, **_: self._add(group, output, 1))
        wrap(dist, "reduce_scatter_single", lambda output, input, group=None, **_: self._add(group, input, 1))
        wrap(dist, "all_reduce", lambda tensor, group=None, **_: self._add(group, tensor, 2))
        if self.functional:
            n = dist.get_world_size(self.groups[self.functional])
            wrap(funcol, "all_reduce", lambda tensor, *_, **__: self._add_functional(tensor, 2))
            wrap(funcol, "reduce_scatter_tensor", lambda tensor, *_, **__: self._add_functional(tensor, 1))
            wrap(funcol, "all_gather_tensor", lambda tensor, *_, **__: self._add_functional(tensor, 1, n))
        return self

    def __exit__(self, *_):
        for module, name, original in reversed(self.saved):
            setattr(module, name, original)


def build_tp(width):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    tp = int(os.environ["PARALLELISM_CONFIG_TP_SIZE"])
    dp = dist.get_world_size() // tp
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    model = make_mlp(width)
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel(), "4": ColwiseParallel(),
                                           "6": RowwiseParallel()})
    if dp > 1:
        fully_shard(model, mesh=mesh["dp"])
    groups = {"tp": mesh["tp"].get_group(), "dp": mesh["dp"].get_group()}
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3), groups


def build(strategy, width):
    if strategy == "pytorch_tp":
        return build_tp(width)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    replicas = int(os.environ["PARALLELISM_CONFIG_DP_REPLICATE_SIZE"])
    shards = int(os.environ["PARALLELISM_CONFIG_DP_SHARD_SIZE"])
    mesh = init_device_mesh("cpu", (replicas, shards), mesh_dim_names=("dp_replicate", "dp_shard"))
    model = make_mlp(width)
    if strategy == "pytorch_hsdp_whole":
        fully_shard(model, mesh=mesh, reshard_after_forward=False)
    else:
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    groups = {"dp_shard": mesh["dp_shard"].get_group(), "dp_replicate": mesh["dp_replicate"].get_group()}
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3), groups


def main():
    strategy = sys.argv[1]
    width, steps, warmup = (int(a) for a in sys.argv[2:5])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    try:
        model, optimizer, groups = build(strategy, width)
    except Exception as error:  # noqa: BLE001 - reported, not hidden
        unsupported(strategy, width, error)
        leave_together()
    step = adamw_step(model, optimizer, wide_batches(width, dist.get_rank()))
    ms = ms_per_step(step, steps, warmup)
    first, second = list(groups)
    with CollectiveCounter(groups, functional="tp" if strategy == "pytorch_tp" else None) as counter:
        step(0)
    if dist.get_rank() == 0:
        print(f"{strategy} {width} {ms:.4f} {state_bytes(optimizer)} {counter.sent[first]:.0f} "
              f"{counter.sent[second]:.0f}", flush=True)
    leave_together()


if __name__ == "__main__":
    main()
