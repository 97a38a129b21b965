"""accel's MLflow tracker against a real MLflow tracking server, read back with MLflow's own client.

Modes (one CTest test each, interop.mlflow.*):
  readback  `mlflow server` from .venv on 127.0.0.1 (a free port, its SQLite store in WORK_DIR); the program
            (tests/programs/mlflow_training.cpp) logs into it through options::log_with; MlflowClient then reads back the
            experiment, the run's name, tags and status FINISHED, every param and every metric (step and value).
  refused   nothing listens on the port: the program's training completes in bounded time, each log call returns
            promptly, and the outage is one warning.
  hanging   a socket accepts connections and never answers: the same bounds.
  errors    a stand-in server (http.server) answers 503 to the first 4 requests, then as MLflow's REST API does:
            every request is retried until it goes through, each metric arrives once, the outage is one warning.
  outage    the server is stopped after step 9 and started again (same store, same port) after step 19: every
            metric, those logged while it was down included, reaches it.
  slow      a stand-in server that takes 0.5 s to answer each request: with the tracker's defaults (options::log_with,
            no bounds given) every metric arrives and the run ends FINISHED, however long end_training waits; then,
            answering in 3 s with MLFLOW_HTTP_REQUEST_TIMEOUT=1 and MLFLOW_HTTP_REQUEST_MAX_RETRIES=1, end_training
            gives up within seconds, saying in one line what was not sent.

Usage: check_mlflow.py MODE MLFLOW_TRAINING WORK_DIR   (with the build's .venv Python, which has mlflow)
"""
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PYTHON_BIN = os.path.dirname(sys.executable)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`mlflow server` on 127.0.0.1:port, its store in work_dir; start() waits for /health."""

    def __init__(self, work_dir, port):
        self.work_dir, self.port, self.process = work_dir, port, None
        self.uri = f"http://127.0.0.1:{port}"

    def start(self):
        started = time.time()
        log = open(os.path.join(self.work_dir, "server.log"), "ab")
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no job runner: it is not used here
        self.process = subprocess.Popen(
            [os.path.join(PYTHON_BIN, "mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.port),
             "--workers", "1", "--backend-store-uri", f"sqlite:///{self.work_dir}/mlflow.db",
             "--default-artifact-root", f"{self.work_dir}/artifacts"],
            stdout=log, stderr=log, env=env, start_new_session=True)
        while True:
            if self.process.poll() is not None:
                sys.exit(f"mlflow server exited with {self.process.returncode}; see {self.work_dir}/server.log")
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=1) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        print(f"mlflow server up in {time.time() - started:.1f} s", flush=True)

    def stop(self):
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, 9)  # its own session: uvicorn's workers too
            self.process.wait()


def run_program(program, mode, work_dir, env):
    env = {**os.environ, **env}
    return subprocess.run([program, mode, work_dir], env=env, capture_output=True, text=True, timeout=120)


def check(condition, message):
    if not condition:
        sys.exit(message)


def readback(program, work_dir):
    from mlflow.tracking import MlflowClient

    server = Server(work_dir, free_port())
    server.start()
    try:
        env = {"MLFLOW_TRACKING_URI": server.uri, "MLFLOW_EXPERIMENT_NAME": "accel-interop",
               "MLFLOW_RUN_NAME": "first-run", "MLFLOW_TAGS": json.dumps({"team": "vision", "trial": 3})}
        result = run_program(program, "readback", work_dir, env)
        check(result.returncode == 0, f"the case failed:\n{result.stdout}\n{result.stderr}")
        warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING:accel.tracking")]
        check(len(warnings) == 1 and "too_long" in warnings[0], f"expected one warning about too_long: {warnings}")
        client = MlflowClient(server.uri)
        experiment = client.get_experiment_by_name("accel-interop")
        check(experiment is not None, "no experiment accel-interop (MLFLOW_EXPERIMENT_NAME over the project name)")
        runs = client.search_runs([experiment.experiment_id])
        check(len(runs) == 1, f"{len(runs)} runs, expected 1")
        check_run(client, runs[0])
    finally:
        server.stop()


def check_run(client, run):
    check(run.info.run_name == "first-run", f"run name {run.info.run_name}")
    check(run.info.status == "FINISHED", f"status {run.info.status}")
    check(run.data.tags.get("team") == "vision" and run.data.tags.get("trial") == "3", f"tags {run.data.tags}")
    expected = {"lr": "0.001", "batch_size": "32", "optimizer": "adamw", "shuffle": "True",
                "weight_decay": "1e-05", "epochs": "3.0", "big": "1e+16", "fits": "x" * 6000}
    expected.update({f"p{i}": str(i * 7) for i in range(120)})
    check(run.data.params == expected, f"params differ: {set(run.data.params.items()) ^ set(expected.items())}")
    wanted = {"loss": [(s, 1.0 / (s + 1)) for s in range(50)] + [(100, 0.125)],
              "lr": [(s, 0.001 * s) for s in range(50)],
              "train/accuracy": [(100, 0.875)], "count": [(100, 42.0)], "tiny": [(100, 2.5e-300)],
              "third": [(100, 1.0 / 3)]}
    count = 0
    for key, points in wanted.items():
        got = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        check(got == points, f"{key}: {got}, expected {points}")
        count += len(got)
    check(set(run.data.metrics) == set(wanted), f"metrics {sorted(run.data.metrics)}")
    print(f"MlflowClient read back {len(expected)} params, {count} metric points in {len(wanted)} keys, "
          f"the run's name, tags and status FINISHED")


def failure(program, work_dir, port, what):
    started = time.time()
    env = {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}", "ACCEL_MLFLOW_FINISH_MS": "2000"}
    result = run_program(program, "failing", work_dir, env)
    took = time.time() - started
    check(result.returncode == 0, f"training failed:\n{result.stdout}\n{result.stderr}")
    times = json.loads(result.stdout.strip().splitlines()[-1])
    warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING:accel.tracking")]
    outage = [line for line in warnings if "is not answering" in line]
    gave_up = [line for line in warnings if "MLflow: gave up" in line and "not sent" in line]
    check(len(outage) == 1, f"expected the outage once among the warnings, got: {warnings}")
    check(len(gave_up) == 1 and len(warnings) == 2, f"expected one line on what was given up, got: {warnings}")
    check(times["slowest_log"] < 0.05, f"a log call took {times['slowest_log']} s")
    check(times["end_training"] < 3.5, f"end_training took {times['end_training']} s (bound: 2 s)")
    print(f"{what}: training completed in {took:.2f} s, slowest log call {times['slowest_log'] * 1000:.2f} ms, "
          f"end_training {times['end_training']:.2f} s, warnings: {outage[0]!r} and {gave_up[0]!r}")


def refused(program, work_dir):
    failure(program, work_dir, free_port(), "connection refused")


def hanging(program, work_dir):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held = []

    def accept_and_hold():  # reads nothing, answers nothing
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept_and_hold, daemon=True).start()
    failure(program, work_dir, listener.getsockname()[1], "a server that never answers")
    check(len(held) >= 1, "the tracker never connected")
    listener.close()


class FlakyMlflow(BaseHTTPRequestHandler):
    """MLflow's REST API for one run, in memory, after answering 503 to the first `failures` requests, each answer
    `delay` seconds late."""
    failures, received, lock, delay = 4, [], threading.Lock(), 0.0

    def answer(self, status, body):
        time.sleep(self.delay)
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        server = type(self)  # this class or a subclass's own counters (SlowMlflow)
        with server.lock:
            server.failures -= 1
            if server.failures >= 0:
                return self.answer(503, {"error_code": "TEMPORARILY_UNAVAILABLE"})
        self.answer(404, {"error_code": "RESOURCE_DOES_NOT_EXIST"})  # get-by-name: no such experiment yet

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server = type(self)
        with server.lock:
            server.failures -= 1
            if server.failures >= 0:
                return self.answer(503, {"error_code": "TEMPORARILY_UNAVAILABLE"})
            server.received.append((self.path, body))
        replies = {"/api/2.0/mlflow/experiments/create": {"experiment_id": "7"},
                   "/api/2.0/mlflow/runs/create": {"run": {"info": {"run_id": "r1", "experiment_id": "7"}}}}
        self.answer(200, replies.get(self.path, {}))

    def log_message(self, *args):
        pass


def errors(program, work_dir):
    server = ThreadingHTTPServer(("127.0.0.1", 0), FlakyMlflow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{server.server_address[1]}", "ACCEL_MLFLOW_FINISH_MS": "10000"}
    result = run_program(program, "failing", work_dir, env)
    server.shutdown()
    check(result.returncode == 0, f"training failed:\n{result.stdout}\n{result.stderr}")
    warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING:accel.tracking")]
    check(len(warnings) == 1 and "is not answering (HTTP 503" in warnings[0], f"expected one warning: {warnings}")
    paths = [path.rsplit("/", 2)[-2] + "/" + path.rsplit("/", 1)[-1] for path, _ in FlakyMlflow.received]
    check(paths[:2] == ["experiments/create", "runs/create"] and paths[-1] == "runs/update", f"requests {paths}")
    batches = [body for path, body in FlakyMlflow.received if path.endswith("log-batch")]
    check(batches[0]["params"] == [{"key": "lr", "value": "0.1"}], f"params {batches[0]}")
    points = [(m["step"], m["value"]) for body in batches[1:] for m in body["metrics"]]
    check(points == [(s, 1.0 / (s + 1)) for s in range(20)], f"metrics {points}")
    check(FlakyMlflow.received[-1][1]["status"] == "FINISHED", "the run was not ended FINISHED")
    print(f"after 4 answers of 503: {len(FlakyMlflow.received)} requests, each once and in order, 20 metric points; "
          f"warning: {warnings[0]!r}")


class SlowMlflow(FlakyMlflow):
    failures, received, lock, delay = 0, [], threading.Lock(), 0.5


def slow(program, work_dir):
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowMlflow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    result = run_program(program, "slow", work_dir, {"MLFLOW_TRACKING_URI": uri})
    check(result.returncode == 0, f"training failed:\n{result.stdout}\n{result.stderr}")
    warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING:accel.tracking")]
    check(not warnings, f"a slow server is no failure: {warnings}")
    batches = [body for path, body in SlowMlflow.received if path.endswith("log-batch")]
    points = [(m["step"], m["value"]) for body in batches for m in body.get("metrics", [])]
    check(points == [(s, 1.0 / (s + 1)) for s in range(30)], f"metrics {points}")
    check(SlowMlflow.received[-1][1].get("status") == "FINISHED", "the run was not ended FINISHED")
    took = json.loads(result.stdout.strip().splitlines()[-1])["end_training"]
    print(f"a server answering in 0.5 s: {len(SlowMlflow.received)} requests, all 30 metric points, FINISHED; "
          f"end_training waited {took:.1f} s")

    SlowMlflow.delay = 3.0
    env = {"MLFLOW_TRACKING_URI": uri, "MLFLOW_HTTP_REQUEST_TIMEOUT": "1", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1"}
    result = run_program(program, "slow", work_dir, env)
    server.shutdown()
    check(result.returncode == 0, f"training failed:\n{result.stdout}\n{result.stderr}")
    took = json.loads(result.stdout.strip().splitlines()[-1])["end_training"]
    warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING:accel.tracking")]
    gave_up = [line for line in warnings if "MLflow: gave up" in line]
    check(len(gave_up) == 1 and "1 retries" in gave_up[0] and "30 metric values (steps 0 to 29)" in gave_up[0]
          and "final status" in gave_up[0], f"expected one line on what was not sent: {warnings}")
    check(took < 10, f"end_training took {took} s with 1 s a request and 1 retry")
    print(f"answering in 3 s, MLFLOW_HTTP_REQUEST_TIMEOUT=1 and _MAX_RETRIES=1: end_training gave up in {took:.1f} s: "
          f"{gave_up[0]!r}")


def outage(program, work_dir):
    from mlflow.tracking import MlflowClient

    server = Server(work_dir, free_port())
    server.start()
    env = {**os.environ, "MLFLOW_TRACKING_URI": server.uri, "ACCEL_MLFLOW_FINISH_MS": "60000"}
    case = subprocess.Popen([program, "outage", work_dir], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        check(case.stdout.readline().strip() == "down?", "the case did not reach step 10")
        time.sleep(0.5)  # steps 0-9 reach the server (or wait in the queue: either way they must arrive)
        server.stop()
        case.stdin.write("\n")
        case.stdin.flush()
        check(case.stdout.readline().strip() == "up?", "the case did not reach step 20")
        time.sleep(0.5)  # retries meet a closed port
        server.start()
        case.stdin.write("\n")
        case.stdin.flush()
        out, err = case.communicate(timeout=90)
        check(case.returncode == 0, f"the case failed:\n{out}\n{err}")
        run_id = out.strip().splitlines()[-1].split()[-1]
        client = MlflowClient(server.uri)
        got = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "loss"))
        check(got == [(s, 1.0 / (s + 1)) for s in range(30)], f"loss history {got}")
        check(client.get_run(run_id).info.status == "FINISHED", "the run is not FINISHED")
        print(f"all 30 steps arrived, 10-19 logged while the server was down; warnings: {err.strip()!r}")
    finally:
        case.kill()
        server.stop()


def main():
    mode, program, work_dir = sys.argv[1], sys.argv[2], os.path.abspath(sys.argv[3])
    shutil.rmtree(work_dir, ignore_errors=True)
    os.makedirs(work_dir)
    modes = {"readback": readback, "refused": refused, "hanging": hanging, "errors": errors, "outage": outage,
             "slow": slow}
    modes[mode](program, work_dir)


if __name__ == "__main__":
    main()
