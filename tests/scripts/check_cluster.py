#!/usr/bin/env python3
"""The cluster.* tests: jobs across the machines of the namespace cluster (cluster.py), checked.

usage: check_cluster.py ACCEL NODE_CHECKPOINT WORK_DIR CASE [POLICY]

CASE is one of the case_* functions below (CTest runs each as cluster.CASE); the checkpoint cases take the parallel
policy (data_parallel or fully_sharded, which gathers its slices into the same files; CTest: cluster.CASE.POLICY),
resume_latest how the checkpoints were saved (on_each_node or main_process_saves), machine_lost which machine
vanishes and when (worker_node or main_node mid-step, during_save), link_cut for how long (restored within the
heartbeat timeout, beyond_timeout), sharded_format where the sharded checkpoint goes (unshared_disk: refused) or which
policy saves it into a directory both machines see (fully_sharded, zero2).
Where the host cannot make the cluster (not root, iproute2 missing), the test says why and exits with 77, which CTest
reports as skipped.
Processes 0 and 1 of a job are machine0's, 2 and 3 machine1's; the launchers meet at machine0's address.
Python standard library only.
"""
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import cluster as harness
from checks import CheckFailed, check, job_environment
from save_on_each_node import SHARED_FILES, random_states

JOB_TIMEOUT = 120  # seconds for a job: a hang fails, a loaded machine does not (a job takes about 3 s alone)
PORT = "29500"  # every cluster has a network of its own, so tests running at once cannot take each other's port
LAUNCH = ["launch", "--nnodes", "2", "--node_rank", "{node_rank}", "--nproc_per_node", "2", "--master_addr",
          "{master_addr}", "--master_port", PORT]


class Job:
    """`node_checkpoint ARGS` on 2 machines x 2 processes, one `accel launch FLAGS` per machine, run to its end."""

    def __init__(self, cluster, accel, program, args, log, flags=()):
        with open(log, "w") as out:
            self.codes = harness.run_everywhere(cluster, [accel, *LAUNCH, *flags, program, *args], JOB_TIMEOUT,
                                                env=job_environment(), output=out)
        with open(log) as f:
            self.output = f.read()
        check(None not in self.codes, f"{' '.join(args)}: the job did not end within {JOB_TIMEOUT} s:\n{self.output}")
        self.lines = {}
        for line in self.output.splitlines():
            words = line.split(" ", 4)  # [machineN] node_checkpoint: rank R what
            if len(words) == 5 and words[1] == "node_checkpoint:" and words[2] == "rank":
                self.lines[int(words[3])] = words[4]

    def check_every_rank(self, what, expected):
        for rank in range(4):
            got = self.lines.get(rank)
            check(got == expected,
                  f"{what}: rank {rank} printed {got!r}; launchers exited with {self.codes}; output:\n{self.output}")
        check(self.codes == [0, 0], f"{what}: the launchers exited with {self.codes}:\n{self.output}")


def in_machine(machine, code, args=(), timeout=30):
    """Runs Python `code` on `machine`; returns its output (stripped), failing the check when it fails."""
    result = machine.run([sys.executable, "-c", code, *args], timeout=timeout)
    check(result.returncode == 0, f"{machine.name}: {code!r} failed:\n{result.stdout}")
    return result.stdout.strip()


def owned_processes(owner):
    return [pid for pid in harness.pids() if harness.marker_of(pid) == owner]


def wait_until(condition, seconds):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.1)
    return condition()


def check_machine_alone(machine, disk):
    """Its name, its one address and route (no default route), its interface for Gloo, its own disk and /tmp."""
    check(machine.run(["hostname"]).stdout.strip() == machine.name, f"{machine.name}'s host name")
    check(machine.run(["sh", "-c", "echo $GLOO_SOCKET_IFNAME"]).stdout.strip() == "eth0", "GLOO_SOCKET_IFNAME")
    addresses = machine.run(["ip", "-brief", "-4", "address"]).stdout.split()
    check(len(addresses) == 6 and addresses[:3] == ["lo", "UNKNOWN", "127.0.0.1/8"] and
          addresses[3].startswith("eth0@") and addresses[4:] == ["UP", f"{machine.address}/24"],
          f"{machine.name}'s interfaces: {addresses}")
    routes = machine.run(["ip", "-4", "route"]).stdout.strip()
    check(routes == f"10.77.0.0/24 dev eth0 proto kernel scope link src {machine.address}",
          f"{machine.name}'s routes (there must be no default route): {routes!r}")
    in_machine(machine, f"open('{disk}/only-on-{machine.name}', 'w').write('x'); open('/tmp/{machine.name}', 'w')")
    listing = in_machine(machine, f"import os; print(sorted(os.listdir('{disk}')), "
                                  f"sorted(name for name in os.listdir('/tmp') if name.startswith('machine')))")
    check(listing == f"['only-on-{machine.name}'] ['{machine.name}']",
          f"{machine.name} sees other machines' files on its disk or /tmp: {listing}")
    check(os.path.exists(machine.path(f"{disk}/only-on-{machine.name}")), "the harness's view of a machine's disk")


def command_line_paths():
    """ACCEL, NODE_CHECKPOINT and WORK_DIR, absolute."""
    return [os.path.abspath(path) for path in sys.argv[1:4]]


def machines(*args, **kwargs):
    """harness.Cluster, the programs and the work directory given on the command line kept visible in the machines
    (a build directory under /tmp apart from the checkout would otherwise be hidden by each machine's own /tmp)."""
    return harness.Cluster(*args, keep=command_line_paths(), **kwargs)


CONNECT = """
import errno, socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2)
    print('connected')
except OSError as e:
    print(errno.errorcode.get(e.errno) or type(e).__name__)"""


def connect(machine, address, port):
    """How a TCP connection from `machine` to `address`:`port` ends: connected, ECONNREFUSED, TimeoutError..."""
    return in_machine(machine, CONNECT, args=[address, str(port)])


def host_address():
    """One of the host's own global IPv4 addresses (None when it has none)."""
    words = subprocess.run(["ip", "-brief", "-4", "address", "show", "scope", "global"], stdout=subprocess.PIPE,
                           text=True, timeout=30).stdout.split()
    return next((word.split("/")[0] for word in words if "/" in word), None)


def check_network(cluster):
    """machine1 reaches machine0 at the links' rate and not the host; a cut link carries nothing until restored."""
    machine0, machine1 = cluster.machines[:2]
    with socket.create_server(("0.0.0.0", 0)) as host:
        port = host.getsockname()[1]
        got = connect(machine1, "127.0.0.1", port)
        check(got == "ECONNREFUSED", f"machine1 reached the host's loopback: {got}")
        if address := host_address():
            got = connect(machine1, address, port)
            check(got == "ENETUNREACH", f"machine1 reached the host's address {address}: {got}")
    size = 1_000_000
    receiver = machine0.start([sys.executable, "-c", f"""
import socket
server = socket.create_server(('{machine0.address}', 5000))
print('listening', flush=True)
connection, _ = server.accept()
received = 0
while chunk := connection.recv(65536):
    received += len(chunk)
connection.sendall(b'ok')
print(received)"""], stdout=subprocess.PIPE, text=True)
    check(receiver.stdout.readline().strip() == "listening", "machine0's receiver did not start")
    sent_before, _ = cluster.link_bytes(1)
    # Timed by the sender, from before it connects until the receiver says it has every byte: all of them crossed
    # the link in that time, however late the receiver read them.
    seconds = float(in_machine(machine1, f"""
import socket, time
started = time.monotonic()
connection = socket.create_connection(('{machine0.address}', 5000))
connection.sendall(bytes({size}))
connection.shutdown(socket.SHUT_WR)
assert connection.recv(2) == b'ok'
print(time.monotonic() - started)"""))
    received = receiver.communicate(timeout=60)[0].strip()
    # 1 MB at 8 Mbit/s takes 1 s (less the bucket's 32 KiB): a loaded host is slower, never faster.
    check(received == str(size) and seconds >= 0.95, f"{received} bytes crossed the 8 Mbit/s link in {seconds} s")
    sent_after, _ = cluster.link_bytes(1)
    check(sent_after - sent_before >= size, f"the link's counter: {sent_after - sent_before} bytes, expected >= {size}")
    cluster.set_link(1, up=False)
    got = connect(machine1, machine0.address, 22)
    # Timed out, or unreachable once machine1's neighbour entry for machine0 has expired unanswered.
    check(got in ("TimeoutError", "EHOSTUNREACH"), f"machine1 to machine0 through a cut link: {got}")
    cluster.set_link(1, up=True)
    # Nothing listens there: refused, once the link carries again and machine0's address is resolved anew.
    outcomes = []
    check(wait_until(lambda: outcomes.append(connect(machine1, machine0.address, 22)) or outcomes[-1] == "ECONNREFUSED",
                     20), f"machine1 to machine0 through the restored link, 20 s on: {outcomes}")
    return seconds


