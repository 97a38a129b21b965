#!/usr/bin/env python3
"""Keeps the README and the docs true to the code: one check (a case) per run.

usage: check_docs.py SOURCE_DIR CASE [PROGRAM...]

Each `def case_NAME(programs)` below is one CTest test, docs.NAME (tests/CMakeLists.txt reads the names from this
file and passes the programs a case needs). Python standard library only.
"""
import os
import re
import subprocess
import sys
import tempfile

from checks import CheckFailed, check

SOURCE = ""


def text_of(relative):
    with open(os.path.join(SOURCE, relative), encoding="utf-8") as f:
        return f.read()


def options_fields():
    """The fields of `struct options` in options.hpp, in declaration order."""
    header = text_of("include/accel/options.hpp")
    body = re.search(r"^struct options \{\n(.*?)^\};", header, re.S | re.M)
    check(body is not None, "options.hpp has no `struct options { ... };`")
    fields = []
    for line in body.group(1).splitlines():
        line = line.split("//")[0].strip()
        declared = re.match(r"[\w:<>, ]+?\s(\w+)\s*=.*;$", line)
        if declared:
            fields.append(declared.group(1))
    check(len(fields) > 10, f"read only {fields} from struct options")
    return fields


def case_options_order(programs):
    """The designated-initializer order lists in getting-started.md and reference/options.md name every field, in order."""
    fields = options_fields()
    for doc in ("docs/getting-started.md", "docs/reference/options.md"):
        paragraph = re.search(r"Designated\s+initializers\s+must\s+follow.*?(?:\n\n|$)", text_of(doc), re.S)
        check(paragraph is not None, f"{doc} no longer says that designated initializers follow an order")
        listed = [name for name in re.findall(r"`([^`]+)`", paragraph.group(0)) if re.fullmatch(r"\w+", name)]
        check(listed == fields, f"{doc} lists the options' fields as {listed}; options.hpp declares {fields}")
    print(f"both lists name the {len(fields)} fields in order")


def readme_cpp_blocks():
    return re.findall(r"^```cpp\n(.*?)^```", text_of("README.md"), re.S | re.M)


def case_readme_includes(programs):
    """A README snippet that uses LibTorch's modules or optimizers includes <torch/torch.h>: accel.hpp does not."""
    blocks = readme_cpp_blocks()
    check(blocks, "README.md has no C++ snippet")
    for block in blocks:
        if re.search(r"torch::(nn|optim)::", block):
            check("#include <torch/torch.h>" in block,
                  f"a README snippet uses torch::nn or torch::optim without #include <torch/torch.h>:\n{block}")
    print(f"{len(blocks)} snippets checked")


def example_environment(changes=None):
    """What `scripts/example.sh` runs the examples in: no ACCELERATE_* setting, no config file, LibTorch's own
    number of threads (the thread count decides how sums are split, so the stated figures need it). Idle threads
    sleep instead of spinning: beside another test on 2 cores, spinning made char_lm 6x slower (46 s against 7 s
    for 30 steps, measured); the same numbers either way, since the waiting does not change the split."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_") and k != "OMP_NUM_THREADS"}
    env["ACCEL_CONFIG_FILE"] = ""
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    env.update(changes or {})
    return env


def run(command, work, changes=None):
    print("$", " ".join(command), flush=True)
    result = subprocess.run(command, capture_output=True, text=True, env=example_environment(changes), cwd=work,
                            timeout=900)
    print(result.stdout + result.stderr, flush=True)
    check(result.returncode == 0, f"{command[0]} exited with {result.returncode}")
    return result.stdout


EXAMPLES_PAGE = "docs/getting-started.md"  # its section "The other examples" states what each example prints


def stated_lines(cell):
    """The printed lines an examples-table cell states (in backticks), not the commands it names."""
    return [text for text in re.findall(r"`([^`]+)`", cell) if "scripts/example.sh" not in text]


def stated_variants(cell):
    """What an examples-table cell says a run prints: one list of lines per kind of CPU, the kinds separated by `;`
    (the last digits of a loss depend on the CPU's kernels, which split sums differently; the cell names each CPU)."""
    return [lines for lines in (stated_lines(part) for part in cell.split(";")) if lines]


def prints(output, text):
    return any(re.search(re.escape(text) + r"(?![0-9])", line) for line in output.splitlines())


def check_printed(output, variants, what):
    """Passes when the output holds every line of one stated variant: exact figures, from any of the CPUs named."""
    for lines in variants:
        if all(prints(output, text) for text in lines):
            for text in lines:
                print(f"{what} prints `{text}`, as {EXAMPLES_PAGE} says")
            return
    stated = " or ".join("[" + ", ".join(f"`{text}`" for text in lines) + "]" for lines in variants)
    check(False, f"{what}: {EXAMPLES_PAGE} says it prints {stated}; it printed:\n{output}\nIf only the last "
                 f"digits differ, this CPU's kernels split the sums another way: add its lines to the cell in "
                 f"{EXAMPLES_PAGE} as another variant (after a `;`), naming the CPU.")


def example_row(command):
    """The cell of the examples table (EXAMPLES_PAGE) that states what `scripts/example.sh COMMAND` prints."""
    for line in text_of(EXAMPLES_PAGE).splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) >= 4 and cells[2] == f"`scripts/example.sh {command}`":
            return cells[3]
    raise CheckFailed(f"the examples table of {EXAMPLES_PAGE} has no row for `scripts/example.sh {command}`")


