#!/usr/bin/env python3
"""A cluster of a few "machines" on one Linux host, for the cluster.* tests and for rehearsing a multi-node job.

usage: cluster.py [--machines N] [--rate RATE] [--timeout SECONDS] [--disk DIR] -- COMMAND [ARG...]

Runs COMMAND once on each machine, all at once, with {node_rank}, {nnodes}, {master_addr} and {disk} in its
arguments replaced by the machine's values, prints each machine's output prefixed with its name, and exits with 0
when every machine's command did, else with the first failure's status (124 when the time ran out; 77, having said
why, where the host cannot make namespaces: not root, no iproute2). For example, two machines of two processes:

  cluster.py --machines 2 -- build/tools/accel launch --nnodes {nnodes} --node_rank {node_rank} \
      --master_addr {master_addr} --master_port 29500 --nproc_per_node 2 ./train --output_dir {disk}/run

Each machine is a network namespace of its own with one interface, eth0, addressed 10.77.0.(index + 1)/24, joined to
the others through a bridge in a namespace of the harness ("the switch"); there is no default route, so nothing
leaves the host, and the host's own interfaces (its loopback included) are out of reach. Each machine has its own
mount namespace, in which a tmpfs of its own is mounted on DIR (the same path on every machine, a disk none of the
others sees) and another on /tmp, and its own host name (machine0, machine1, ...). What the machines run lives on
the host, possibly under /tmp (a fresh clone often is): the host's directories under /tmp that hold the checkout
(this script's), the working directory, this Python and, from the command line, the paths the command names stay
visible at the same paths inside each machine's /tmp (bind mounts of the host's), the rest of it private. With RATE
(bits per second, with k/m/g: "100m"), each link is limited to it in both directions (tc's tbf). Every command gets
GLOO_SOCKET_IFNAME=eth0.

Nothing outlives the harness: the namespaces belong to processes the harness started (none is named in
/run/netns), which the kernel kills when the harness dies (PR_SET_PDEATHSIG, set by setpriv), SIGKILL included;
when it ends, it kills every process still inside a machine. Each process it starts carries ACCEL_CLUSTER=<owner>
in its environment, and a new cluster first kills any process left by an owner that is gone.
Python standard library only; needs root, iproute2 (ip, tc) and util-linux (unshare, nsenter, setpriv).
"""
import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

SKIP = 77  # CTest's SKIP_RETURN_CODE for the cluster tests
INTERFACE = "eth0"
MARKER = "ACCEL_CLUSTER"
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))  # tests/scripts/cluster.py


class ClusterUnavailable(Exception):
    """This host cannot make the cluster (not root, a tool missing, namespaces refused): a reason to skip."""


def start_time(pid):
    """The kernel's start time of process `pid` (with its pid, a name no later process can have), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def marker_of(pid):
    """The ACCEL_CLUSTER value in process `pid`'s environment, or None."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            variables = f.read().split(b"\0")
    except OSError:
        return None
    prefix = MARKER.encode() + b"="
    return next((v[len(prefix):].decode() for v in variables if v.startswith(prefix)), None)


def pids():
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def kill_stale():
    """Kills the processes that clusters whose harness is gone left behind; returns their pids."""
    killed = []
    for pid in pids():
        owner = marker_of(pid)
        if owner is None:
            continue
        owner_pid, _, owner_start = owner.partition(".")
        if start_time(owner_pid) != owner_start:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
    return killed


def parse_rate(text):
    """Bits per second from "100m", "1g", "500k" or a number."""
    units = {"k": 10**3, "m": 10**6, "g": 10**9}
    text = text.strip().lower().removesuffix("bit")
    scale = units.get(text[-1:], 1)
    try:
        value = float(text[:-1] if text[-1:] in units else text) * scale
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"rate '{text}' is not a rate: give bits per second, with k, m or g (e.g. 100m)")
    return int(value)


def check_host(rate):
    """Raises ClusterUnavailable naming what this host lacks."""
    if os.geteuid() != 0:
        raise ClusterUnavailable("the cluster harness makes network and mount namespaces, which needs root")
    tools = ["ip", "unshare", "nsenter", "setpriv"] + (["tc"] if rate else [])
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        raise ClusterUnavailable(f"{', '.join(missing)} not found: install iproute2 and util-linux "
                                 f"(scripts/setup.sh installs them)")