def check_harness_killed(work):
    """A harness killed outright (SIGKILL, as a test runner's timeout) takes its machines' processes with it."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cluster.py")
    child = subprocess.Popen([sys.executable, script, "--machines", "2", "--disk", os.path.join(work, "killed"),
                              "--", "sh", "-c", "echo started; exec sleep 100"], stdout=subprocess.PIPE, text=True)
    owner = f"{child.pid}.{harness.start_time(child.pid)}"
    try:
        for _ in range(2):
            check(child.stdout.readline().endswith("started\n"), "the killed harness's machines did not start")
        # 3 namespace holders and 2 commands (whose environment cannot be read while they exec sleep: wait)
        check(wait_until(lambda: len(owned_processes(owner)) == 5, 10),
              f"the harness's processes: {owned_processes(owner)}")
    finally:
        child.kill()
        child.wait()
    check(wait_until(lambda: not owned_processes(owner), 10),
          f"10 s after its harness was killed, processes remain: {owned_processes(owner)}")


def check_stale_swept():
    """A process left by a harness that is gone (here: one marked with an owner that never ran) is killed."""
    stale = subprocess.Popen(["sleep", "100"], env=dict(os.environ, **{harness.MARKER: "999999999.0"}))
    with machines(1):
        check(stale.wait(10) == -signal.SIGKILL, "a stale cluster's process was not killed")


def check_skipped_unprivileged(work):
    """Where namespaces cannot be made (here: not root), the harness and these tests say why and exit with 77."""
    scripts = os.path.dirname(os.path.abspath(__file__))
    for command in ([os.path.join(scripts, "cluster.py"), "--", "true"],
                    [os.path.join(scripts, "check_cluster.py"), "accel", "program", work, "zero2"]):
        result = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                                 *command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60,
                                cwd=work)
        check(result.returncode == harness.SKIP and "SKIPPED: " in result.stdout and "root" in result.stdout,
              f"not root, {os.path.basename(command[0])} exited with {result.returncode}: {result.stdout}")


def check_checkout_under_tmp(accel, work):
    """A checkout under /tmp (a fresh clone, often) runs on the machines: the harness copied into one, with the tool
    built there, runs it on 2 machines, whose /tmp is still their own (a host file beside the checkout unseen)."""
    checkout = tempfile.mkdtemp(prefix="accel-checkout-", dir="/tmp")
    beside = checkout + "-beside"
    try:
        os.makedirs(os.path.join(checkout, "tests", "scripts"))
        shutil.copy(os.path.join(os.path.dirname(os.path.abspath(__file__)), "cluster.py"),
                    os.path.join(checkout, "tests", "scripts"))
        tool = os.path.join(checkout, "build", "tools", "accel")
        os.makedirs(os.path.dirname(tool))
        shutil.copy(accel, tool)
        open(beside, "w").close()
        # Run from elsewhere, the tool named inside a shell command: only the harness's own checkout keeps it visible.
        script = f"{tool} --version && test ! -e {beside} && echo private"
        result = subprocess.run([sys.executable, os.path.join(checkout, "tests", "scripts", "cluster.py"),
                                 "--machines", "2", "--timeout", "60", "--", "sh", "-c", script],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120, cwd=work)
        check(result.returncode == 0 and result.stdout.count("private") == 2,
              f"a checkout under /tmp ({checkout}): the harness exited with {result.returncode}:\n{result.stdout}")
    finally:
        shutil.rmtree(checkout, ignore_errors=True)
        if os.path.exists(beside):
            os.remove(beside)


def case_harness(accel, program, work):
    disk = os.path.join(work, "disk")
    with machines(3, disk, rate=8_000_000, lifetime=300) as cluster:
        for machine in cluster.machines:
            check_machine_alone(machine, disk)
        check(os.listdir(disk) == [], f"the host sees the machines' disks: {os.listdir(disk)}")
        seconds = check_network(cluster)
        holders = [holder.pid for holder in cluster.holders]
        namespaces = {os.readlink(f"/proc/{pid}/ns/net") for pid in holders}
    left = [pid for pid in harness.pids() if harness.marker_of(pid) == cluster.owner]
    check(not left, f"processes left after the cluster closed: {left}")
    check(not any(os.path.exists(f"/proc/{pid}") for pid in holders), "a machine's namespace holder was left")
    inside = [pid for pid in harness.pids() if os.path.exists(f"/proc/{pid}/ns/net") and
              os.readlink(f"/proc/{pid}/ns/net") in namespaces]
    check(not inside, f"processes left in the machines' network namespaces: {inside}")
    check_harness_killed(work)
    check_checkout_under_tmp(accel, work)
    check_stale_swept()
    check_skipped_unprivileged(work)
    return (f"3 machines alone on their network and disks, 1 MB across an 8 Mbit/s link in {seconds:.2f} s, a link cut "
            f"and restored, nothing left behind, a checkout under /tmp run")


def train_across_machines(accel, program, work, policy, flags=()):
    """10 steps of `policy` on 2 machines x 2 processes end with the bytes of the same job on 1 machine x 4, both
    launched with `flags`."""
    reference = os.path.join(work, "one_machine.safetensors")
    one_machine = subprocess.run([accel, "launch", "--nproc_per_node", "4", "--master_port", "0", *flags, program,
                                  policy, "train", reference], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, env=job_environment(), timeout=JOB_TIMEOUT)
    check(one_machine.returncode == 0, f"the job on one machine failed:\n{one_machine.stdout}")
    disk = os.path.join(work, "disk")
    with machines(2, disk, lifetime=JOB_TIMEOUT + 60) as cluster:
        crossed = cluster.link_bytes(1)
        job = Job(cluster, accel, program, [policy, "train", f"{disk}/trained.safetensors"],
                  os.path.join(work, "job.log"), flags)
        job.check_every_rank(f"{policy} across machines", "trained")
        crossed = [after - before for after, before in zip(cluster.link_bytes(1), crossed)]
        with open(cluster.machines[0].path(f"{disk}/trained.safetensors"), "rb") as f:
            trained = f.read()
        check(not os.path.exists(cluster.machines[1].path(f"{disk}/trained.safetensors")),
              "machine1 wrote the parameters too: only the main process writes")
    with open(reference, "rb") as f:
        check(trained == f.read(), f"{policy}: the parameters trained on 2 machines x 2 processes differ from those "
                                   f"of 1 machine x 4 processes")
    # The model's 81 float32 parameters reduced on each of 10 steps: each way at least that many bytes.
    check(min(crossed) >= 10 * 81 * 4, f"machine1's link carried {crossed} bytes (sent, received)")
    return f"{len(trained)} bytes of parameters, equal; machine1's link carried {crossed[0]} + {crossed[1]} bytes"


def case_data_parallel(accel, program, work):
    return train_across_machines(accel, program, work, "data_parallel")


def case_zero2(accel, program, work):
    return train_across_machines(accel, program, work, "zero2")


def case_fully_sharded(accel, program, work):
    return train_across_machines(accel, program, work, "fully_sharded")


def case_hybrid_sharded(accel, program, work):
    """The 2 x 2 mesh laid out over the machines as Accelerate's: ranks 0, 1 (machine0) and 2, 3 (machine1) are the
    dp_shard groups, so the shards stay within a machine and the replicas' all-reduce crosses the link."""
    return train_across_machines(accel, program, work, "hybrid_sharded",
                                 ["--parallelism_config_dp_replicate_size", "2", "--parallelism_config_dp_shard_size",
                                  "2"])