def case_readme_output_linear_regression(programs):
    stated = re.search(r"Expected output of `scripts/example.sh` \(last line\): `([^`]+)`", text_of("README.md"))
    check(stated is not None, "the README no longer states the linear regression's last line")
    with tempfile.TemporaryDirectory(prefix="accel-docs-") as work:
        output = run([programs[0]], work)
    last = output.strip().splitlines()[-1]
    check(last == stated.group(1), f"the README says the last line is `{stated.group(1)}`; it is `{last}`")
    print(f"linear_regression's last line is `{last}`, as the README says")


def case_readme_output_classifier(programs):
    accel, classifier = programs
    with tempfile.TemporaryDirectory(prefix="accel-docs-") as work:
        output = run([accel, "launch", "--nproc_per_node", "2", "--master_port", "0", classifier], work)
    check_printed(output, stated_variants(example_row("classifier")), "the classifier")


def case_readme_output_char_lm(programs):
    import torch  # only here: the other cases run without it
    if torch.cuda.is_available():  # char_lm trains on acc.device(): a GPU's losses are not the CPU's the docs state
        print(f"skipped: a GPU is visible, and {EXAMPLES_PAGE} states char_lm's losses on the CPU", flush=True)
        sys.exit(77)
    with tempfile.TemporaryDirectory(prefix="accel-docs-") as work:  # a fresh run: no checkpoint to resume from
        output = run([programs[0], "--out", os.path.join(work, "run")], work)
    check_printed(output, stated_variants(example_row("char_lm")), "char_lm")


def markdown_pages():
    """README.md, CHANGELOG.md and every page under docs/, relative to the source directory."""
    pages = ["README.md", "CHANGELOG.md"]
    for directory, _, files in sorted(os.walk(os.path.join(SOURCE, "docs"))):
        pages += sorted(os.path.relpath(os.path.join(directory, f), SOURCE) for f in files if f.endswith(".md"))
    return pages


