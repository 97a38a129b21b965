"""mesh.python_coordinates: accel::mesh_layout against PyTorch's init_device_mesh, as Accelerate builds it.

For each shape (world size, dp_replicate, dp_shard, cp, tp), the C++ program prints every rank's coordinates and,
for each dimension and flattened sub-mesh, its group's members and its index there. PyTorch gives the same through
Accelerate's own ParallelismConfig (validation, then build_device_mesh: init_device_mesh and the _flatten calls), one
rank at a time in this process over PyTorch's fake process group (the mesh logic is PyTorch's own; no traffic).
A shape Accelerate refuses must be refused by accel too. Usage: check_mesh_layout.py MESH_LAYOUT_PROGRAM

mesh.launch.ranks: check_mesh_layout.py --launched ACCEL MESH_GROUPS_PROGRAM starts 4 processes through
`accel launch` with the sizes as Accelerate's launch flags (one shape as the config file's parallelism_config block),
and compares each process's accelerator rank queries (data_parallel_rank, data_parallel_shard_rank,
tensor_parallel_rank, context_parallel_rank) with its local rank along dp_replicate, dp_shard, tp and cp in
PyTorch's init_device_mesh (0 along a dimension the mesh leaves out, as Accelerate); the config file's
parallelism_config_cp_comm_strategy reaches each process as the rotation its accelerator configures (all-gather
otherwise).
"""

import json
import os
import re
import subprocess
import sys
import tempfile
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


# (dp_replicate, dp_shard, cp, tp) launched on 4 processes, between them varying every rank query; the last through
# the config file.
LAUNCHED = [(2, 2, 1, 1), (1, 1, 2, 2)]
QUERIES = {"data_parallel_rank": "dp_replicate", "data_parallel_shard_rank": "dp_shard",
           "tensor_parallel_rank": "tp", "context_parallel_rank": "cp"}
FLAGS = ["dp_replicate", "dp_shard", "cp", "tp"]


def launch_ranks(accel, program, sizes, through_file):
    """Each process's rank queries, by rank, from `accel launch` with the sizes as flags or config file keys."""
    with tempfile.TemporaryDirectory() as directory:
        config = os.path.join(directory, "config.yaml")
        with open(config, "w") as out:  # Accelerate's layout: the sizes nested under parallelism_config
            out.write("num_processes: 4\n")
            if through_file:  # with context parallelism's rotation, which the workers must get as their variable
                out.write("parallelism_config:\n" + "".join(
                    f"  parallelism_config_{name}_size: {size}\n" for name, size in zip(FLAGS, sizes)) +
                    "  parallelism_config_cp_comm_strategy: alltoall\n")
        flags = [] if through_file else [f"--parallelism_config_{n}_size={s}" for n, s in zip(FLAGS, sizes)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PARALLELISM_CONFIG_")}
        run = subprocess.run([accel, "launch", "--config_file", config, "--master_port", "0", "--prefix_output",
                              *flags, program, "ranks"], capture_output=True, text=True, timeout=120, env=env)
    got = {}
    for line in run.stdout.splitlines():
        match = re.match(r"\[rank (\d+)\] (\{.*\})$", line)
        if match:
            got[int(match.group(1))] = json.loads(match.group(2))
    return got, run


def check_launched(accel, program):
    failures = 0
    for index, sizes in enumerate(LAUNCHED):
        through_file = index == len(LAUNCHED) - 1
        expected, _ = accelerate_mesh(4, sizes)
        got, run = launch_ranks(accel, program, sizes, through_file)
        wrong = []
        for rank in range(4):
            groups = expected["ranks"][rank]["groups"]
            want = {query: groups[dim]["local_rank"] if dim in groups else 0 for query, dim in QUERIES.items()}
            want["rank"], want["sizes"] = rank, list(sizes)
            want["cp_comm_strategy"] = "alltoall" if through_file else "allgather"
            if got.get(rank) != want:
                wrong.append(f"rank {rank}: PyTorch {want}, accel {got.get(rank)}")
        label = f"dp_replicate={sizes[0]} dp_shard={sizes[1]} cp={sizes[2]} tp={sizes[3]}"
        label += " (config file)" if through_file else " (flags)"
        print(f"{'FAIL' if wrong else 'ok  '} {label}: shape {expected['shape']}")
        if wrong:
            print("\n".join(wrong) + f"\n  exit {run.returncode}; stderr: {run.stderr[-2000:]}")
        failures += bool(wrong)
    print(f"{len(LAUNCHED) - failures} of {len(LAUNCHED)} launched meshes give PyTorch's ranks")
    return 1 if failures else 0


def main():
    if sys.argv[1] == "--launched":
        warnings.simplefilter("ignore")
        return check_launched(sys.argv[2], sys.argv[3])
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
