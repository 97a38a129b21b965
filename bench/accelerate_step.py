"""The Hugging Face Accelerate side of bench/accelerate_compare.py: bench/tiny_step.cpp's job (64 -> 64 -> 64 -> 1 MLP,
AdamW, batch 64 per process, one thread per process) written as an Accelerate user writes it. Run alone it is one
process; under `accel launch` (which sets torchrun's variables) Accelerate sets up its own Gloo process group and
wraps the model in DistributedDataParallel. With `raw`, the same loop in plain PyTorch, without Accelerate.
Process 0 prints one line: `accelerate PROCESSES US_PER_STEP` (or `pytorch ...`).

Usage: accelerate_step.py accelerate|raw STEPS WARMUP
"""
import sys
import time

import torch


def tiny_mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 1))


def main():
    mode, steps, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    model = tiny_mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if mode == "accelerate":
        from accelerate import Accelerator
        accelerator = Accelerator(cpu=True)
        model, optimizer = accelerator.prepare(model, optimizer)
        backward, rank, processes, barrier = (accelerator.backward, accelerator.process_index,
                                              accelerator.num_processes, accelerator.wait_for_everyone)
    else:
        backward, rank, processes, barrier = (lambda loss: loss.backward()), 0, 1, (lambda: None)
    torch.manual_seed(1 + rank)
    data = [(torch.randn(64, 64), torch.randn(64, 1)) for _ in range(16)]

    def step(i):
        x, y = data[i % len(data)]
        backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()

    for i in range(warmup):
        step(i)
    barrier()
    start = time.perf_counter()
    for i in range(steps):
        step(i)
    barrier()
    us = (time.perf_counter() - start) * 1e6 / steps
    if rank == 0:
        print(f"{'accelerate' if mode == 'accelerate' else 'pytorch'} {processes} {us:.3f}", flush=True)


if __name__ == "__main__":
    main()