def prose_lines(text):
    """(line number, line) of the lines outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            yield number, line


def heading_anchors(text):
    """GitHub's anchors for a page's headings (a repeated heading gets -1, -2, ...)."""
    seen, anchors = {}, set()
    for _, line in prose_lines(text):
        heading = re.match(r"#{1,6} (.*)", line)
        if heading:
            base = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            anchors.add(base if base not in seen else f"{base}-{seen[base]}")
            seen[base] = seen.get(base, 0) + 1
    return anchors


def case_links(programs):
    """Every relative link of the README, the changelog and the docs leads to a file that exists, and its #anchor,
    if any, to a heading of that page."""
    broken, count = [], 0
    for page in markdown_pages():
        text = text_of(page)
        for number, line in prose_lines(text):
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if re.match(r"[a-z]+:", target):
                    continue
                count += 1
                path, _, anchor = target.partition("#")
                resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
                if not os.path.exists(os.path.join(SOURCE, resolved)):
                    broken.append(f"{page}:{number}: {target}: no such file")
                elif anchor and resolved.endswith(".md") and anchor not in heading_anchors(text_of(resolved)):
                    broken.append(f"{page}:{number}: {target}: {resolved} has no heading with this anchor")
    check(not broken, f"{len(broken)} broken links:\n" + "\n".join(broken))
    print(f"{count} relative links in {len(markdown_pages())} pages lead where they say")


def case_sizes(programs):
    """The README reads in five minutes (at most 12 KB, no line over 400 characters) and every docs page is at most
    40 KB: a page that grows past it is split at its sections."""
    readme = text_of("README.md")
    size = len(readme.encode("utf-8"))
    check(size <= 12 * 1024, f"README.md is {size} bytes, more than 12 KB: move detail to a page under docs/")
    long_lines = [n for n, line in enumerate(readme.splitlines(), 1) if len(line) > 400]
    check(not long_lines, f"README.md lines {long_lines} are over 400 characters")
    large = [f"{page} ({len(text_of(page).encode('utf-8'))} bytes)" for page in markdown_pages()
             if page.startswith("docs/") and len(text_of(page).encode("utf-8")) > 40 * 1024]
    check(not large, "docs pages over 40 KB (split them at their sections): " + ", ".join(large))
    print(f"README.md {size} bytes; every docs page at most 40 KB")


FEATURES_ROW_LIMIT = 600  # characters: a row of docs/features.md stays short enough to read
# Tests a build registers only where it has what they need (tests/CMakeLists.txt): a name of such a family is not
# checked in a build that registered none of it (scripts/test.sh's builds register them all).
OPTIONAL_FAMILIES = {"example.": "the examples (ACCEL_BUILD_EXAMPLES)",
                     "fp8.char_lm": "the examples (ACCEL_BUILD_EXAMPLES)", "dist.mpirun.": "Open MPI's mpirun",
                     "dist.torchrun.": "torchrun", "dist.nccl.": "NCCL", "interop.mlflow.": "MLflow's server"}


def registered_tests(ctest, build):
    """The names of the tests registered in BUILD, as `ctest -N` lists them (`  Test  #12: name`)."""
    result = subprocess.run([ctest, "--test-dir", build, "-N"], capture_output=True, text=True, timeout=300)
    check(result.returncode == 0, f"`{ctest} --test-dir {build} -N` exited with {result.returncode}:\n"
                                  f"{result.stdout}{result.stderr}")
    names = [m.group(1).rstrip() for m in re.finditer(r"^\s*Test\s+#\s*\d+: (.+)$", result.stdout, re.M)]
    check(names, f"`ctest -N` in {build} lists no tests:\n{result.stdout}")
    return names


def expand_braces(token):
    """`dist.gloo.P{2,3}.join` -> [`dist.gloo.P2.join`, `dist.gloo.P3.join`]; several groups multiply."""
    group = re.search(r"\{([^{}]*)\}", token)
    if group is None:
        return [token]
    return [name for item in group.group(1).split(",")
            for name in expand_braces(token[:group.start()] + item + token[group.end():])]


def name_pattern(name):
    """A test name in which `*` matches any text (everything else is literal)."""
    return re.compile(".*".join(re.escape(part) for part in name.split("*")) + r"\Z", re.S)


def table_rows(text):
    """(line number, line, cells) of each body row of the page's tables (not their header or separator rows)."""
    lines = text.splitlines()
    rows = []
    for index, line in enumerate(lines):
        if not line.startswith("|") or re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", line.strip()):
            continue
        following = lines[index + 1] if index + 1 < len(lines) else ""
        if re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", following.strip()):
            continue  # the header row
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        rows.append((index + 1, line, cells))
    return rows


def case_features(programs):
    """docs/features.md: each row at most FEATURES_ROW_LIMIT characters, and every test name or pattern in a row's last
    column (each in backticks; `{a,b}` stands for each item, `*` for any text) matches a test this build registers."""
    ctest, build = programs
    names = registered_tests(ctest, build)
    rows = table_rows(text_of("docs/features.md"))
    check(len(rows) >= 20, f"docs/features.md has {len(rows)} table rows: its tables are gone or unreadable")
    problems, tokens, unregistered = [], 0, set()
    absent = {family: why for family, why in OPTIONAL_FAMILIES.items() if not any(n.startswith(family) for n in names)}
    for number, line, cells in rows:
        row = f"docs/features.md:{number} ({(cells[0] if cells else line)[:60]!r})"
        if len(line) > FEATURES_ROW_LIMIT:
            problems.append(f"{row}: {len(line)} characters, over {FEATURES_ROW_LIMIT}: say less, or split the row")
        if len(cells) < 2:
            problems.append(f"{row}: not a table row of several columns")
            continue
        stated = re.findall(r"`([^`]+)`", cells[-1])
        if not stated:
            problems.append(f"{row}: names no test in its last column")
        for token in stated:
            tokens += 1
            for name in expand_braces(token):
                pattern = name_pattern(name)
                family = next((f for f in absent if name.startswith(f)), None)
                if family is not None:
                    unregistered.add(f"{family}* (needs {absent[family]})")
                elif not any(pattern.match(test) for test in names):
                    shown = f"`{name}` (from `{token}`)" if name != token else f"`{token}`"
                    problems.append(f"{row}: {shown} matches no test registered in {build}")
    check(not problems, f"{len(problems)} problems in docs/features.md:\n" + "\n".join(problems))
    print(f"{len(rows)} rows, each at most {FEATURES_ROW_LIMIT} characters; their {tokens} test names and patterns "
          f"each match a test of the {len(names)} registered")
    if unregistered:
        print("not checked, as this build registers none of their tests: " + ", ".join(sorted(unregistered)))


def main():
    global SOURCE
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    SOURCE, name, programs = sys.argv[1], sys.argv[2], [os.path.abspath(p) for p in sys.argv[3:]]
    case = globals().get("case_" + name)
    if case is None:
        sys.exit(f"unknown case {name!r}")
    try:
        case(programs)
    except CheckFailed as failure:
        print(f"FAILED: {failure}", flush=True)
        sys.exit(1)
    print("passed")


if __name__ == "__main__":
    main()