def files_on(machine, directory):
    path = machine.path(directory)
    return set(os.listdir(path)) if os.path.isdir(path) else None


def case_save_on_each_node(accel, program, work, policy):
    """save_on_each_node onto each machine's own disk: each holds the shared files and its processes' states; a job
    resumes from them bit for bit, each machine reading its own."""
    disk = os.path.join(work, "disk")
    ckpt = f"{disk}/ckpt"
    with machines(2, disk, lifetime=2 * JOB_TIMEOUT + 60) as cluster:
        saved = Job(cluster, accel, program, [policy, "save", ckpt, "on_each_node"], os.path.join(work, "save.log"))
        saved.check_every_rank("save with save_on_each_node", "saved")
        for machine, ranks in zip(cluster.machines, ((0, 1), (2, 3))):
            got = files_on(machine, ckpt)
            check(got == SHARED_FILES | random_states(*ranks),
                  f"{machine.name}'s disk holds {sorted(got or [])}: expected the shared files and the random states "
                  f"of processes {ranks}")
        resumed = Job(cluster, accel, program, [policy, "resume", ckpt], os.path.join(work, "resume.log"))
        resumed.check_every_rank("resume from each machine's own disk", "resumed bit for bit")
    return "each machine's disk held its part, and the job resumed from them bit for bit"


def case_main_process_saves(accel, program, work, policy):
    """Without save_on_each_node, machine0's disk holds the whole checkpoint (machine1's processes send it their
    states) and machine1's none; copied onto machine1's disk, the job resumes bit for bit."""
    disk = os.path.join(work, "disk")
    ckpt = f"{disk}/ckpt"
    with machines(2, disk, lifetime=2 * JOB_TIMEOUT + 60) as cluster:
        saved = Job(cluster, accel, program, [policy, "save", ckpt], os.path.join(work, "save.log"))
        saved.check_every_rank("save without save_on_each_node", "saved")
        machine0, machine1 = cluster.machines
        got = files_on(machine0, ckpt)
        check(got == SHARED_FILES | random_states(0, 1, 2, 3), f"machine0's disk holds {sorted(got or [])}")
        check(files_on(machine1, disk) == set(), f"machine1's disk holds {files_on(machine1, disk)}")
        shutil.copytree(machine0.path(ckpt), machine1.path(ckpt))
        resumed = Job(cluster, accel, program, [policy, "resume", ckpt], os.path.join(work, "resume.log"))
        resumed.check_every_rank("resume from machine0's checkpoint copied to machine1", "resumed bit for bit")
    return "machine0's disk held the whole checkpoint, machine1's nothing; copied, the job resumed bit for bit"


def case_resume_latest(accel, program, work, saves):
    """resume::latest on disks the machines do not share: a job stopped at step 7 (a checkpoint every 2 steps) is
    started again and resumes by itself. `on_each_node` (save_on_each_node): each machine's disk holds checkpoint_2
    whole, and the job resumes from it bit for bit. `main_process_saves`: only machine0's disk holds it, and every
    process throws at once, naming it, the processes lacking it and the fix (not after the collective timeout)."""
    disk = os.path.join(work, "disk")
    project = f"{disk}/project"
    on_each_node = ["on_each_node"] if saves == "on_each_node" else []
    with machines(2, disk, lifetime=2 * JOB_TIMEOUT + 60) as cluster:
        stopped = Job(cluster, accel, program, ["latest", project, "stop", *on_each_node],
                      os.path.join(work, "stop.log"))
        stopped.check_every_rank("a job stopped at step 7", "stopped at step 7")
        holding = [machine.name for machine in cluster.machines
                   if "accel_checksums.txt" in (files_on(machine, f"{project}/checkpoints/checkpoint_2") or ())]
        started = time.monotonic()
        resumed = Job(cluster, accel, program, ["latest", project, "resume", *on_each_node],
                      os.path.join(work, "resume.log"))
        seconds = time.monotonic() - started
    if on_each_node:
        check(holding == ["machine0", "machine1"], f"checkpoint_2 complete on {holding}, expected on both machines")
        resumed.check_every_rank("resume::latest from each machine's own disk", "resumed from checkpoint_2 bit for bit")
        return f"each machine's disk held checkpoint_2; resumed from it by itself, bit for bit, in {seconds:.1f} s"
    check(holding == ["machine0"], f"checkpoint_2 complete on {holding}, expected on machine0 alone")
    for rank in range(4):
        got = resumed.lines.get(rank, "")
        for part in ("resume failed: ", "no checkpoint is complete on every process", "checkpoint_2",
                     "missing or incomplete on processes 2, 3", "save_on_each_node", "copy checkpoint_2"):
            check(part in got, f"rank {rank} printed {got!r}, without {part!r}:\n{resumed.output}")
    check(resumed.codes != [0, 0], f"the launchers exited with {resumed.codes}")
    # The job's collective timeout is 60 s (node_checkpoint): an error found only when a collective gave up is late.
    check(seconds < 30, f"the error came after {seconds:.1f} s")
    return f"every process named checkpoint_2, machine1's processes and the fix, {seconds:.1f} s after the start"


LOST_WITHIN = 30  # seconds from a machine's loss to the end of every surviving launcher (issue 35)
SHORT_HEARTBEAT = ["--heartbeat_timeout", "6", "--heartbeat_interval", "1"]  # a loss found in 5 to 6 s


