"""mesh.python_coordinates: accel::mesh_layout against PyTorch's init_device_mesh, as Accelerate builds it.

For each shape (world size, dp_replicate, dp_shard, cp, tp), the C++ program prints every rank's coordinates and,
for each dimension and flattened sub-mesh, its group's members and its index there. PyTorch gives the same through
Accelerate's own ParallelismConfig (validation, then build_device_mesh: init_device_mesh and the _flatten calls), one
rank at a time in this process over PyTorch's fake process group (the mesh logic is PyTorch's own; no traffic).
A shape Accelerate refuses must be refused by accel too. Usage: check_mesh_layout.py MESH_LAYOUT_PROGRAM
"""

import json
import subprocess
import sys
import types
import warnings

import torch.distributed as dist
from accelerate.parallelism_config import ParallelismConfig
from torch.testing._internal.distributed.fake_pg import FakeStore

NAMES = ["dp_replicate", "dp_shard", "cp", "tp", "dp", "dp_shard_cp", "dp_cp"]
# (world size, dp_replicate, dp_shard, cp, tp)
SHAPES = [
    (4, 2, 2, 1, 1), (4, 1, 4, 1, 1), (4, 4, 1, 1, 1), (4, 1, 2, 1, 2), (4, 1, 1, 1, 4), (4, 1, 2, 2, 1),
    (4, 1, 1, 2, 2), (4, 1, 1, 1, 1), (4, 2, 1, 1, 2), (4, 2, 2, 1, 2), (4, 0, 4, 1, 1),
    (8, 2, 2, 1, 2), (8, 2, 2, 2, 1), (8, 1, 2, 2, 2), (8, 2, 4, 1, 1), (8, 4, 2, 1, 1), (8, 1, 8, 1, 1),
    (8, 1, 4, 1, 2), (8, 1, 2, 1, 4), (8, 1, 1, 2, 4), (8, 1, 1, 4, 2), (8, 8, 1, 1, 1), (8, 1, 1, 1, 1),
    (8, 2, 1, 1, 4), (8, 4, 1, 2, 1), (8, 2, 2, 1, 1), (8, 1, 3, 1, 1),
]


def accelerate_mesh(world, sizes):
    """Every rank's layout as Accelerate and PyTorch make it, or (None, why) where Accelerate refuses the shape."""
    ranks = []
    for rank in range(world):
        dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
        try:
            config = accelerate_config(world, sizes)
            mesh = config.build_device_mesh("cpu")
            ranks.append(rank_layout(mesh, rank))
        except ValueError as refusal:
            return None, str(refusal)
        finally:
            dist.destroy_process_group()
    return {"shape": list(mesh.mesh.shape), "ranks": ranks}, None


def accelerate_config(world, sizes):
    """Accelerate's ParallelismConfig, validated for a job of `world` processes as its Accelerator does."""
    # Its default tp handler wants transformers, which applies the TP layers there; the mesh needs none.
    config = ParallelismConfig(dp_replicate_size=sizes[0], dp_shard_size=sizes[1], cp_size=sizes[2],
                               tp_size=sizes[3], tp_handler=types.SimpleNamespace() if sizes[3] > 1 else None)
    job = types.SimpleNamespace(multi_device=True, num_processes=world, is_fsdp2=False, distributed_type="MULTI_CPU")
    config._validate_accelerator(job)
    return config


def rank_layout(mesh, rank):
    """One rank's coordinates, and its group's members and index for each dimension and flattened sub-mesh."""
    groups = {}
    for name in NAMES:
        try:
            sub = mesh[name]
        except KeyError:
            continue
        groups[name] = {"members": dist.get_process_group_ranks(sub.get_group()), "local_rank": sub.get_local_rank()}
    return {"rank": rank, "coordinates": list(mesh.get_coordinate()), "groups": groups}


def main():
    program = sys.argv[1]
    warnings.simplefilter("ignore")
    failures = 0
    for world, *sizes in SHAPES:
        label = f"world {world}, dp_replicate={sizes[0]} dp_shard={sizes[1]} cp={sizes[2]} tp={sizes[3]}"
        expected, refusal = accelerate_mesh(world, sizes)
        run = subprocess.run([program, str(world), *map(str, sizes)], capture_output=True, text=True, timeout=60)
        if expected is None:
            ok = run.returncode == 3 and run.stderr.startswith("accel: mesh ")
            print(f"{'ok  ' if ok else 'FAIL'} {label}: refused by Accelerate ({refusal[:60]}...); accel: "
                  f"{run.stderr.strip() if run.returncode else 'accepted'}")
        else:
            got = json.loads(run.stdout) if run.returncode == 0 else run.stderr.strip()
            ok = got == expected
            print(f"{'ok  ' if ok else 'FAIL'} {label}: shape {expected['shape']}, "
                  f"{', '.join(expected['ranks'][0]['groups'])}")
            if not ok:
                print(f"  PyTorch: {json.dumps(expected)}\n  accel:   {got if isinstance(got, str) else json.dumps(got)}")
        failures += not ok
    print(f"{len(SHAPES) - failures} of {len(SHAPES)} shapes as PyTorch's init_device_mesh")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
