# The PyTorch side of the communication hook benchmark: the job of bench/comm_hook_step.cpp (MLP, SGD, batch 32 per
# process, one thread per process) with torch.nn.parallel.DistributedDataParallel on Gloo and the same hook,
# registered by Accelerate's DistributedDataParallelKwargs (PowerSGD from the second step). PyTorch refuses
# bf16_compress_hook without NCCL by its name, although Gloo sums bfloat16: the same function is registered under
# another name. HOOK_one_bucket puts the whole model in one bucket (bucket_cap_mb=1000, which also caps the first
# bucket): PyTorch's PowerSGD hook chains its collectives in future callbacks, which Gloo runs in a different order on
# each process once there are several buckets (its jobs abort with a collective mismatch). Started by `accel launch`;
# process 0 prints `pytorch_HOOK WIDTH MS_PER_STEP`.
import sys

import torch
import torch.distributed as dist
from accelerate.utils import DistributedDataParallelKwargs
from accelerate.utils.dataclasses import DDPCommunicationHookType
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ddp_step import make_mlp, time_training


def bf16_compress(state, bucket):
    return default_hooks.bf16_compress_hook(state, bucket)


def register(model, hook):
    if hook == "bf16":
        model.register_comm_hook(None, bf16_compress)
    elif hook.startswith("power_sgd_rank"):
        state = dict(matrix_approximation_rank=int(hook[len("power_sgd_rank"):]), start_powerSGD_iter=2)
        DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.POWER_SGD,
                                      comm_state_option=state).register_comm_hook(model)
    elif hook != "none":
        DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType(hook)).register_comm_hook(model)


def main():
    hook = sys.argv[1]
    width, steps, warmup = (int(a) for a in sys.argv[2:5])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    one_bucket = hook.endswith("_one_bucket")
    model = torch.nn.parallel.DistributedDataParallel(make_mlp(width), bucket_cap_mb=1000 if one_bucket else 25)
    register(model, hook.removesuffix("_one_bucket"))
    time_training(model, width, steps, warmup, f"pytorch_{hook}")


if __name__ == "__main__":
    main()