class Machine:
    """One machine of a cluster: its namespaces are those of `holder`, a process that sleeps in them."""

    def __init__(self, cluster, index, holder):
        self.cluster, self.index, self.holder = cluster, index, holder
        self.name = f"machine{index}"
        self.address = f"10.77.0.{index + 1}"

    def enter(self, command):
        """`command`, run inside this machine's namespaces, killed when the harness dies."""
        return ["setpriv", "--pdeathsig", "KILL", "nsenter", "--target", str(self.holder.pid), "--net", "--mount",
                "--uts", "--", *command]

    def start(self, command, cwd=None, env=None, **popen):
        """Starts `command` on this machine (a session of its own) in `cwd` (default: the harness's directory) with
        `env` (default: the harness's), GLOO_SOCKET_IFNAME and the owner marker added."""
        env = dict(os.environ if env is None else env)
        env.update({"GLOO_SOCKET_IFNAME": INTERFACE, MARKER: self.cluster.owner})
        cwd = os.path.abspath(cwd or os.getcwd())
        process = subprocess.Popen(self.enter(["sh", "-c", 'cd "$0" && exec "$@"', cwd, *command]), env=env,
                                   start_new_session=True, **popen)
        self.cluster.processes.append(process)
        return process

    def run(self, command, timeout=30, **popen):
        """Runs `command` on this machine to its end (bounded by `timeout`) and returns its CompletedProcess."""
        process = self.start(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise
        return subprocess.CompletedProcess(process.args, process.returncode, output)

    def processes(self):
        """The pids of the processes on this machine (those in its network namespace), its namespace holder aside."""
        try:
            namespace = os.readlink(f"/proc/{self.holder.pid}/ns/net")
        except OSError:
            return []
        found = []
        for pid in pids():
            try:
                if pid != self.holder.pid and os.readlink(f"/proc/{pid}/ns/net") == namespace:
                    found.append(pid)
            except OSError:
                pass
        return found

    def path(self, path):
        """Where the harness finds `path` of this machine's file system (its disk is hidden from the host)."""
        return f"/proc/{self.holder.pid}/root{os.path.abspath(path)}"


class Cluster:
    """`with Cluster(2, disk) as cluster:` makes the machines; leaving the block removes them and their processes."""

    def __init__(self, machines=2, disk=None, rate=None, lifetime=3600, keep=()):
        """`keep`: host paths the machines' commands need besides the checkout, the working directory and this
        Python (kept_under_tmp)."""
        if not 1 <= machines <= 200:
            raise ValueError(f"{machines} machines: give 1 to 200")
        self.count, self.rate, self.lifetime = machines, rate, lifetime
        self.disk = os.path.abspath(disk) if disk else None
        self.kept = kept_under_tmp([CHECKOUT, os.getcwd(), sys.prefix, os.path.dirname(sys.executable), *keep])
        self.owner = f"{os.getpid()}.{start_time(os.getpid())}"
        self.holders, self.processes, self.machines = [], [], []
        self.switch = None
        self.staging = None  # an empty host directory where each machine builds its /tmp before moving it there

    def __enter__(self):
        check_host(self.rate)
        kill_stale()
        if self.disk:
            os.makedirs(self.disk, exist_ok=True)
        try:
            self.staging = tempfile.mkdtemp(prefix="accel-cluster-tmp-")
            self.switch = self._holder(["unshare", "--net"], "")
            self._on_switch(["ip", "link", "add", "br0", "type", "bridge"])
            self._on_switch(["ip", "link", "set", "br0", "up"])
            for index in range(self.count):
                self.machines.append(self._machine(index))
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _holder(self, unshare, setup):
        """A process sleeping in new namespaces (made by `unshare` after `setup` ran in them), marked as ours."""
        script = f"echo entered && {setup} echo ready && exec sleep {self.lifetime}"
        env = dict(os.environ, **{MARKER: self.owner})
        holder = subprocess.Popen(["setpriv", "--pdeathsig", "KILL", *unshare, "--", "sh", "-c", script], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.holders.append(holder)
        entered = holder.stdout.readline().strip() == "entered"
        if not entered or holder.stdout.readline().strip() != "ready":
            holder.kill()
            _, error = holder.communicate()
            if not entered:  # the host refused the namespaces
                raise ClusterUnavailable(f"cannot make namespaces ({' '.join(unshare)}): {error.strip()}")
            raise RuntimeError(f"cannot set a machine up ({setup}): {error.strip()}")
        return holder

    def _on_switch(self, command):
        run_checked(["nsenter", "--target", str(self.switch.pid), "--net", "--", *command])

    def _private_tmp(self):
        """The shell commands that give a machine a /tmp of its own in which the kept host paths stay visible: a tmpfs
        mounted on the (empty) staging directory, the kept paths bound into it while the host's /tmp is still in
        view, then the whole moved onto /tmp."""
        staging = shlex.quote(self.staging)
        commands = [f"mount -t tmpfs -o size=64m,mode=1777 accel-cluster-tmp {staging}"]
        for path in self.kept:
            inside = shlex.quote(os.path.join(self.staging, os.path.relpath(path, os.path.realpath("/tmp"))))
            commands += [f"mkdir -p {inside}", f"mount --bind {shlex.quote(path)} {inside}"]
        commands.append(f"mount --move {staging} /tmp")
        return " && ".join(commands) + " &&"

    def _machine(self, index):
        mounts = self._private_tmp()
        if self.disk:
            # Made again inside: a disk under /tmp is hidden by the machine's own /tmp.
            disk = shlex.quote(self.disk)
            mounts += f" mkdir -p {disk} && mount -t tmpfs -o size=512m accel-cluster-disk {disk} &&"
        holder = self._holder(["unshare", "--net", "--mount", "--uts", "--propagation", "private"],
                              f"{mounts} hostname machine{index} &&")
        machine = Machine(self, index, holder)
        port = f"m{index}"  # the switch's end of the link
        self._on_switch(["ip", "link", "add", port, "type", "veth", "peer", "name", INTERFACE, "netns",
                         str(holder.pid)])
        self._on_switch(["ip", "link", "set", port, "master", "br0", "up"])
        on_machine = ["nsenter", "--target", str(holder.pid), "--net", "--"]
        run_checked(on_machine + ["ip", "link", "set", "lo", "up"])
        run_checked(on_machine + ["ip", "address", "add", f"{machine.address}/24", "dev", INTERFACE])
        run_checked(on_machine + ["ip", "link", "set", INTERFACE, "up"])
        if self.rate:
            # Both directions: the machine's sending end, and the switch's end toward the machine. The bucket holds
            # 10 ms at the rate (at least 32 KiB, which tbf needs above one packet per timer tick).
            burst = max(32 * 1024, self.rate // 8 // 100)
            tbf = ["tc", "qdisc", "add", "dev", "DEV", "root", "tbf", "rate", str(self.rate), "burst", str(burst),
                   "latency", "100ms"]
            run_checked(on_machine + [INTERFACE if word == "DEV" else word for word in tbf])
            self._on_switch([port if word == "DEV" else word for word in tbf])
        return machine

    def set_link(self, index, up):
        """Cuts machine `index`'s link (up=False: no packet crosses, no connection is closed) or restores it."""
        self._on_switch(["ip", "link", "set", f"m{index}", "up" if up else "down"])

    def vanish(self, index):
        """Machine `index` vanishes as in a power loss: its link is cut first, so that no connection is closed, then
        every process on it is killed (SIGKILL). Its disk stays, for the test to read."""
        self.set_link(index, up=False)
        for pid in self.machines[index].processes():
            kill_quietly(pid)

    def link_bytes(self, index):
        """(bytes machine `index` sent, bytes it received) over its link: the counters of the switch's end."""
        result = run_checked(["nsenter", "--target", str(self.switch.pid), "--net", "--", "ip", "-json", "-statistics",
                              "link", "show", "dev", f"m{index}"])
        stats = json.loads(result.stdout)[0]["stats64"]
        return stats["rx"]["bytes"], stats["tx"]["bytes"]

    def members(self):
        """The pids of every process inside a machine or the switch (those sharing their network namespaces)."""
        namespaces = set()
        for holder in self.holders:
            try:
                namespaces.add(os.readlink(f"/proc/{holder.pid}/ns/net"))
            except OSError:
                pass
        found = []
        for pid in pids():
            try:
                if os.readlink(f"/proc/{pid}/ns/net") in namespaces:
                    found.append(pid)
            except OSError:
                pass
        return found

    def close(self):
        """Kills every process in the machines (the holders last), so that the namespaces and their mounts go."""
        for process in self.processes:
            if process.poll() is None:
                kill_group(process.pid)
        for pid in self.members():
            if pid not in {holder.pid for holder in self.holders}:
                kill_quietly(pid)
        for holder in self.holders:
            kill_quietly(holder.pid)
        for process in self.processes + self.holders:
            try:
                process.communicate(timeout=10)
            except (subprocess.TimeoutExpired, ValueError):
                pass
        self.holders, self.processes = [], []
        if self.staging:
            try:
                os.rmdir(self.staging)  # empty on the host: the machines' mounts on it were theirs alone
            except OSError:
                pass
            self.staging = None


def kept_under_tmp(paths):
    """The host directories under /tmp that must stay visible in the machines (those of `paths`, a file's directory
    for a file), none inside another; paths elsewhere are visible anyway."""
    tmp = os.path.realpath("/tmp")
    found = set()
    for path in paths:
        path = os.path.realpath(path)
        if os.path.isfile(path):
            path = os.path.dirname(path)
        if path.startswith(tmp + os.sep) and os.path.isdir(path):  # /tmp itself: each machine has its own
            found.add(path)
    return sorted(path for path in found if not any(path.startswith(other + os.sep) for other in found))


def kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        kill_quietly(pid)


def kill_quietly(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_checked(command):
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def run_everywhere(cluster, command, timeout, cwd=None, env=None, output=sys.stdout):
    """Runs `command` (placeholders filled in per machine) on every machine at once, each line of output prefixed
    with its machine's name; returns the exit statuses (None for a command the timeout stopped)."""
    values = {"nnodes": cluster.count, "master_addr": cluster.machines[0].address, "disk": cluster.disk or ""}
    lock = threading.Lock()

    def relay(machine, stream):
        for line in stream:
            with lock:
                output.write(f"[{machine.name}] {line}")
                output.flush()

    started, relays = [], []
    for machine in cluster.machines:
        words = [word.format(node_rank=machine.index, **values) for word in command]
        process = machine.start(words, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        started.append(process)
        relays.append(threading.Thread(target=relay, args=(machine, process.stdout), daemon=True))
        relays[-1].start()
    deadline = time.monotonic() + timeout
    codes = []
    for process in started:
        try:
            codes.append(process.wait(max(deadline - time.monotonic(), 0)))
        except subprocess.TimeoutExpired:
            kill_group(process.pid)
            process.wait()
            codes.append(None)
    for thread in relays:
        thread.join(5)
    return codes


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--machines", type=int, default=2, help="how many machines (default 2)")
    parser.add_argument("--rate", type=parse_rate, help="each link's rate in bits per second (k/m/g), both ways")
    parser.add_argument("--timeout", type=float, default=600, help="seconds before the commands are killed")
    parser.add_argument("--disk", help="where each machine's own disk is mounted (default: a new temporary path)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...], run on every machine")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run on every machine after --")
    disk = args.disk or tempfile.mkdtemp(prefix="accel-cluster-disk-")
    try:
        named = [word for word in command if os.path.exists(word)]  # the program, its files: on the host
        with Cluster(args.machines, disk, args.rate, lifetime=int(args.timeout) + 60, keep=named) as cluster:
            codes = run_everywhere(cluster, command, args.timeout)
    except ClusterUnavailable as e:
        print(f"cluster.py: SKIPPED: {e}", flush=True)
        sys.exit(SKIP)
    finally:
        if not args.disk:
            shutil.rmtree(disk, ignore_errors=True)
    for machine, code in enumerate(codes):
        if code is None:
            print(f"cluster.py: machine{machine}'s command did not end within {args.timeout:g} s: killed")
    failed = [code for code in codes if code != 0]
    sys.exit(0 if not failed else 124 if failed[0] is None else failed[0] if failed[0] > 0 else 128 - failed[0])


if __name__ == "__main__":
    main()