class RunningJob:
    """`node_checkpoint ARGS` started on every machine, one `accel launch FLAGS` each, its output gathered by line."""

    def __init__(self, cluster, accel, program, args, log, flags=(), env=None):
        values = {"nnodes": cluster.count, "master_addr": cluster.machines[0].address}
        self.lines, self.log, self.lock = [[] for _ in cluster.machines], open(log, "w"), threading.Lock()
        self.launchers = []
        for machine in cluster.machines:
            command = [word.format(node_rank=machine.index, **values)
                       for word in [accel, *LAUNCH, *flags, program, *args]]
            launcher = machine.start(command, env=env or job_environment(), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
            threading.Thread(target=self._relay, args=(machine, launcher.stdout), daemon=True).start()
            self.launchers.append(launcher)

    def _relay(self, machine, stream):
        for line in stream:
            with self.lock:
                self.lines[machine.index].append(line)
                self.log.write(f"[{machine.name}] {line}")
                self.log.flush()

    def output(self, index):
        with self.lock:
            return "".join(self.lines[index])

    def last_step(self, rank):
        """The last step process `rank` printed (0 before its first)."""
        prefix = f"node_checkpoint: rank {rank} step "
        with self.lock:
            steps = [int(line[len(prefix):]) for line in self.lines[rank // 2] if line.startswith(prefix)]
        return max(steps, default=0)

    def wait_for_line(self, index, line, seconds):
        check(wait_until(lambda: f"{line}\n" in self.lines[index], seconds),
              f"machine{index} did not print {line!r} within {seconds} s:\n{self.output(index)}")


def launchers_met(cluster):
    """Whether machine1's launcher holds a connection to machine0's heartbeat port (--master_port + 1)."""
    address = "".join(f"{int(byte):02X}" for byte in reversed(cluster.machines[0].address.split(".")))
    remote = f"{address}:{int(PORT) + 1:04X}"
    with open(f"/proc/{cluster.machines[1].holder.pid}/net/tcp") as f:  # that machine's connections
        return any(words[2] == remote and words[3] == "01" for words in (line.split() for line in f))  # ESTABLISHED


def complete_checkpoints(machine, project):
    """The checkpoints complete on `machine`'s disk (those with their checksums), and every entry of the directory."""
    entries = files_on(machine, f"{project}/checkpoints") or set()
    complete = {name for name in entries
                if "accel_checksums.txt" in (files_on(machine, f"{project}/checkpoints/{name}") or ())}
    return complete, entries


def machine_lost_during_save(accel, program, work):
    """With save_on_each_node and a checkpoint every 2 steps, machine1 vanishes while both machines' writers are inside
    the save of checkpoint_2 (each said so; the save takes 3 s there): machine0's launcher names node 1 and ends with 1
    within the heartbeat timeout (6 s here) plus a few seconds. Nothing is lost: each disk holds checkpoint_0 and
    checkpoint_1 complete and checkpoint_2 never complete; with the link restored, the job started again with
    resume::latest passes over what is left of checkpoint_2 and resumes from checkpoint_1 on each machine's own disk,
    bit for bit."""
    disk = os.path.join(work, "disk")
    project = f"{disk}/project"
    with machines(2, disk, lifetime=2 * JOB_TIMEOUT + 60) as cluster:
        job = RunningJob(cluster, accel, program, ["latest", project, "lose_in_save", "on_each_node"],
                         os.path.join(work, "job.log"), SHORT_HEARTBEAT)
        job.wait_for_line(1, "node_checkpoint: rank 2 saving checkpoint_2", JOB_TIMEOUT - 30)
        check(launchers_met(cluster), "machine1's launcher is not connected to machine0's heartbeat port")
        cluster.vanish(1)
        codes, took = wait_all(job, 30)
        seconds = took[0]
        time.sleep(0.5)  # its last lines
        output = job.output(0)
        check("node_checkpoint: rank 0 saving checkpoint_2\n" in output, f"machine0 was not saving:\n{output}")
        check(codes[0] == 1, f"machine0's launcher exited with {codes[0]}, expected 1:\n{output}")
        check(f"accel launch: node 1 (ranks 2, 3, at {cluster.machines[1].address}) is lost: " in output,
              f"machine0's launcher did not name node 1:\n{output}")
        check(4 <= seconds < 6 + 5, f"machine0's launcher ended {seconds:.1f} s after machine1 vanished")
        left = {}
        for machine in cluster.machines:
            complete, left[machine.name] = complete_checkpoints(machine, project)
            check(complete == {"checkpoint_0", "checkpoint_1"},
                  f"{machine.name}'s disk holds {sorted(left[machine.name])}, complete: {sorted(complete)}")
        cluster.set_link(1, up=True)
        resumed = Job(cluster, accel, program, ["latest", project, "resume", "on_each_node"],
                      os.path.join(work, "resume.log"))
        resumed.check_every_rank("resume::latest after the loss", "resumed from checkpoint_1 bit for bit")
    return (f"machine0's launcher named node 1 {seconds:.1f} s after it vanished mid-save; disks left: "
            f"{sorted(left['machine0'])} and {sorted(left['machine1'])}; resumed from checkpoint_1 bit for bit")


def case_machine_lost(accel, program, work, which):
    """2 machines x 2 processes train a long run whose collective timeout is 600 s; at step 20 one machine vanishes
    (`worker_node`: machine1; `main_node`: machine0, which holds the job's store): its link is cut, then its processes
    are SIGKILLed, so no connection is closed. The other machine's launcher must name the lost node, its ranks and
    since when, stop its workers and exit with 1 within 30 s, through the launchers' heartbeats (default timeout
    15 s), not after the collective timeout."""
    if which == "during_save":
        return machine_lost_during_save(accel, program, work)
    lost = {"worker_node": 1, "main_node": 0}[which]
    survivor = 1 - lost
    with machines(2, os.path.join(work, "disk"), lifetime=JOB_TIMEOUT + 60) as cluster:
        job = RunningJob(cluster, accel, program, ["long"], os.path.join(work, "job.log"))
        try:
            for machine in (0, 1):
                job.wait_for_line(machine, f"node_checkpoint: rank {2 * machine} step 20", JOB_TIMEOUT - 30)
            check(launchers_met(cluster), "machine1's launcher is not connected to machine0's heartbeat port")
            started = time.monotonic()
            cluster.vanish(lost)
            code = job.launchers[survivor].wait(LOST_WITHIN + 30)
            seconds = time.monotonic() - started
        except subprocess.TimeoutExpired:
            raise CheckFailed(f"machine{survivor}'s launcher still ran {LOST_WITHIN + 30} s after machine{lost} "
                              f"vanished:\n{job.output(survivor)}")
        time.sleep(0.5)  # its last lines
        output = job.output(survivor)
        check(code == 1, f"machine{survivor}'s launcher exited with {code}, expected 1:\n{output}")
        node = (f"node 1 (ranks 2, 3, at {cluster.machines[1].address})" if lost == 1 else
                f"node 0 (ranks 0, 1: the main node, at {cluster.machines[0].address}, which holds the job's store)")
        for part in (f"accel launch: {node} is lost: its launcher has not been heard for ", " s, since ",
                     "its machine is down, its network link is cut", "start the job again on every node",
                     f"terminating this node's 2 running workers (ranks {2 * survivor}, {2 * survivor + 1}) and "
                     f"exiting with 1"):
            check(part in output, f"machine{survivor}'s launcher did not say {part!r}:\n{output}")
        # Found by the heartbeat's 15 s timeout (the last heartbeat up to 5 s before the loss), not by a collective.
        check(10 <= seconds < LOST_WITHIN, f"machine{survivor}'s launcher ended {seconds:.1f} s after the loss")
        left = cluster.machines[survivor].processes()
        check(not left, f"processes left on machine{survivor} after its launcher ended: {left}")
    return f"machine{survivor}'s launcher named {node.split(' (')[0]} and ended {seconds:.1f} s after machine{lost} vanished"


HANG_TIMEOUT = 3  # seconds: the hang watch's (ACCEL_HANG_TIMEOUT), well below the launchers' 15 s heartbeat timeout


def case_hang_vanished(accel, program, work):
    """hang.vanished_machine (PROGRAM: accel_hang_program): its `vanishing` job on 2 machines x 2 processes, the hang
    watch at 3 s, the flight records on each machine's disk. Every process reaches an all-reduce; machine1's two
    sleep before it, and machine1 vanishes (link cut, processes killed). machine0's processes must end within the
    hang timeout + 5 s of reaching it, its launcher naming processes 2 and 3 and the collective; `accel fr-trace`
    names them from machine0's two records, and PyTorch's torchfrtrace reads those records."""
    disk = os.path.join(work, "disk")
    dumps = os.path.join(disk, "flight-records")
    env = dict(job_environment(), ACCEL_HANG_TIMEOUT=str(HANG_TIMEOUT), ACCEL_FLIGHT_RECORDER_DIR=dumps)
    with machines(2, disk, lifetime=JOB_TIMEOUT + 60) as cluster:
        job = RunningJob(cluster, accel, program, ["vanishing"], os.path.join(work, "job.log"), env=env)
        reached = {}

        def all_reached():
            for rank, when in re.findall(r"process (\d+) reaches the scenario's collective at ([0-9.]+) s",
                                         job.output(0) + job.output(1)):
                reached[int(rank)] = float(when)
            return len(reached) == 4

        check(wait_until(all_reached, JOB_TIMEOUT - 30),
              f"not every process reached the collective:\n{job.output(0)}{job.output(1)}")
        cluster.vanish(1)
        try:
            code = job.launchers[0].wait(HANG_TIMEOUT + 30)
        except subprocess.TimeoutExpired:
            raise CheckFailed(f"machine0's launcher still ran {HANG_TIMEOUT + 30} s after machine1 vanished:\n"
                              f"{job.output(0)}")
        seconds = time.time() - max(reached[0], reached[1])
        time.sleep(0.5)  # its last lines
        output = job.output(0)
        check(code != 0, f"machine0's launcher exited with 0 after machine1 vanished:\n{output}")
        check(seconds <= HANG_TIMEOUT + 5, f"machine0's job ended {seconds:.1f} s after its processes reached the "
                                            f"collective (limit: hang timeout {HANG_TIMEOUT} s + 5 s):\n{output}")
        left = cluster.machines[0].processes()
        check(not left, f"processes left on machine0 after its launcher ended: {left}")
        named = "(all_reduce) on group default: processes 2, 3 missing (no flight record"
        check(f"accel launch: flight records: collective " in output and named in output,
              f"machine0's launcher did not name processes 2 and 3 missing from the all-reduce:\n{output}")
        records = cluster.machines[0].path(dumps)  # the host's view of machine0's disk, while the cluster lives
        found = sorted(os.listdir(records)) if os.path.isdir(records) else []
        check(found == ["accel_trace_rank_0", "accel_trace_rank_1"], f"machine0's flight records: {found}")
        ours = subprocess.run([accel, "fr-trace", records], capture_output=True, text=True, timeout=60)
        check(ours.returncode == 1 and named in ours.stdout and "issued by reduce" in ours.stdout,
              f"accel fr-trace exited with {ours.returncode} and did not name processes 2, 3 and reduce:\n"
              f"{ours.stdout}{ours.stderr}")
        # PyTorch's analyser names the processes without a record, and reads the others' when told to.
        analyser = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace"]
        theirs = subprocess.run([*analyser, records], capture_output=True, text=True, timeout=120)
        print(f"torchfrtrace exited with {theirs.returncode}\n{theirs.stdout}{theirs.stderr}")
        check("Missing dump files from ranks {2, 3}" in theirs.stderr,
              f"PyTorch's torchfrtrace did not name processes 2, 3 as without a record:\n{theirs.stderr}")
        theirs = subprocess.run([*analyser, "--allow-incomplete-ranks", records], capture_output=True, text=True,
                                timeout=120)
        print(f"torchfrtrace --allow-incomplete-ranks exited with {theirs.returncode}\n{theirs.stdout}{theirs.stderr}")
        check(theirs.returncode == 0, f"PyTorch's torchfrtrace could not read machine0's records:\n{theirs.stderr}")
    return f"machine0's job ended {seconds:.1f} s after its processes reached the all-reduce, naming processes 2, 3"


def on_one_machine(accel, program, work, mode):
    """The bytes of the parameters that `node_checkpoint MODE` (train or paced) ends with on 1 machine x 4 processes:
    those of the job on 2 machines x 2 with links uncut and unlimited (cluster.data_parallel shows the two equal)."""
    reference = os.path.join(work, "one_machine.safetensors")
    job = subprocess.run([accel, "launch", "--nproc_per_node", "4", "--master_port", "0", program, mode, reference],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=job_environment(),
                         timeout=JOB_TIMEOUT)
    check(job.returncode == 0, f"the {mode} job on one machine failed:\n{job.stdout}")
    with open(reference, "rb") as f:
        return f.read()


def wait_all(job, seconds):
    """The launchers' exit codes (None for one still running `seconds` on), and how long each took from now (inf for
    one still running): polled together, so that each is timed by itself."""
    started = time.monotonic()
    took = [math.inf] * len(job.launchers)
    while math.inf in took and time.monotonic() - started < seconds:
        for index, launcher in enumerate(job.launchers):
            if took[index] == math.inf and launcher.poll() is not None:
                took[index] = time.monotonic() - started
        time.sleep(0.05)
    return [launcher.poll() for launcher in job.launchers], took


CUT = 4  # seconds a link is cut and restored: well within the heartbeat's default 15 s timeout


def link_cut_restored(accel, program, work):
    """machine1's link cut for 4 s at step 10 of 40 and restored: TCP carries what waited, the job ends with the
    parameters of the uncut job byte for byte, and no launcher takes the other node for lost."""
    reference = on_one_machine(accel, program, work, "paced")
    disk = os.path.join(work, "disk")
    with machines(2, disk, lifetime=JOB_TIMEOUT + 60) as cluster:
        job = RunningJob(cluster, accel, program, ["paced", f"{disk}/trained.safetensors"],
                         os.path.join(work, "job.log"))
        job.wait_for_line(0, "node_checkpoint: rank 0 step 10", JOB_TIMEOUT - 30)
        cluster.set_link(1, up=False)
        at_cut = job.last_step(0)
        time.sleep(CUT)
        at_restore = job.last_step(0)
        cluster.set_link(1, up=True)
        codes, took = wait_all(job, JOB_TIMEOUT - 30)
        output = job.output(0) + job.output(1)
        check(codes == [0, 0], f"the launchers exited with {codes} after a {CUT} s cut:\n{output}")
        check("is lost" not in output, f"a launcher took the other node for lost during a {CUT} s cut:\n{output}")
        # A step needs machine1's gradients: at most the one whose bytes crossed before the cut ends meanwhile.
        check(at_restore <= at_cut + 1, f"rank 0 went from step {at_cut} to {at_restore} while the link was cut")
        with open(cluster.machines[0].path(f"{disk}/trained.safetensors"), "rb") as f:
            trained = f.read()
    check(trained == reference, "the parameters after the cut differ from those of the uncut job")
    return (f"cut {CUT} s at step {at_cut} (rank 0 stalled at step {at_restore}), the job ended "
            f"{max(took):.1f} s after the link was restored, parameters equal to the uncut job's")


def link_cut_beyond_timeout(accel, program, work):
    """machine1's link cut for good while a long run trains (collective timeout 600 s): both machines are alive, and
    each launcher names the other node as lost, stops its workers and exits with 1 within the heartbeat timeout (6 s
    here) plus a few seconds."""
    with machines(2, os.path.join(work, "disk"), lifetime=JOB_TIMEOUT + 60) as cluster:
        job = RunningJob(cluster, accel, program, ["long"], os.path.join(work, "job.log"), SHORT_HEARTBEAT)
        for machine in (0, 1):
            job.wait_for_line(machine, f"node_checkpoint: rank {2 * machine} step 20", JOB_TIMEOUT - 30)
        check(launchers_met(cluster), "machine1's launcher is not connected to machine0's heartbeat port")
        cluster.set_link(1, up=False)
        codes, seconds = wait_all(job, 30)
        time.sleep(0.5)  # their last lines
        nodes = (f"node 1 (ranks 2, 3, at {cluster.machines[1].address})",
                 f"node 0 (ranks 0, 1: the main node, at {cluster.machines[0].address}, which holds the job's store)")
        for machine in (0, 1):
            output = job.output(machine)
            check(codes[machine] == 1, f"machine{machine}'s launcher exited with {codes[machine]}:\n{output}")
            for part in (f"accel launch: {nodes[machine]} is lost: its launcher has not been heard for ",
                         f"terminating this node's 2 running workers (ranks {2 * machine}, {2 * machine + 1})"):
                check(part in output, f"machine{machine}'s launcher did not say {part!r}:\n{output}")
            check(4 <= seconds[machine] < 6 + 5,
                  f"machine{machine}'s launcher ended {seconds[machine]:.1f} s after the cut")
            left = cluster.machines[machine].processes()
            check(not left, f"processes left on machine{machine} after its launcher ended: {left}")
    return f"each launcher named the other node and ended, {seconds[0]:.1f} and {seconds[1]:.1f} s after the cut"


def case_link_cut(accel, program, work, length):
    return {"restored": link_cut_restored, "beyond_timeout": link_cut_beyond_timeout}[length](accel, program, work)


FLOOD = """
import socket, sys, threading
def drain(connection):
    while connection.recv(1 << 16):
        pass
server = socket.create_server((sys.argv[1], 5001))
print('listening', flush=True)
threading.Thread(target=lambda: drain(server.accept()[0]), daemon=True).start()
while True:
    try:
        connection = socket.create_connection((sys.argv[2], 5001), timeout=1)
        break
    except OSError:
        pass
connection.settimeout(None)
zeros = bytes(1 << 16)
while True:
    connection.sendall(zeros)"""

SLOW_RATE = 2_000_000  # bits per second, each link, each way
TIGHT_HEARTBEAT = ["--heartbeat_timeout", "2", "--heartbeat_interval", "0.5"]


def case_slow_link(accel, program, work):
    """Links limited to 2 Mbit/s (tc tbf) and kept full both ways by bulk TCP traffic between the machines, while 10
    steps train with a tight heartbeat (timeout 2 s): slow (each packet waits up to 100 ms in the full queue, some are
    dropped and sent again), but the job ends with the parameters of the unlimited job byte for byte, and the
    heartbeats, queued behind the bulk traffic, still get through (no node taken for lost)."""
    reference = on_one_machine(accel, program, work, "train")
    disk = os.path.join(work, "disk")
    with machines(2, disk, rate=SLOW_RATE, lifetime=JOB_TIMEOUT + 60) as cluster:
        machine0, machine1 = cluster.machines
        floods = [machine.start([sys.executable, "-c", FLOOD, machine.address, other.address], stdout=subprocess.PIPE,
                                text=True) for machine, other in ((machine0, machine1), (machine1, machine0))]
        for flood in floods:
            check(flood.stdout.readline().strip() == "listening", "a bulk sender did not start")
        time.sleep(1)  # the links full
        before, started = cluster.link_bytes(1), time.monotonic()
        job = Job(cluster, accel, program, ["train", f"{disk}/trained.safetensors"], os.path.join(work, "job.log"),
                  TIGHT_HEARTBEAT)
        seconds = time.monotonic() - started
        crossed = [after - earlier for after, earlier in zip(cluster.link_bytes(1), before)]
        check(all(flood.poll() is None for flood in floods), "a bulk sender stopped during the job")
        check("is lost" not in job.output, f"a launcher took a slow node for lost:\n{job.output}")
        job.check_every_rank("training on 2 Mbit/s links kept full", "trained")
        with open(machine0.path(f"{disk}/trained.safetensors"), "rb") as f:
            trained = f.read()
    check(trained == reference, "the parameters trained over the slow links differ from those of the unlimited job")
    # Full: each way at least 3/4 of the rate for the whole job.
    check(min(crossed) >= 0.75 * SLOW_RATE / 8 * seconds,
          f"machine1's link carried {crossed} bytes in {seconds:.1f} s: not kept full at {SLOW_RATE} bit/s")
    return (f"{seconds:.1f} s on links kept full ({crossed[0] * 8 / seconds / 1e6:.2f} and "
            f"{crossed[1] * 8 / seconds / 1e6:.2f} Mbit/s), parameters equal to the unlimited job's, no false alarm")


# ------------------------------------------------------------------------------------------------------------------
# Restarts agreed across the machines (--max_restarts with --nnodes 2): `node_checkpoint restarts`, whose process 3
# (machine1's second) kills itself after step 5 in the attempts below its last argument.

RESTART_FLAGS = ["--restart_delay", "0", *SHORT_HEARTBEAT]


def restart_job(cluster, accel, program, work, failing_attempts, max_restarts):
    """The restarts job on the cluster, its project and its parameters on each machine's disk."""
    disk = cluster.disk
    return RunningJob(cluster, accel, program, ["restarts", f"{disk}/project", f"{disk}/trained.safetensors",
                                                str(failing_attempts)], os.path.join(work, "job.log"),
                      [*RESTART_FLAGS, "--max_restarts", str(max_restarts)])


def check_named_failure(outputs, verdict):
    """Both launchers print the same line naming process 3's death and `verdict`; returns the failure named."""
    prefix = "accel launch: on node 1, worker rank 3 (pid "
    named = [[line for line in output.splitlines() if line.startswith(prefix) and line.endswith(verdict)]
             for output in outputs]
    check(len(named[0]) == 1 and named[0] == named[1],
          f"the launchers named {named}, expected process 3's death before {verdict!r}:\n{outputs[0]}{outputs[1]}")
    failure = named[0][0][len("accel launch: "):-len(verdict)]
    check(failure.endswith(") was killed by signal 9 (Killed)"), f"the failure named: {failure}")
    return failure


def restart_worker_fails(accel, program, work):
    """Process 3 kills itself after step 5 of attempt 0 (checkpoints at steps 2 and 4 on each machine's disk): both
    launchers stop their workers, start attempt 1 together, the job resumes from checkpoint_1 on every process and
    ends with the parameters of the uninterrupted job (1 machine x 4 processes) byte for byte."""
    reference = os.path.join(work, "one_machine.safetensors")
    one_machine = subprocess.run([accel, "launch", "--nproc_per_node", "4", "--master_port", "0", program, "restarts",
                                  os.path.join(work, "one_machine"), reference, "0"], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, env=job_environment(), timeout=JOB_TIMEOUT)
    check(one_machine.returncode == 0, f"the uninterrupted job failed:\n{one_machine.stdout}")
    with machines(2, os.path.join(work, "disk"), lifetime=JOB_TIMEOUT + 60) as cluster:
        job = restart_job(cluster, accel, program, work, 1, 2)
        job.wait_for_line(1, "node_checkpoint: rank 3 attempt 0 kills itself after step 5", JOB_TIMEOUT - 30)
        killed = time.monotonic()
        job.wait_for_line(0, "node_checkpoint: rank 0 attempt 1 started at step 4 from checkpoint_1", 60)
        restarted = time.monotonic() - killed
        codes, _ = wait_all(job, JOB_TIMEOUT - 30)
        outputs = [job.output(machine) for machine in (0, 1)]
        check(codes == [0, 0], f"the launchers exited with {codes}:\n{outputs[0]}{outputs[1]}")
        failure = check_named_failure(outputs, "; restarting the job on every node (restart 1 of 2)")
        for machine, output in enumerate(outputs):
            check("giving up" not in output and "is lost" not in output, f"machine{machine}:\n{output}")
            for rank in (2 * machine, 2 * machine + 1):
                for started in ("attempt 0 started at step 0 from nothing",
                                "attempt 1 started at step 4 from checkpoint_1"):
                    check(f"node_checkpoint: rank {rank} {started}\n" in output,
                          f"rank {rank} did not say {started!r}:\n{output}")
        with open(cluster.machines[0].path(f"{cluster.disk}/trained.safetensors"), "rb") as f:
            trained = f.read()
    with open(reference, "rb") as f:
        check(trained == f.read(), "the parameters after the restart differ from those of the uninterrupted job")
    return (f"both machines restarted together ({failure}); attempt 1 resumed from checkpoint_1 {restarted:.1f} s "
            f"after the kill, parameters equal to the uninterrupted job's")


def restart_exhausted(accel, program, work):
    """Process 3 kills itself in every attempt, with --max_restarts 1: after attempt 2 both launchers exit with 137
    (the killed worker's code), each naming machine1's node, rank 3 and the attempts, within seconds of the kill, and
    nothing is left on either machine."""
    with machines(2, os.path.join(work, "disk"), lifetime=JOB_TIMEOUT + 60) as cluster:
        job = restart_job(cluster, accel, program, work, 100, 1)
        job.wait_for_line(1, "node_checkpoint: rank 3 attempt 1 kills itself after step 5", JOB_TIMEOUT - 30)
        codes, took = wait_all(job, 30)
        outputs = [job.output(machine) for machine in (0, 1)]
        failure = check_named_failure(outputs, "; giving up after 1 restart: attempt 2 of 2 failed on every node")
        check(codes == [137, 137], f"the launchers exited with {codes}, not the code of {failure}")
        for machine, output in enumerate(outputs):
            check(output.count("restarting the job on every node") == 1, f"machine{machine}: not one restart")
            # The others stop at once (their collectives fail) or after the 3 s grace period.
            check(took[machine] < 10, f"machine{machine}'s launcher ended {took[machine]:.1f} s after the last kill")
            left = cluster.machines[machine].processes()
            check(not left, f"processes left on machine{machine}: {left}")
    return f"both launchers gave up naming {failure}, {took[0]:.1f} and {took[1]:.1f} s after the last kill"


def case_restart(accel, program, work, which):
    return {"worker_fails": restart_worker_fails, "exhausted": restart_exhausted}[which](accel, program, work)


# ------------------------------------------------------------------------------------------------------------------
# Elastic membership (--nnodes 1:2 with a c10d rendezvous at machine0's address): `node_checkpoint elastic`.

RDZV_PORT = 29400


class ElasticJob(RunningJob):
    """`node_checkpoint elastic PROJECT FILE` on every machine, one elastic `accel launch` each (no node rank given:
    the rendezvous at machine0 numbers them)."""

    def __init__(self, cluster, accel, program, log, max_restarts=1, project=None, more=()):
        disk = cluster.disk
        self.lines, self.log, self.lock = [[] for _ in cluster.machines], open(log, "w"), threading.Lock()
        self.command = [accel, "launch", "--nnodes", "1:2", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                        f"{cluster.machines[0].address}:{RDZV_PORT}", "--rdzv_id", "elastic-test", "--nproc_per_node",
                        "2", "--max_restarts", str(max_restarts), "--restart_delay", "0", *SHORT_HEARTBEAT, program,
                        "elastic", project or f"{disk}/project", f"{disk}/trained.safetensors", *more]
        self.launchers = [self.start(machine) for machine in cluster.machines]

    def start(self, machine):
        """Starts the job's launcher on `machine` (again, for a machine that came back); returns it."""
        launcher = machine.start(self.command, env=job_environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)
        threading.Thread(target=self._relay, args=(machine, launcher.stdout), daemon=True).start()
        return launcher


def check_equals_resumed_copy(accel, program, work, project, trained_file, processes, step, checkpoint):
    """The parameters the elastic job wrote to `trained_file` equal byte for byte those of a job of `processes` on
    the host resumed from a copy of `project`'s `checkpoint` (taken while the cluster still runs)."""
    shutil.copytree(os.path.join(project, "checkpoints", checkpoint),
                    os.path.join(work, "reference", "checkpoints", checkpoint))
    with open(trained_file, "rb") as f:
        trained = f.read()
    reference = os.path.join(work, "reference.safetensors")
    again = subprocess.run([accel, "launch", "--nproc_per_node", str(processes), "--master_port", "0", program,
                            "elastic", os.path.join(work, "reference"), reference], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env=job_environment(), timeout=JOB_TIMEOUT)
    check(again.returncode == 0 and f"world {processes} started at step {step} from {checkpoint}" in again.stdout,
          f"the {processes}-process job resumed from a copy of {checkpoint} failed:\n{again.stdout}")
    with open(reference, "rb") as f:
        check(trained == f.read(), f"the elastic job's parameters differ from those of a {processes}-process job "
                                   f"resumed from {checkpoint}")


def elastic_machine_lost(accel, program, work):
    """2 machines x 2 processes (--nnodes 1:2) train with a checkpoint every 2 steps on each disk; at step 10 machine1
    vanishes. machine0's launcher names it within the heartbeat timeout (6 s), and the job goes on on machine0 alone,
    as a job of 2 processes (WORLD_SIZE 2, ranks 0 and 1), resumed from the newest checkpoint complete on its disk,
    to step 30, ending with 0. Its parameters equal byte for byte those of a 2-process job resumed from a copy of
    that checkpoint (loading a checkpoint of 4 processes under 2 converts the data positions so that each sample of
    the epoch is seen once: dist.gloo.P*.resume_elsewhere)."""
    disk = os.path.join(work, "disk")
    with machines(2, disk, lifetime=JOB_TIMEOUT + 60) as cluster:
        job = ElasticJob(cluster, accel, program, os.path.join(work, "job.log"))
        for machine in (0, 1):
            job.wait_for_line(machine, f"node_checkpoint: rank {2 * machine} step 10", JOB_TIMEOUT - 30)
        cluster.vanish(1)
        lost = time.monotonic()
        check(wait_until(lambda: " attempt 1 world 2 started at step " in job.output(0), JOB_TIMEOUT - 30),
              f"the job did not go on without machine1:\n{job.output(0)}")
        resumed = time.monotonic() - lost
        job.wait_for_line(0, "node_checkpoint: rank 0 step 30", JOB_TIMEOUT - 30)
        codes, _ = wait_all(job, 30)
        output = job.output(0)
        check(codes[0] == 0, f"machine0's launcher exited with {codes[0]}:\n{output}")
        for part in ("accel launch: the job starts on 2 nodes (rendezvous 'elastic-test')",
                     f"accel launch: node 1 (ranks 2, 3, at {cluster.machines[1].address}) is lost: its launcher has "
                     f"not been heard for ", "; restarting the job on every node (restart 1 of 1) on 1 node"):
            check(part in output, f"machine0's launcher did not say {part!r}:\n{output}")
        starts = [line.split(" started at step ", 1)[1].strip() for line in output.splitlines()
                  if line.startswith("node_checkpoint: rank ") and " attempt 1 world 2 " in line]
        check(len(starts) == 2 and starts[0] == starts[1] and " from checkpoint_" in starts[0],
              f"ranks 0 and 1 of attempt 1 (a world of 2) started at {starts}:\n{output}")
        step, checkpoint = starts[0].split(" from ")
        check_equals_resumed_copy(accel, program, work, cluster.machines[0].path(f"{disk}/project"),
                                  cluster.machines[0].path(f"{disk}/trained.safetensors"), 2, step, checkpoint)
    return (f"machine1 lost at step 10; the job went on as 2 processes from {checkpoint} (step {step}), "
            f"{resumed:.1f} s after the loss, equal to a 2-process job resumed from it")


def attempt_starts(output, attempt, world):
    """What the processes of `attempt` said about their start: {rank: "STEP from CHECKPOINT"}."""
    marker = f" attempt {attempt} world {world} started at step "
    return {int(line.split()[2]): line.split(marker, 1)[1].strip() for line in output.splitlines()
            if line.startswith("node_checkpoint: rank ") and marker in line}


def elastic_rejoin(accel, program, work):
    """As machine_lost, with the checkpoints on a disk both machines see (the host's, as a network file system; the
    main process saves them), then machine1 comes back (its link restored, its launcher started again) and joins while
    the job goes on without it; at the next restart (process 1 kills itself after step 20 of attempt 1) it is
    admitted: attempt 2 runs on both machines as 4 processes, from the newest checkpoint (one of attempt 1, saved by
    2 processes), and ends with the parameters of a 4-process job resumed from a copy of it, both launchers exiting
    with 0."""
    disk = os.path.join(work, "disk")
    project = os.path.join(work, "shared-project")
    with machines(2, disk, lifetime=JOB_TIMEOUT + 60) as cluster:
        job = ElasticJob(cluster, accel, program, os.path.join(work, "job.log"), max_restarts=2, project=project,
                         more=["1", "shared"])
        for machine in (0, 1):
            job.wait_for_line(machine, f"node_checkpoint: rank {2 * machine} step 10", JOB_TIMEOUT - 30)
        cluster.vanish(1)
        check(wait_until(lambda: attempt_starts(job.output(0), 1, 2), JOB_TIMEOUT - 30),
              f"the job did not go on without machine1:\n{job.output(0)}")
        cluster.set_link(1, up=True)
        with job.lock:
            job.lines[1].clear()
        returned = job.start(cluster.machines[1])
        check(wait_until(lambda: returned.poll() is not None or len(attempt_starts(job.output(0), 2, 4)) == 2,
                         JOB_TIMEOUT - 30), f"machine1 was not admitted:\n{job.output(0)}{job.output(1)}")
        codes = [job.launchers[0].wait(JOB_TIMEOUT - 30), returned.wait(JOB_TIMEOUT - 30)]
        time.sleep(0.5)  # their last lines
        outputs = [job.output(0), job.output(1)]
        check(codes == [0, 0], f"the launchers exited with {codes}:\n{outputs[0]}{outputs[1]}")
        check("; restarting the job on every node (restart 2 of 2) on 2 nodes" in outputs[0],
              f"machine0 did not restart on 2 nodes:\n{outputs[0]}")
        starts = {**attempt_starts(outputs[0], 2, 4), **attempt_starts(outputs[1], 2, 4)}
        check(sorted(starts) == [0, 1, 2, 3] and len(set(starts.values())) == 1,
              f"attempt 2's processes started at {starts}:\n{outputs[0]}{outputs[1]}")
        step, checkpoint = starts[0].split(" from ")
        check(int(step) > 10, f"attempt 2 resumed from {checkpoint} (step {step}), not from one of attempt 1")
        check_equals_resumed_copy(accel, program, work, project,
                                  cluster.machines[0].path(f"{disk}/trained.safetensors"), 4, step, checkpoint)
    return f"machine1 came back and was admitted at the next restart: 4 processes from {checkpoint} (step {step})"


def case_elastic(accel, program, work, which):
    return {"machine_lost": elastic_machine_lost, "rejoin": elastic_rejoin}[which](accel, program, work)
SHARDED_FILES = {"accel_checksums.txt", "accel_state.bin", "shard_layout.bin", "optimizer.bin", "scheduler.bin"} | {
    f"{kind}_shard_{rank}.safetensors" for kind in ("model", "optimizer") for rank in range(4)} | random_states(0, 1, 2, 3)


def safetensors_tensors(path):
    """{name: (dtype, shape, raw bytes)} of a safetensors file, read with the standard library."""
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        header, data = json.loads(f.read(length)), f.read()
    return {name: (entry["dtype"], entry["shape"], data[entry["data_offsets"][0]:entry["data_offsets"][1]])
            for name, entry in header.items() if name != "__metadata__"}


def one_machine_job(accel, program, processes, args):
    """`node_checkpoint ARGS` on 1 machine x `processes` (the host): its per-rank lines, failing the check on failure."""
    job = subprocess.run([accel, "launch", "--nproc_per_node", str(processes), "--master_port", "0", program, *args],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=job_environment(),
                         timeout=JOB_TIMEOUT)
    check(job.returncode == 0, f"{' '.join(args)} on 1 machine x {processes} failed:\n{job.stdout}")
    return job.stdout


def sharded_unshared_disk(accel, program, work):
    """The sharded format on disks the machines do not share: every process writes its own shards into one directory,
    which no machine's disk can hold whole, so the save is refused on every process before anything is written,
    with save_on_each_node and without, each naming the fix; the full format with save_on_each_node is the way
    (cluster.save_on_each_node.fully_sharded)."""
    disk = os.path.join(work, "disk")
    refusals = {
        "without save_on_each_node": ([], ["does not see ", ".partial, which process 0 made: in the sharded format "
                                           "every process writes its shard files into the checkpoint, so its "
                                           "directory must be on a file system every process sees"]),
        "with save_on_each_node": (["on_each_node"], ["save_on_each_node writes a whole checkpoint on each machine",
                                                       "use state_dict_type::full with save_on_each_node, or a file "
                                                       "system every machine sees"]),
    }
    with machines(2, disk, lifetime=2 * JOB_TIMEOUT + 60) as cluster:
        for index, (how, (flags, parts)) in enumerate(refusals.items()):
            ckpt = f"{disk}/ckpt{index}"
            job = Job(cluster, accel, program, ["fully_sharded", "save", ckpt, *flags, "sharded"],
                      os.path.join(work, f"save{index}.log"))
            check(job.codes != [0, 0], f"{how}: the sharded save on unshared disks was not refused:\n{job.output}")
            # Without save_on_each_node only the processes that do not see process 0's staging directory know why;
            # they tell the others, so every process names the fix.
            for rank in range(4):
                got = job.lines.get(rank, "")
                check(got.startswith("save failed: accel::save_state: ") and all(part in got for part in parts),
                      f"{how}: rank {rank} printed {got!r}, expected the refusal naming {parts}:\n{job.output}")
            for machine in cluster.machines:
                left = sorted(name for name in files_on(machine, disk) if name.startswith(f"ckpt{index}"))
                check(not left, f"{how}: {machine.name}'s disk holds {left} of a refused checkpoint")
    return "refused on every process, with save_on_each_node and without, nothing written"


def sharded_shared_disk(accel, program, work, policy):
    """`policy` on 2 machines x 2 processes saving in the sharded format into a directory every machine sees (the
    host's file system, as a network file system): each process writes its own shard files; the job resumes from it
    bit for bit on the 2 machines. Copied into a directory of one machine, as a user moves a checkpoint, it resumes
    bit for bit on 1 machine x 4 processes, and loads on 1 machine x 2 with the parameters that were saved."""
    shared = os.path.join(work, "shared")
    os.makedirs(shared)
    ckpt = os.path.join(shared, "ckpt")
    with machines(2, os.path.join(work, "disk"), lifetime=2 * JOB_TIMEOUT + 60) as cluster:
        saved = Job(cluster, accel, program, [policy, "save", ckpt, "sharded"], os.path.join(work, "save.log"))
        saved.check_every_rank(f"{policy}: sharded save on a shared disk", "saved")
        check(set(os.listdir(ckpt)) == SHARDED_FILES, f"the sharded checkpoint holds {sorted(os.listdir(ckpt))}")
        resumed = Job(cluster, accel, program, [policy, "resume", ckpt, "sharded"], os.path.join(work, "resume.log"))
        resumed.check_every_rank(f"{policy}: resume on 2 machines x 2", "resumed bit for bit")
    moved = os.path.join(work, "one_machine", "ckpt")
    shutil.copytree(ckpt, moved)
    output = one_machine_job(accel, program, 4, [policy, "resume", moved, "sharded"])
    check(all(f"node_checkpoint: rank {rank} resumed bit for bit" in output for rank in range(4)),
          f"{policy}: resuming on 1 machine x 4:\n{output}")
    # Loaded under 4 processes (each reading back its own shards, the load the resume above showed right) and under
    # 2 (each assembling the parameters from 4 processes' shards): the same parameters, byte for byte.
    loaded = {}
    for processes in (4, 2):
        loaded[processes] = os.path.join(work, f"loaded_by_{processes}.safetensors")
        one_machine_job(accel, program, processes, [policy, "loaded", moved, loaded[processes]])
    got, expected = safetensors_tensors(loaded[2]), safetensors_tensors(loaded[4])
    check(got and got == expected, f"{policy}: the parameters loaded on 1 machine x 2 differ from those loaded on "
                                   f"1 machine x 4: {sorted(got)} against {sorted(expected)}")
    return (f"{len(SHARDED_FILES)} files from 4 processes on 2 machines; resumed bit for bit on 2 x 2 and 1 x 4, "
            f"loaded on 1 x 2 with the {len(got)} saved tensors")


def case_sharded_format(accel, program, work, what):
    if what == "unshared_disk":
        return sharded_unshared_disk(accel, program, work)
    return sharded_shared_disk(accel, program, work, what)


def main():
    if len(sys.argv) not in (5, 6):
        sys.exit(__doc__)
    accel, program, work = command_line_paths()
    case = globals().get(f"case_{sys.argv[4]}")
    if case is None:
        sys.exit(f"no case {sys.argv[4]!r}")
    arguments = sys.argv[5:]
    started = time.monotonic()
    try:
        harness.check_host(rate=True)
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        print(f"{' '.join(sys.argv[4:])}: {case(accel, program, work, *arguments)} "
              f"({time.monotonic() - started:.1f} s)", flush=True)
    except harness.ClusterUnavailable as e:
        print(f"SKIPPED: {e}", flush=True)
        sys.exit(harness.SKIP)
    except CheckFailed as e:
        print(f"FAILED: {e}\nlogs: {work}", flush=True)
        sys.exit(1)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
