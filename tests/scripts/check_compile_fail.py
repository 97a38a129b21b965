"""Checks one file of tests/compile_fail/ in the output of building them all as one translation unit.

usage: check_compile_fail.py OUTPUT CASE.cpp

Passes when a line of OUTPUT matches the file's `// expect-error: REGEX` and that line belongs to the file: the
last file of tests/compile_fail/ named before it (as a location, `compile_fail/NAME.cpp:`, or through the namespace
each file is built in, `compile_fail_NAME::`) is this one. So another file's diagnostic cannot pass this file's
test: a diagnostic's context (`required from here`, the instantiation's arguments) comes before its message.
"""
import os
import re
import sys

EXPECT = "// expect-error: "


def expected_pattern(case):
    with open(case) as source:
        for line in source:
            if line.startswith(EXPECT):
                return line[len(EXPECT):].rstrip("\n")
    sys.exit(f"{case} has no `{EXPECT}REGEX` line")


def owners(lines):
    """The file of tests/compile_fail/ each line belongs to: the last one named on it or before it."""
    named = re.compile(r"compile_fail/(\w+)\.cpp:|compile_fail_(\w+)::")
    owner = None
    for line in lines:
        for match in named.finditer(line):
            owner = match.group(1) or match.group(2)
        yield owner


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    output_path, case = sys.argv[1], sys.argv[2]
    name = os.path.splitext(os.path.basename(case))[0]
    pattern = re.compile(expected_pattern(case))
    if not os.path.exists(output_path):
        sys.exit(f"{output_path} is missing: compile_fail.build writes it (ctest runs it first, as a fixture)")
    with open(output_path) as output:
        lines = output.read().splitlines()
    matches = [(owner, line) for owner, line in zip(owners(lines), lines) if pattern.search(line)]
    if any(owner == name for owner, _ in matches):
        print(f"{name} fails to compile with `{pattern.pattern}`")
        return
    others = sorted({owner for owner, _ in matches if owner})
    found = f"; the message appears only under {', '.join(others)}" if others else ""
    print(f"FAILED: no diagnostic of {name}.cpp says `{pattern.pattern}`{found}. Its diagnostics:")
    for owner, line in zip(owners(lines), lines):
        if owner == name:
            print(line)
    sys.exit(1)


if __name__ == "__main__":
    main()
