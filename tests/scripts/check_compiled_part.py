"""lint.compiled_part: the two ways of compiling accel stay one source (include/accel/detail/config.hpp).

- Every `impl/NAME.ipp` belongs to the header `NAME.hpp` beside its folder, which includes it at its end under
  `#if ACCEL_HEADER_ONLY` (header-only mode), and it includes that header first.
- Every `.ipp` is compiled by exactly one file of src/ (accel::compiled).
- A header that marks a declaration ACCEL_DECL has an .ipp (else header-only mode would lack the definition), and
  includes detail/config.hpp, which defines the macro.
- No .ipp marks a definition `inline` at namespace scope except in its own internals: ACCEL_DECL on the declaration
  decides, as in Asio.

    check_compiled_part.py SOURCE_DIR
"""
import pathlib
import re
import sys


def main():
    root = pathlib.Path(sys.argv[1])
    include = root / "include"
    problems = []
    compiled = {}
    for source in sorted((root / "src").glob("*.cpp")):
        for line in source.read_text(encoding="utf-8").splitlines():
            m = re.match(r'#include <(accel/.*\.ipp)>', line)
            if m:
                compiled.setdefault(m.group(1), []).append(source.name)
    for ipp in sorted(include.rglob("*.ipp")):
        name = ipp.relative_to(include).as_posix()
        header = ipp.parent.parent / (ipp.stem + ".hpp")
        if not header.exists():
            problems.append(f"{name}: no header {header.relative_to(include)} beside its impl/ folder")
            continue
        text = header.read_text(encoding="utf-8")
        if not re.search(r'#if ACCEL_HEADER_ONLY\n#include "impl/%s"\n#endif\n*$' % re.escape(ipp.name), text):
            problems.append(f"{header.relative_to(include)}: does not end with `#if ACCEL_HEADER_ONLY` / "
                            f'`#include "impl/{ipp.name}"` / `#endif`')
        first = next((l for l in ipp.read_text(encoding="utf-8").splitlines() if l.startswith("#include")), "")
        if first != f'#include "../{header.name}"':
            problems.append(f'{name}: its first #include is not "../{header.name}"')
        sources = compiled.get(name, [])
        if len(sources) != 1:
            problems.append(f"{name}: compiled by {len(sources)} files of src/ ({', '.join(sources) or 'none'}); "
                            "include it in exactly one")
    for header in sorted(include.rglob("*.hpp")):
        text = header.read_text(encoding="utf-8")
        code = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("//"))
        if "ACCEL_DECL" not in code or header.name == "config.hpp":
            continue
        rel = header.relative_to(include).as_posix()
        if not (header.parent / "impl" / (header.stem + ".ipp")).exists():
            problems.append(f"{rel}: declares ACCEL_DECL functions but has no impl/{header.stem}.ipp to define them")
        if not re.search(r'#include "(\.\./)*(detail/)?config\.hpp"', text):
            problems.append(f"{rel}: uses ACCEL_DECL without including detail/config.hpp")
    for path in sorted(compiled):
        if not (include / path).exists():
            problems.append(f"src/ includes {path}, which does not exist")
    for problem in problems:
        print(problem)
    print(f"lint.compiled_part: {len(list(include.rglob('*.ipp')))} .ipp files, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
