"""The Python side of the interop.checkpoint.* tests (docs/python.md), run with .venv's torch 2.13 and Accelerate 1.15.
The run is tests/programs/accelerate_interop.cpp's: Sequential(Linear(4, 16), Tanh, Linear(16, 2)), AdamW with
weight decay, StepLR(3, 0.5), batch s of data.safetensors plus noise from the CPU generator, a mean squared error.
   data DIR N M               writes the N + M batches both languages train on
   python-first DIR N M       trains N steps with Accelerate, save_state(DIR/python_checkpoint) (and with
                              safe_serialization=False, DIR/python_checkpoint_bin), trains M more:
                              DIR/python_after.safetensors (what accel, continuing from the checkpoint, must match)
   python-continue DIR N M CHECKPOINT  checks DIR/CHECKPOINT's random_states_0.pkl with random.setstate and
                              np.random.set_state, load_state, trains batches N.. for M steps:
                              DIR/python_continued_CHECKPOINT.safetensors
   compare DIR A B            DIR/A.safetensors and DIR/B.safetensors: parameters within 1e-6 relative; learning
                              rate and step counts exactly equal
   merged DIR                 load_checkpoint_in_model of DIR/merged (accel merge-weights of a sharded checkpoint)
                              into the Python model: its outputs for batch 0 equal accel's (DIR/accel_outputs)"""
import os
import random
import sys

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import load_checkpoint_in_model
from accelerate.utils.other import load
from safetensors.torch import load_file, save_file


def model():
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def data(directory, n, m):
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(n + m, 8, 4, generator=generator)
    y = torch.randn(n + m, 8, 2, generator=generator)
    save_file({"x": x, "y": y}, os.path.join(directory, "data.safetensors"))


class Run:
    def __init__(self, directory):
        torch.manual_seed(3)
        self.accelerator = Accelerator(cpu=True)
        self.net = model()
        optimizer = torch.optim.AdamW(self.net.parameters(), lr=0.01, weight_decay=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
        self.model, self.optimizer, self.scheduler = self.accelerator.prepare(self.net, optimizer, scheduler)
        self.data = load_file(os.path.join(directory, "data.safetensors"))

    def train(self, first, steps):
        for s in range(first, first + steps):
            noise = torch.randn(8, 4) * 0.01
            loss = torch.nn.functional.mse_loss(self.model(self.data["x"][s] + noise), self.data["y"][s])
            self.accelerator.backward(loss)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad()

    def write(self, path):
        out = {name: p.detach().clone() for name, p in self.net.named_parameters()}
        out["lr"] = torch.tensor([self.optimizer.param_groups[0]["lr"]], dtype=torch.float64)
        step = self.optimizer.state[next(iter(self.net.parameters()))]["step"]
        out["optimizer_step"] = torch.tensor([int(step)], dtype=torch.int64)
        out["scheduler_step_count"] = torch.tensor([self.scheduler.scheduler._step_count], dtype=torch.int64)
        save_file(out, path)


def python_first(directory, n, m):
    run = Run(directory)
    run.train(0, n)
    run.accelerator.save_state(os.path.join(directory, "python_checkpoint"))
    run.accelerator.save_state(os.path.join(directory, "python_checkpoint_bin"), safe_serialization=False)
    run.train(n, m)
    run.write(os.path.join(directory, "python_after.safetensors"))


def check_random_states(checkpoint):
    """What Accelerate's load_state does with random_states_0.pkl, without its catch-all (which only logs)."""
    states = load(os.path.join(checkpoint, "random_states_0.pkl"))
    random.setstate(states["random_state"])
    np.random.set_state(states["numpy_random_seed"])
    torch.set_rng_state(states["torch_manual_seed"])
    random.random(), np.random.rand()  # the states set are usable
    print(f"random_states_0.pkl: random.setstate, np.random.set_state and torch.set_rng_state accept it")


def python_continue(directory, n, m, name):
    checkpoint = os.path.join(directory, name)
    check_random_states(checkpoint)
    run = Run(directory)
    before = {name: p.detach().clone() for name, p in run.net.named_parameters()}
    run.accelerator.load_state(checkpoint)
    assert any(not torch.equal(before[name], p) for name, p in run.net.named_parameters()), "nothing was loaded"
    assert run.optimizer.param_groups[0]["decoupled_weight_decay"], "AdamW loaded as Adam"
    run.train(n, m)
    run.write(os.path.join(directory, f"python_continued_{name}.safetensors"))


def compare(directory, a_name, b_name):
    a_path, b_path = (os.path.join(directory, name + ".safetensors") for name in (a_name, b_name))
    a, b = load_file(a_path), load_file(b_path)
    assert sorted(a) == sorted(b), f"names {sorted(a)} and {sorted(b)}"
    for name in ("lr", "optimizer_step", "scheduler_step_count"):
        assert torch.equal(a[name], b[name]), f"{name}: {a[name].tolist()} and {b[name].tolist()}"
    worst = 0.0
    for name in a:
        if name in ("lr", "optimizer_step", "scheduler_step_count"):
            continue
        difference = ((a[name] - b[name]).abs().max() / b[name].abs().max()).item()
        assert difference <= 1e-6, f"{name}: relative difference {difference}"
        worst = max(worst, difference)
    print(f"{os.path.basename(a_path)} and {os.path.basename(b_path)}: lr {a['lr'].item()}, optimizer step "
          f"{a['optimizer_step'].item()}, scheduler step count {a['scheduler_step_count'].item()} equal; parameters "
          f"within {worst:.2e} relative")


def merged(directory, name="merged"):
    """Loads what `accel merge-weights` wrote in DIRECTORY/NAME: model.safetensors, or with `--unsafe_serialization`
    (NAME merged_bin, also with `--remove_checkpoint_dir`) pytorch_model.bin alone, the checkpoint removed."""
    if name == "merged_bin":
        files = sorted(os.listdir(os.path.join(directory, name)))
        assert files == ["pytorch_model.bin"], f"--unsafe_serialization wrote {files}, not pytorch_model.bin alone"
        assert not os.path.exists(os.path.join(directory, "sharded")), "--remove_checkpoint_dir left the checkpoint"
    net = model()
    before = [p.detach().clone() for p in net.parameters()]
    load_checkpoint_in_model(net, os.path.join(directory, name))
    assert all(not torch.equal(b, p) for b, p in zip(before, net.parameters())), "nothing was loaded"
    with torch.no_grad():
        y = net(load_file(os.path.join(directory, "data.safetensors"))["x"][0])
    expected = load_file(os.path.join(directory, "accel_outputs.safetensors"))["y"]
    difference = ((y - expected).abs().max() / expected.abs().max()).item()
    assert difference <= 1e-6, f"outputs differ by {difference} relative: {y} and {expected}"
    print(f"accel merge-weights' {name} loaded by load_checkpoint_in_model: outputs within {difference:.1e}")


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "data":
        data(args[0], int(args[1]), int(args[2]))
    elif command == "python-first":
        python_first(args[0], int(args[1]), int(args[2]))
    elif command == "python-continue":
        python_continue(args[0], int(args[1]), int(args[2]), args[3])
    elif command == "compare":
        compare(args[0], args[1], args[2])
    elif command == "merged":
        merged(*args)
    else:
        sys.exit(f"unknown command {command}")
