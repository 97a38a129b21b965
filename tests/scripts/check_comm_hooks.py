"""accel's gradient communication hooks against PyTorch's DDP with the same hook, on 2 Gloo processes each:
   check_comm_hooks.py LAUNCHER PROGRAM WORK_DIR CASE [CASE ...]    (or `all`)
for each case, builds a small MLP (5 Linear layers, one bucket on both sides) and 8 steps of batches per process,
trains it with torch.nn.parallel.DistributedDataParallel and the hook registered by Accelerate's own
DistributedDataParallelKwargs.register_comm_hook (torch.multiprocessing), then with accel (PROGRAM,
tests/programs/comm_hook_training.cpp, under `accel launch`) with the matching options::comm_hook, and once more
with accel and no hook. Checks, for every step and parameter:
  - accel's gradients after the hook equal PyTorch's within Accelerate's tolerance (rtol = atol = 1e-2,
    test_ddp_comm_hook.py), and are the same on both processes;
  - the hook did its work, which that tolerance alone could not tell: fp16/bf16 gradients are exactly values of that
    type (the plain all-reduce's are not); PowerSGD's compressed matrices are of rank <= r from start_powerSGD_iter
    on (plain ones are not) and differ from the plain all-reduce's by more than the tolerance, and equal them
    before; batched PowerSGD's whole bucket, as its square matrix, is of rank <= r;
  - the bytes accel handed to collectives are what the hook sends (half of float32 for fp16/bf16; the uncompressed
    members, flags, Ps and Qs for PowerSGD).
The same low-rank and type checks run on PyTorch's gradients too, so that the reference is what it is said to be.
The cases share one pair of reference processes (each case a DDP model of its own on one process group) and one
plain accel run: importing torch three times a case cost more than the cases themselves."""
import math
import os
import re
import shutil
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

STEPS = 8
START = 2  # start_powerSGD_iter: plain all-reduce for steps 0 and 1
LAYERS = [(32, 64), (64, 64), (64, 32), (32, 64), (64, 4)]  # two 64 x 32 weights apart: PyTorch groups by shape
BATCH = 8
LEARNING_RATE = 1e-3
TOLERANCE = 1e-2


def power_sgd(rank, **extra):
    """accel's settings and Accelerate's comm_state_option for PowerSGD of `rank`, starting at START."""
    accel = [f"rank={rank}", f"start={START}"] + [f"{key}={int(value)}" for key, value in extra.items()]
    names = {"warm_start": "warm_start", "batch_same_shape": "batch_tensors_with_same_shape", "seed": "random_seed"}
    state = dict(matrix_approximation_rank=rank, start_powerSGD_iter=START)
    state.update({names[key]: value for key, value in extra.items()})
    return accel, state


def case_table():
    """name: (accel's settings, DistributedDataParallelKwargs' arguments or None for a hook registered directly,
    the type the gradients must be values of, the PowerSGD rank, whether PowerSGD is the batched one)."""
    cases = {
        "fp16": (["hook=fp16"], dict(comm_hook="fp16"), torch.float16, None, False),
        # PyTorch refuses bf16_compress_hook without NCCL (by its name); Gloo sums bfloat16 since 2.x, so accel
        # allows it, and the reference registers the same function under another name.
        "bf16": (["hook=bf16"], None, torch.bfloat16, None, False),
        # Accelerate ignores a wrapper alone; accel wraps the plain all-reduce, as PyTorch allows.
        "fp16_wrapper_alone": (["wrapper=fp16"], None, torch.float16, None, False),
    }
    for name, rank, extra, wrapper in [("power_sgd_rank1", 1, {}, None), ("power_sgd_rank2", 2, {}, None),
                                       ("power_sgd_rank1_fp16_wrapper", 1, {}, "fp16"),
                                       ("power_sgd_rank3_cold_batched_shapes", 3,
                                        dict(warm_start=False, batch_same_shape=True, seed=7), None)]:
        accel, state = power_sgd(rank, **extra)
        kwargs = dict(comm_hook="power_sgd", comm_state_option=state)
        if wrapper:
            kwargs["comm_wrapper"] = wrapper
            accel.append(f"wrapper={wrapper}")
        cases[name] = (["hook=power_sgd"] + accel, kwargs, torch.float16 if wrapper else None, rank, False)
    accel, state = power_sgd(1)
    cases["batched_power_sgd_rank1"] = (["hook=batched_power_sgd"] + accel,
                                        dict(comm_hook="batched_power_sgd", comm_state_option=state), None, 1, True)
    return cases


