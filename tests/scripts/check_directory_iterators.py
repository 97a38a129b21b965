"""lint.directory_iterators: accel, its tools, examples, benchmarks and tests list and remove directories with
accel::detail::directory_entries and remove_tree, never with std::filesystem's directory iterators (nor remove_all,
is_empty or recursive copies, which use them inside libstdc++).

Why: LibTorch's wheels export their own copies of those functions (statically linked from an older libstdc++,
pytorch#133437), which the dynamic linker binds in place of the system's; against GCC 13's libstdc++ the mix
segfaults (found on an H200 machine, Ubuntu 24.04, torch 2.11's wheel, 2026-11-26: every test that removed a
directory crashed).

    check_directory_iterators.py SOURCE_DIR
"""
import pathlib
import re
import sys

FORBIDDEN = re.compile(r"\b(directory_iterator|recursive_directory_iterator|remove_all|is_empty|copy_options)\b")
HELPER = "include/accel/detail/support/directory_entries.hpp"


def main():
    root = pathlib.Path(sys.argv[1])
    found = []
    for folder in ("include", "tools", "examples", "bench", "tests"):
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in (".hpp", ".ipp", ".cpp", ".h") or path.relative_to(root).as_posix() == HELPER:
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                code = line.split("//")[0]
                if "std::filesystem" in code or "fs::" in code:
                    if FORBIDDEN.search(code):
                        found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    if found:
        print("std::filesystem's directory iterators (or functions built on them) are used; LibTorch's wheels export "
              "their own copies, which crash against GCC 13's libstdc++ (pytorch#133437). Use "
              "accel::detail::directory_entries / remove_tree (" + HELPER + ") instead:")
        print("\n".join(found))
        sys.exit(1)
    print("no std::filesystem directory iterators in include/, tools/, examples/, bench/, tests/")


if __name__ == "__main__":
    main()
