"""What the test drivers under tests/scripts share: a failed check, and the environment of a job they launch."""
import os


class CheckFailed(Exception):
    pass


def check(condition, message):
    if not condition:
        raise CheckFailed(message)


def job_environment():
    """This process's environment for an `accel launch` job: without the ACCELERATE_* settings a developer's shell may
    carry, one thread per process (deterministic) and no config file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    env.update(OMP_NUM_THREADS="1", ACCEL_CONFIG_FILE="")
    return env