CASES = case_table()


def make_model():
    layers = []
    for i, (inputs, outputs) in enumerate(LAYERS):
        if i > 0:
            layers.append(torch.nn.ReLU())
        layers.append(torch.nn.Linear(inputs, outputs))
    return torch.nn.Sequential(*layers)


def write_inputs(work_dir):
    torch.manual_seed(0)
    save_file({k: v.contiguous() for k, v in make_model().state_dict().items()}, f"{work_dir}/initial.safetensors")
    for rank in range(2):
        torch.manual_seed(100 + rank)
        data = {}
        for step in range(STEPS):
            data[f"x{step}"] = torch.randn(BATCH, LAYERS[0][0])
            data[f"y{step}"] = 10 * torch.randn(BATCH, LAYERS[-1][1])
        save_file(data, f"{work_dir}/data_rank{rank}.safetensors")


def orthogonalize_matrices_too(original):
    """PyTorch 2.13's batched_powerSGD_hook passes 2-D Ps and Qs to _orthogonalize, which asserts 3-D ones: the
    reference treats them as a batch of one, as accel does."""
    def orthogonalize(matrices, epsilon=0):
        original(matrices.unsqueeze(0) if matrices.dim() == 2 else matrices, epsilon)
    return orthogonalize


def bf16_compress(state, bucket):
    return default_hooks.bf16_compress_hook(state, bucket)


# The hooks the reference registers itself, where Accelerate's DistributedDataParallelKwargs would not.
DIRECT_HOOKS = {"bf16": bf16_compress,
                "fp16_wrapper_alone": default_hooks.fp16_compress_wrapper(default_hooks.allreduce_hook)}


def train_reference(rank, work_dir, case):
    """PyTorch's DDP with the case's hook: the gradients of every step, in torch_CASE_rankR.safetensors."""
    model = make_model()
    model.load_state_dict(load_file(f"{work_dir}/initial.safetensors"))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1000)
    _, kwargs, _, _, batched = CASES[case]
    if kwargs is None:
        ddp.register_comm_hook(None, DIRECT_HOOKS[case])
    else:
        from accelerate.utils import DistributedDataParallelKwargs
        from accelerate.utils.dataclasses import DDPCommunicationHookType
        # As enum members: Accelerate's hook table ignores the same names given as strings.
        kwargs = {key: DDPCommunicationHookType(value) if key in ("comm_hook", "comm_wrapper") else value
                  for key, value in kwargs.items()}
        DistributedDataParallelKwargs(**kwargs).register_comm_hook(ddp)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LEARNING_RATE)
    data = load_file(f"{work_dir}/data_rank{rank}.safetensors")
    gradients = {}
    for step in range(STEPS):
        loss = torch.nn.functional.mse_loss(ddp(data[f"x{step}"]), data[f"y{step}"], reduction="sum")
        loss.backward()
        for name, parameter in model.named_parameters():
            gradients[f"step{step}.{name}"] = parameter.grad.clone()
        optimizer.step()
        optimizer.zero_grad()
    save_file(gradients, f"{work_dir}/torch_{case}_rank{rank}.safetensors")


def reference_worker(rank, work_dir, cases):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{work_dir}/store", rank=rank, world_size=2)
    plain_orthogonalize = powerSGD_hook._orthogonalize
    for case in cases:
        batched = CASES[case][4]
        powerSGD_hook._orthogonalize = (orthogonalize_matrices_too(plain_orthogonalize) if batched
                                        else plain_orthogonalize)
        train_reference(rank, work_dir, case)
        dist.barrier()
    dist.destroy_process_group()


