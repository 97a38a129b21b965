# The PyTorch side of the checkpoint-load benchmark: the job of bench/checkpoint_load.cpp (LAYERS Linear(WIDTH,
# WIDTH), float32, SGD) under FSDP2 (fully_shard on each Linear and on the root) on 4 Gloo processes, saved with
# torch.distributed.checkpoint (DCP) to DIR (untimed), then loaded back into the same model (timed:
# get_model_state_dict, dcp.load, set_model_state_dict). Process 0 prints checkpoint_load.cpp's fields:
#   `job load_seconds peak_bytes resident_before_bytes checkpoint_bytes`
import gc
import os
import sys
import time

import torch
import torch.distributed as dist


def status_bytes(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return -1


def slowest(value):
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def main():
    job, directory = sys.argv[1], sys.argv[2]
    count, width = int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(count)])
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    dcp.save(get_model_state_dict(model), checkpoint_id=directory)
    dist.barrier()
    gc.collect()
    before = slowest(status_bytes("VmRSS"))
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    start = time.perf_counter()
    state = get_model_state_dict(model)
    dcp.load(state, checkpoint_id=directory)
    set_model_state_dict(model, state)
    seconds = slowest(time.perf_counter() - start)
    peak = slowest(status_bytes("VmHWM"))
    size = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory))
    if dist.get_rank() == 0:
        print(f"{job} {seconds:.4f} {peak:.0f} {before:.0f} {size}", flush=True)
    # As sharded_step.py: leave together without tearing Gloo down (PyTorch 2.13 may abort a rank there).
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
