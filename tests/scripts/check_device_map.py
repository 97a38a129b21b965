"""bigmodel.device_map.accelerate: accel::infer_auto_device_map against Accelerate's infer_auto_device_map.

For several torch.nn models (tied weights, buffers, integer buffers, parameters on the root, no-split blocks, a
buffer registered in every block, one layer registered under several names) and many max_memory settings (1 to 3
GPUs, with and without a CPU limit, from a tenth of the model to more than all of it, GPU 0 given nothing), each
strategy as Accelerate's load_checkpoint_and_dispatch applies it ("sequential": infer_auto_device_map alone;
"balanced", "balanced_low_0" and "auto": get_balanced_memory first), with and without a float16 dtype, this script
describes the model to the C++ program (names, class names, sizes, ties, shared modules) and compares the maps it
prints with Accelerate's; and for each model and dtype, accel::compute_module_sizes (names, bytes and order) and
accel::get_max_layer_size with Accelerate's. Where Accelerate itself fails (its infer_auto_device_map raises
IndexError when it must split a module list that repeats one layer), the case is counted and not compared.
Usage: check_device_map.py DEVICE_MAP_CASES_PROGRAM
"""

import collections
import itertools
import logging
import subprocess
import sys
import warnings

import torch
import torch.nn as nn
from accelerate.utils import compute_module_sizes, get_balanced_memory, get_max_layer_size, infer_auto_device_map


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.attn = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
        self.norm = nn.LayerNorm(width)


class TinyLM(nn.Module):
    """Embedding, blocks, a final norm and a head tied to the embedding."""

    def __init__(self, vocab=50, width=16, layers=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight


class Untied(TinyLM):
    def __init__(self):
        super().__init__(vocab=30, width=12, layers=3)
        self.head = nn.Linear(12, 30)


class WithBuffers(nn.Module):
    """A parameter and a buffer on the root, batch norms (an int64 buffer each) and a nested Sequential."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(40))
        self.stem = nn.Sequential(nn.Linear(40, 64), nn.BatchNorm1d(64))
        self.body = nn.Sequential(nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64)), nn.Linear(64, 32))
        self.out = nn.Linear(32, 10)
        self.register_buffer("steps", torch.zeros(8, dtype=torch.int64))


def uneven_mlp():
    return nn.Sequential(nn.Linear(10, 300), nn.ReLU(), nn.Linear(300, 20), nn.Linear(20, 200), nn.Linear(200, 5))


class RotaryBlock(Block):
    def __init__(self, width, inv_freq):
        super().__init__(width)
        self.register_buffer("inv_freq", inv_freq)


class Rotary(nn.Module):
    """One rotary table registered as a buffer of every block (as Llama's models share inv_freq)."""

    def __init__(self, width=12, layers=4):
        super().__init__()
        inv_freq = torch.ones(96)
        self.embed = nn.Embedding(30, width)
        self.blocks = nn.ModuleList(RotaryBlock(width, inv_freq) for _ in range(layers))
        self.head = nn.Linear(width, 30)


class Shared(nn.Module):
    """ALBERT-style: one layer (with a buffer) registered four times in a list, and in two encoders beside their own."""

    def __init__(self, width=12):
        super().__init__()
        layer = nn.Sequential(nn.Linear(width, width), nn.BatchNorm1d(width))
        self.embed = nn.Embedding(30, width)
        self.layers = nn.ModuleList([layer] * 4)
        self.encoders = nn.ModuleList(nn.ModuleDict({"shared": layer, "own": nn.Linear(width, width)})
                                      for _ in range(2))
        self.head = nn.Linear(width, 30)


MODELS = {
    "tiny_lm": (lambda: TinyLM(), [[], ["Block"]]),
    "tiny_lm_bf16": (lambda: TinyLM(vocab=40, width=8, layers=6).to(torch.bfloat16), [[], ["Block"]]),
    "untied": (lambda: Untied(), [[], ["Block", "LayerNorm"]]),
    "buffers": (lambda: WithBuffers(), [[], ["Sequential"]]),
    "mlp": (uneven_mlp, [[]]),
    "rotary": (lambda: Rotary(), [[], ["RotaryBlock"]]),
    "shared": (lambda: Shared(), [[], ["Sequential"]]),
}
FRACTIONS = [0.0, 0.1, 0.25, 0.4, 0.55, 0.8, 1.2]
STRATEGIES = ["sequential", "balanced", "balanced_low_0", "auto"]


def describe(model):
    """The model in the C++ program's format: modules in pre-order with their own parameters and buffers."""
    lines, first_name, first_module = [], {}, {}

    def visit(module, name, depth):
        shared = first_module.setdefault(id(module), name)
        lines.append(f"module {depth} {name.rsplit('.', 1)[-1] if name else '-'} {type(module).__name__} "
                     f"{shared if shared != name else '-'}")
        for pname, p in module._parameters.items():
            if p is None:
                continue
            full = f"{name}.{pname}" if name else pname
            tied = first_name.setdefault(id(p), full)
            floating = int(p.is_floating_point())
            lines.append(f"param {pname} {p.numel()} {p.element_size()} {floating} {tied if tied != full else '-'}")
        for bname, b in module._buffers.items():
            if b is None:
                continue
            full = f"{name}.{bname}" if name else bname
            shared = first_name.setdefault(id(b), full)
            floating = int(b.is_floating_point() or b.is_complex())
            lines.append(f"buffer {bname} {b.numel()} {b.element_size()} {floating} {shared if shared != full else '-'}")
        for cname, child in module._modules.items():
            visit(child, f"{name}.{cname}" if name else cname, depth + 1)

    visit(model, "", 0)
    return lines


def total_bytes(model):
    return sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))