def run_accel(launcher, program, work_dir, name, settings):
    out = subprocess.run([launcher, "launch", "--nproc_per_node", "2", "--master_port", "0", program, work_dir,
                          f"{work_dir}/{name}_rank{{rank}}.safetensors", *settings],
                         capture_output=True, text=True, timeout=240, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if out.returncode != 0:
        sys.exit(f"accel run {name} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    sent = re.search(r"communicated (\d+) bytes", out.stdout)
    if not sent:
        sys.exit(f"accel run {name} printed no byte count:\n{out.stdout}")
    return [load_file(f"{work_dir}/{name}_rank{r}.safetensors") for r in range(2)], int(sent.group(1))


def representable(tensor, dtype):
    return torch.equal(tensor.to(dtype).to(tensor.dtype), tensor)


def rank_ratio(matrix, rank):
    """The (rank + 1)-th singular value over the first: ~0 for a matrix of rank <= `rank`."""
    values = torch.linalg.svdvals(matrix.double())
    return (values[rank] / values[0]).item()


def weight_names(rank):
    """The weights PowerSGD compresses at this rank (PyTorch's own _should_compress decides)."""
    names = []
    for i, (inputs, outputs) in enumerate(LAYERS):
        if powerSGD_hook._should_compress(outputs, inputs, min(outputs, inputs, rank), 2)[0]:
            names.append(f"{2 * i}.weight")
    return names


def bucket_rows(gradients, step):
    """The full rows of the square matrix batched PowerSGD makes of the bucket's gradients (in bucket order: reverse
    registration), without the padding, which the approximation does not keep."""
    names = [name for i in reversed(range(len(LAYERS))) for name in (f"{2 * i}.bias", f"{2 * i}.weight")]
    flat = torch.cat([gradients[f"step{step}.{name}"].reshape(-1) for name in names])
    side = math.ceil(math.sqrt(flat.numel()))
    return flat[:flat.numel() // side * side].view(-1, side)


def check_hook_did_its_work(label, gradients, plain, case):
    """What distinguishes the hook's gradients from the plain all-reduce's, beyond the comparison's tolerance."""
    _, _, dtype, rank, batched = CASES[case]
    failures = []
    keys = sorted(gradients)
    if dtype is not None:
        failures += [f"{label} {k} is not made of {dtype} values" for k in keys if not representable(gradients[k], dtype)]
        if all(representable(plain[k], dtype) for k in keys):
            failures.append(f"the plain all-reduce's gradients are all {dtype} values: the check proves nothing")
    if rank is None:
        return failures
    low_rank_bound = 1e-2 if dtype is not None else 1e-4  # P Q^T computed in float16 rounds to 1e-3
    for step in range(STEPS):
        if step < START:
            if dtype is None:
                failures += [f"{label} step {step} {k}: differs from the plain all-reduce before start_powerSGD_iter"
                             for k in keys if k.startswith(f"step{step}.") and not torch.equal(gradients[k], plain[k])]
            continue
        if batched:
            ratio = rank_ratio(bucket_rows(gradients, step), rank)
            if ratio > low_rank_bound:
                failures.append(f"{label} step {step}: the bucket's square matrix is not of rank {rank} ({ratio:.2e})")
            if rank_ratio(bucket_rows(plain, step), rank) < 1e-2:
                failures.append(f"step {step}: the plain bucket is of rank {rank} already: the check proves nothing")
            continue
        for name in weight_names(rank):
            key = f"step{step}.{name}"
            ratio = rank_ratio(gradients[key], rank)
            if ratio > low_rank_bound:
                failures.append(f"{label} {key} is not of rank {rank} (singular values {ratio:.2e})")
            if rank_ratio(plain[key], rank) < 1e-2:
                failures.append(f"plain {key} is of rank {rank} already: the check proves nothing")
    if not batched:
        far = [k for k in keys if int(k[4:k.index(".")]) >= START and not torch.allclose(
            gradients[k], plain[k], rtol=TOLERANCE, atol=TOLERANCE)]
        if not far:
            failures.append(f"{label}: PowerSGD's gradients are within the tolerance of the plain all-reduce's")
    return failures


def expected_bytes(case):
    """What the hook hands to collectives over the run, on each process."""
    settings, _, dtype, rank, batched = CASES[case]
    parameters = sum(outputs * inputs + outputs for inputs, outputs in LAYERS)
    flags = 2 * len(LAYERS)
    size = 2 if dtype is not None else 4
    if rank is None:
        return STEPS * (parameters + flags) * size
    plain = START * (parameters + flags) * size
    if batched:
        side = math.ceil(math.sqrt(parameters))
        return plain + (STEPS - START) * (flags + 2 * side * rank) * size
    compressed = weight_names(rank)
    low_rank = sum((outputs + inputs) * rank for i, (inputs, outputs) in enumerate(LAYERS)
                   if f"{2 * i}.weight" in compressed)
    whole = parameters - sum(outputs * inputs for i, (inputs, outputs) in enumerate(LAYERS)
                             if f"{2 * i}.weight" in compressed)
    return plain + (STEPS - START) * (whole + flags + low_rank) * size


def check_case(launcher, program, work_dir, case, plain):
    """The case's failures, after accel's run with its hook; prints what was measured."""
    reference = [load_file(f"{work_dir}/torch_{case}_rank{r}.safetensors") for r in range(2)]
    accel, sent = run_accel(launcher, program, work_dir, case, CASES[case][0])
    failures = []
    worst = 0.0
    for key in sorted(accel[0]):
        if not torch.equal(accel[0][key], accel[1][key]):
            failures.append(f"accel's {key} differs between the processes")
        for r in range(2):
            a, t = accel[r][key], reference[r][key]
            worst = max(worst, (a - t).abs().max().item())
            if not torch.allclose(a, t, rtol=TOLERANCE, atol=TOLERANCE):
                failures.append(f"process {r} {key}: accel and PyTorch differ by {(a - t).abs().max().item():.3e}")
    failures += check_hook_did_its_work("accel", accel[0], plain[0], case)
    failures += check_hook_did_its_work("PyTorch", reference[0], plain[0], case)
    if sent != expected_bytes(case):
        failures.append(f"accel handed {sent} bytes to collectives; the hook sends {expected_bytes(case)}")
    print(f"{case}: {STEPS} steps, largest |accel - PyTorch| {worst:.3e}; bytes sent {sent}"
          f"{'' if failures else ': ok'}", flush=True)
    return [f"{case}: {failure}" for failure in failures]


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    launcher, program, work_dir = sys.argv[1:4]
    cases = list(CASES) if sys.argv[4:] == ["all"] else sys.argv[4:]
    unknown = [case for case in cases if case not in CASES]
    if unknown:
        sys.exit(f"unknown case {', '.join(unknown)}; cases: {', '.join(CASES)}")
    shutil.rmtree(work_dir, ignore_errors=True)
    os.makedirs(work_dir)
    write_inputs(work_dir)
    # The reference trains on the CPU: PyTorch's PowerSGD hook synchronises CUDA whenever CUDA is available, which
    # fails for CPU gradients ("Expected a cuda device, but got: cpu") on a machine with a GPU, so hide it.
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        mp.spawn(reference_worker, args=(work_dir, cases), nprocs=2)
    finally:
        if hidden is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = hidden
    plain, plain_sent = run_accel(launcher, program, work_dir, "plain", [])
    print(f"plain all-reduce: bytes sent {plain_sent}", flush=True)
    failures = []
    if plain_sent != expected_bytes("fp16") * 2:
        failures.append(f"accel's plain all-reduce handed {plain_sent} bytes; expected {expected_bytes('fp16') * 2}")
    for case in cases:
        failures += check_case(launcher, program, work_dir, case, plain)
    if failures:
        sys.exit("\n".join(failures))
    print(f"ok: {len(cases)} cases")


if __name__ == "__main__":
    main()
