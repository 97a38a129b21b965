"""The Python side of bench/gpu_compare.py: bench/gpu_step.cpp's job (the tiny MLP or the character transformer of
examples/char_transformer.py, AdamW, fp32 or bf16, batches made once on the device and cycled) written as a Hugging
Face Accelerate user writes it (`accelerate`), or as the plain PyTorch loop (`raw`: torch.autocast around the forward
for bf16). Optimizers with PyTorch's defaults (foreach on CUDA), as users get them.

Usage: gpu_step.py mlp|transformer accelerate|raw cpu|cuda fp32|bf16 BATCH STEPS WARMUP ROUNDS
Prints one line: `LOOP MODEL DEVICE PRECISION BATCH MS_PER_STEP TOKENS_PER_SECOND` (medians over the rounds).
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from char_transformer import CharTransformer  # noqa: E402

VOCABULARY, CONTEXT, WIDTH = 96, 128, 64


def make_model(name):
    torch.manual_seed(0)
    if name == "mlp":
        return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH),
                                   torch.nn.ReLU(), torch.nn.Linear(WIDTH, 1))
    return CharTransformer(VOCABULARY, CONTEXT, 256, 4, 4, dropout=0.0)


def make_batches(name, batch, device):
    torch.manual_seed(1)
    data = []
    for _ in range(8):
        if name == "mlp":
            x, y = torch.randn(batch, WIDTH), torch.randn(batch, 1)
        else:
            tokens = torch.randint(VOCABULARY, (batch, CONTEXT + 1))
            x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        data.append((x.to(device), y.to(device)))
    return data


def loss_of(name, output, target):
    if name == "mlp":
        return torch.nn.functional.mse_loss(output, target)
    return torch.nn.functional.cross_entropy(output.flatten(0, 1), target.flatten())


def step_function(name, loop, device, precision, model, optimizer):
    if loop == "accelerate":
        from accelerate import Accelerator
        accelerator = Accelerator(cpu=device == "cpu", mixed_precision="bf16" if precision == "bf16" else "no")
        model, optimizer = accelerator.prepare(model, optimizer)

        def step(x, y):
            accelerator.backward(loss_of(name, model(x), y))
            optimizer.step()
            optimizer.zero_grad()
        return step, accelerator.device
    model.to(device)

    def raw_step(x, y):
        with torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16"):
            output = model(x)
        loss_of(name, output.float(), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return raw_step, torch.device(device)


def main():
    name, loop, device, precision = sys.argv[1:5]
    batch, steps, warmup, rounds = map(int, sys.argv[5:9])
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device")
        sys.exit(77)
    torch.set_num_threads(1)
    model = make_model(name)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step, placed = step_function(name, loop, device, precision, model, optimizer)
    data = make_batches(name, batch, placed)
    synchronise = torch.cuda.synchronize if placed.type == "cuda" else (lambda: None)
    for i in range(warmup):
        step(*data[i % len(data)])
    seconds = []
    for _ in range(rounds):
        synchronise()
        start = time.perf_counter()
        for i in range(steps):
            step(*data[i % len(data)])
        synchronise()
        seconds.append((time.perf_counter() - start) / steps)
    ms = statistics.median(seconds) * 1e3
    tokens = batch if name == "mlp" else batch * CONTEXT
    print(f"{loop} {name} {device} {precision} {batch} {ms:.4f} {tokens / (ms / 1e3):.1f}", flush=True)


if __name__ == "__main__":
    main()