def memory_settings(total):
    """max_memory dictionaries: 1 to 3 GPUs of a fraction of the model each, with or without a CPU limit."""
    settings = []
    for gpus in (1, 2, 3):
        for fraction, cpu in itertools.product(FRACTIONS, (None, 0.3, 2.0)):
            memory = {i: int(total * fraction * (1 + 0.15 * i)) for i in range(gpus)}
            if cpu is not None:
                memory["cpu"] = int(total * cpu)
            settings.append(memory)
    for fraction, cpu in itertools.product(FRACTIONS[1:], (None, 0.3)):  # GPU 0 given nothing, 2 and 3 others
        for gpus in (2, 3):
            memory = {0: 0, **{i: int(total * fraction * (1 + 0.15 * i)) for i in range(1, gpus + 1)}}
            if cpu is not None:
                memory["cpu"] = int(total * cpu)
            settings.append(memory)
    settings.append({"cpu": total // 2})
    settings.append({"cpu": total * 2})
    return settings


def accelerate_map(model, memory, strategy, no_split, dtype):
    """Accelerate's map, or None where Accelerate itself fails."""
    memory = dict(memory)
    try:
        if strategy != "sequential":
            memory = get_balanced_memory(model, memory, no_split, dtype=dtype, low_zero=strategy == "balanced_low_0")
        result = infer_auto_device_map(model, memory, no_split, dtype=dtype)
    except IndexError:  # its tie lookup, for a repeated layer it never lists (get_module_size_with_ties)
        return None
    return {name: str(device) for name, device in result.items()}


def accelerate_sizes(model, no_split, dtype):
    """compute_module_sizes in its order, and get_max_layer_size over the entries infer_auto_device_map starts from."""
    sizes = compute_module_sizes(model, dtype=dtype)
    top = (list(model.named_parameters(recurse=False)) + list(model.named_children())
           + list(model.named_buffers(recurse=False)))
    largest, names = get_max_layer_size(top, collections.defaultdict(int, sizes), no_split)
    return [f"{n if n else '-'} {v}" for n, v in sizes.items()] + [" ".join(["@largest", str(largest), *names])]


def cases():
    for (model_name, (build, no_splits)), dtype in itertools.product(MODELS.items(), (None, torch.float16)):
        model = build()
        for no_split, memory, strategy in itertools.product(
            no_splits, memory_settings(total_bytes(model)), STRATEGIES
        ):
            yield f"{model_name}/{dtype}/{no_split}/{memory}/{strategy}", model, memory, strategy, no_split, dtype


def size_cases():
    for (model_name, (build, no_splits)), dtype in itertools.product(MODELS.items(), (None, torch.float16)):
        for no_split in no_splits:
            yield f"{model_name}/{dtype}/{no_split}/sizes", build(), no_split, dtype


def run_program(blocks):
    output = subprocess.run([sys.argv[1]], input="\n".join(blocks) + "\n", capture_output=True, text=True, check=True)
    got, current = [], None
    for line in output.stdout.splitlines():
        key, value = line.split(" ", 1)
        if key == "case":
            current = {}
            got.append(current)
        else:
            current["" if key == "-" else key] = value
    return got


def case_header(index, no_split, dtype):
    return [f"case {index}", "nosplit " + " ".join(no_split), f"dtype {2 if dtype is not None else '-'}"]


def compare_maps():
    blocks, expected, ids = [], [], []
    for case_id, model, memory, strategy, no_split, dtype in cases():
        ids.append(case_id)
        expected.append(accelerate_map(model, memory, strategy, no_split, dtype))
        blocks += case_header(len(ids) - 1, no_split, dtype) + [
            f"strategy {strategy}", "memory " + " ".join(f"{k}:{v}" for k, v in memory.items())]
        blocks += describe(model) + ["end"]
    got = run_program(blocks)
    assert len(got) == len(expected), f"{len(got)} maps for {len(expected)} cases"
    compared = [(i, e, g) for i, (e, g) in enumerate(zip(expected, got)) if e is not None]
    wrong = [(i, e, g) for i, e, g in compared if e != g]
    for i, e, g in wrong[:5]:
        print(f"{ids[i]}:\n  Accelerate {e}\n  accel      {g}")
    distinct = len({tuple(sorted(e.items())) for _, e, _ in compared})
    print(f"{len(compared) - len(wrong)} of {len(compared)} maps equal Accelerate's ({distinct} distinct maps); "
          f"{len(expected) - len(compared)} cases where Accelerate raises IndexError, not compared")
    return len(wrong)


def compare_sizes():
    blocks, expected, ids = [], [], []
    for case_id, model, no_split, dtype in size_cases():
        ids.append(case_id)
        expected.append(accelerate_sizes(model, no_split, dtype))
        blocks += case_header(len(ids) - 1, no_split, dtype) + ["report sizes"] + describe(model) + ["end"]
    got = run_program(blocks)
    got = [[f"{k if k else '-'} {v}" for k, v in case.items()] for case in got]
    wrong = [(i, e, g) for i, (e, g) in enumerate(zip(expected, got)) if e != g]
    for i, e, g in wrong[:3]:
        print(f"{ids[i]}:\n  Accelerate {e}\n  accel      {g}")
    print(f"{len(expected) - len(wrong)} of {len(expected)} module sizes and largest layers equal Accelerate's")
    return len(wrong)


def main():
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    return 1 if compare_sizes() + compare_maps() else 0


if __name__ == "__main__":
    sys.exit(main())
