"""cp.memory.flat: ring attention's activation bytes per process, measured by cp.memory.P1, .P2 and .P4 (1,024 tokens
per process: the sequence grows with cp), are within 10% of one another.

    check_cp_memory.py DIR
"""
import pathlib
import sys


def main():
    directory = pathlib.Path(sys.argv[1])
    peaks = {}
    for parts in (1, 2, 4):
        path = directory / f"peak_cp{parts}"
        if not path.exists():
            print(f"cp.memory.flat: {path} is missing (cp.memory.P{parts} did not run or failed)")
            return 1
        peaks[parts] = int(path.read_text().strip())
    for parts, peak in peaks.items():
        print(f"cp = {parts}: {1024 * parts} tokens, {peak / 2**20:.2f} MiB at the peak per process")
    ratio = max(peaks.values()) / min(peaks.values())
    print(f"largest / smallest: {ratio:.3f} (at most 1.10)")
    return 0 if ratio <= 1.10 else 1


if __name__ == "__main__":
    sys.exit(main())
