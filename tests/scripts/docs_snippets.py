#!/usr/bin/env python3
"""Writes every ```cpp block of docs/**/*.md into C++ translation units, so that building them checks that the docs'
C++ compiles (the docs.snippets test, tests/docs_snippets.cmake). Python standard library only.

usage: docs_snippets.py SOURCE_DIR OUTPUT_DIR

Writes OUTPUT_DIR/snippets_main.cpp (built with the tests' precompiled header) and OUTPUT_DIR/snippets_nccl.cpp (the
blocks that name accel::nccl: built with the accel::nccl target, where NCCL is found), each only when its text
changes, so that an edit elsewhere in the docs recompiles nothing; then OUTPUT_DIR/summary.txt (what was compiled and
what was not, which the test prints), always: the build's stamp.

How a block is compiled. Each block gets a namespace of its own (accel_docs::PAGE_LINE), and `#line` directives, so
that a diagnostic names the Markdown file and line; a marker, an HTML comment on the last non-blank line before the
fence (invisible on GitHub and on the site), changes how, as said below. Its #include lines go to the top of the unit.
The rest:

- class, template and namespace definitions, TORCH_MODULE(...), test cases (TEST_CASE, TEST) and `int main()` go to
  the block's namespace (a block that specialises a template of accel's, `template <> struct accel::...`, has them at
  global scope, where such a specialisation is declared); everything else is the body of a function, in order, after
  them. So a block may be a whole program, a few declarations, or statements from a training loop.
- The names a fragment takes from its context (`acc`, `net`, `optimizer`, `model`, `batches`, ...) are declared in
  tests/docs/snippet_context.hpp, in namespace accel_docs: the default context. `<!-- snippet: context NAME -->`
  chooses another, a namespace nested in it that redeclares a few of its names (`accel_docs::unprepared`, say). A
  block's own declarations hide the context's.
- `<!-- snippet: declarations -->`: a listing of accel's declarations (signatures, structs, as in the reference),
  compiled as it is in a namespace of its own inside namespace accel, as if written in namespace accel (the listing
  may open `namespace accel {` or `namespace accel::NAME {` itself). Then each of its non-template functions
  is checked to be one of accel's with that type (its address taken as such), each struct's data members to have
  the listed types, its member functions those signatures, its bases to be bases, and each alias to be accel's:
  a listing that drifts from the headers fails.
- `<!-- snippet: compile-fail tests/compile_fail/NAME.cpp -->`: a block that shows code that must not compile. It is
  not compiled here; its code lines must appear in that case of the compile_fail tests, which checks the message.
- `<!-- snippet: quoted FILE -->`: an excerpt of accel's own code (a private member, say) that a user's program could
  not compile: its code lines must appear in FILE (under include/ or src/), so that it cannot drift from it.
- `<!-- snippet: skip REASON -->`: not compiled, for the reason given, which the test prints (an excerpt that names
  accel's private members, say). EXCLUDED_PAGES below does the same for a whole page.

Structured bindings and range-for variables are marked [[maybe_unused]] in the generated code (a fragment's loop body
is often `/* ... */`); any other unused variable is a warning, hence an error. A block naming accel::nccl goes to the
NCCL unit. A problem found here (an unknown marker or context, a compile-fail block that its case does not hold) is
written as an `#error` at the block's line: the build fails, naming it, as for a block that does not compile.
"""
import os
import re
import sys

# Pages whose C++ blocks are not compiled, and why. Everything else under docs/ is.
EXCLUDED_PAGES = {}

MARKER = re.compile(r"^\s*<!--\s*snippet:\s*(.*?)\s*-->\s*$")
FENCE_OPEN = re.compile(r"^(\s*)```cpp\s*$")
DECLARATION_START = re.compile(
    r"^(struct|class|union|enum|template|namespace)\b|^(TORCH_MODULE|TEST_CASE|TEST)\s*\(|^int\s+main\s*\(")
SPECIALISES_ACCEL = re.compile(r"^template\s*<>\s*(struct|class)\s+(::)?accel::")
INCLUDE = re.compile(r"^\s*#\s*include\b")


class Block:
    def __init__(self, page, line, lines, marker, marker_line):
        self.page = page                  # "docs/x.md"
        self.line = line                  # the fence's line number
        self.lines = lines                # [(line number, text)], the indentation of the fence removed
        self.marker = marker              # the marker's text, or None
        self.marker_line = marker_line
        self.name = re.sub(r"\W", "_", page[len("docs/"):-len(".md")]) + f"_md_{line}"

    def where(self):
        return f"{self.page}:{self.line}"


def read_blocks(source, page):
    """The page's ```cpp blocks, and the line numbers of its markers that no ```cpp fence follows."""
    with open(os.path.join(source, page), encoding="utf-8") as f:
        text = f.read().split("\n")
    blocks, i = [], 0
    while i < len(text):
        opened = FENCE_OPEN.match(text[i])
        if not opened:
            i += 1
            continue
        indent = len(opened.group(1))
        start, i = i, i + 1
        body = []
        while i < len(text) and text[i].strip() != "```":
            line = text[i]
            body.append((i + 1, line[indent:] if line[:indent].strip() == "" else line.lstrip()))
            i += 1
        before = start - 1
        while before >= 0 and not text[before].strip():
            before -= 1
        marker = MARKER.match(text[before]) if before >= 0 else None
        blocks.append(Block(page, start + 1, body, marker.group(1) if marker else None, before + 1))
        i += 1
    attached = {block.marker_line for block in blocks if block.marker is not None}
    orphans = [n for n, line in enumerate(text, 1) if MARKER.match(line) and n not in attached]
    return blocks, orphans


def code_only(lines):
    """Each line with its comments blanked and its string and character literals' contents blanked (quotes kept),
    for counting braces and matching keywords."""
    out, in_comment = [], False
    for _, text in lines:
        chars, i = list(text), 0
        while i < len(chars):
            c = chars[i]
            if in_comment:
                if text.startswith("*/", i):
                    chars[i] = chars[i + 1] = " "
                    in_comment = False
                    i += 2
                    continue
                chars[i] = " "
            elif text.startswith("//", i):
                for j in range(i, len(chars)):
                    chars[j] = " "
                break
            elif text.startswith("/*", i):
                chars[i] = chars[i + 1] = " "
                in_comment = True
                i += 2
                continue
            elif c in "\"'":
                if c == "'" and i > 0 and re.search(r"(?:^|[^\w])\d[\w']*$", text[:i]):
                    i += 1  # a digit separator: 10'000
                    continue
                j = i + 1
                while j < len(chars) and chars[j] != c:
                    if chars[j] == "\\":
                        chars[j] = " "
                        j += 1
                    if j < len(chars):
                        chars[j] = " "
                    j += 1
                i = j
            i += 1
        out.append("".join(chars))
    return out


def depth_change(code):
    return code.count("{") + code.count("(") + code.count("[") - code.count("}") - code.count(")") - code.count("]")


def items(lines):
    """The block's top-level items: (is_declaration, [(line number, text)]). Blank and comment lines go with the item
    after them."""
    code = code_only(lines)
    result, pending, current, depth, is_declaration = [], [], None, 0, False
    for (number, text), stripped in zip(lines, code):
        if current is None:
            if not stripped.strip():
                pending.append((number, text))
                continue
            is_declaration = bool(DECLARATION_START.match(stripped.strip()))
            current = pending + [(number, text)]
            pending = []
        else:
            current.append((number, text))
        depth += depth_change(stripped)
        if depth <= 0 and re.search(r"[;}]\s*$", stripped):
            result.append((is_declaration, current))
            current, depth = None, 0
    if current is not None:
        result.append((is_declaration, current))
    if pending:
        result.append((False, pending))
    return result


def emit(lines, page, out, mark_unused=False):
    """Appends the lines to out, with a #line directive wherever their numbering jumps."""
    expected = None
    for number, text in lines:
        if number != expected:
            out.append(f'#line {number} "{page}"')
        if mark_unused:
            text = re.sub(r"\bfor\s*\(\s*(?=(?:const\s+)?auto\b)", lambda m: m.group(0) + "[[maybe_unused]] ", text)
            text = re.sub(r"^(\s*)(?=(?:const\s+)?auto\s*&{0,2}\s*\[)", r"\1[[maybe_unused]] ", text)
        out.append(text)
        expected = number + 1


def error(block, message, out, line=None):
    out.append(f'#line {line or block.line} "{block.page}"')
    out.append("#error " + message.replace("'", "`"))  # an unpaired quote would be a token error of its own


# ---- declarations blocks: the listing, then the checks against accel's own declarations -------------------------


def split_top(text, separators=","):
    """text split at the separators outside (), <>, {} and []."""
    parts, depth, start = [], 0, 0
    i = 0
    while i < len(text):
        c = text[i]
        if c in "(<{[":
            depth += 1
        elif c in ")>}]":
            depth -= 1
        elif c in separators and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return parts


def find_top(text, chars):
    depth = 0
    for i, c in enumerate(text):
        if c in chars and depth == 0:
            return i
        if c in "(<{[":
            depth += 1
        elif c in ")>}]":
            depth -= 1
    return -1


def quoted(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def parameters_without_defaults(params):
    if not params.strip() or params.strip() == "void":
        return ""
    kept = []
    for p in split_top(params):
        equals = find_top(p, "=")
        kept.append((p[:equals] if equals >= 0 else p).strip())
    return ", ".join(kept)


SPECIFIERS = re.compile(r"\b(static|constexpr|consteval|inline|virtual|explicit|extern)\b")


def function_check(decl, scope_class):
    """(type text, name, is_static) of a function declaration `RET NAME(PARAMS) QUALS`, or None when not one (or one
    this does not check: operators, constructors, templates, trailing return types)."""
    paren = find_top(decl, "(")
    equals = find_top(decl, "=")
    if paren < 0 or (0 <= equals < paren):
        return None
    head = decl[:paren].strip()
    name = re.search(r"(~?\w+)$", head)
    if not name or "operator" in head:
        return None
    ret = head[:name.start()].strip()
    is_static = bool(re.search(r"\bstatic\b", ret))
    ret = SPECIFIERS.sub("", ret).strip()
    constructor = scope_class and name.group(1) == scope_class.split("::")[-1]
    if not ret or ret in ("auto", "decltype(auto)") or re.search(r"\bfriend\b", ret) or constructor or \
            name.group(1).startswith("~"):
        return None
    depth, close = 0, -1
    for i in range(paren, len(decl)):
        depth += decl[i] == "("
        depth -= decl[i] == ")"
        if depth == 0:
            close = i
            break
    quals = decl[close + 1:]
    quals = re.sub(r"=\s*(0|default|delete)\s*$", "", quals)
    quals = re.sub(r"\b(override|final)\b", "", quals).strip()
    if "->" in quals:
        return None
    return f"{ret}({parameters_without_defaults(decl[paren + 1:close])}) {quals}".strip(), name.group(1), is_static


def member_check(decl):
    """(type, name) of a data member declaration `TYPE NAME [= init | {init}]`, or None."""
    cut = min([i for i in (find_top(decl, "="), find_top(decl, "{")) if i >= 0] or [len(decl)])
    head = decl[:cut].strip()
    if "(" in head or "[" in head or "," in head or re.match(r"(static|using|friend|typedef)\b", head):
        return None
    name = re.search(r"(\w+)$", head)
    if not name or not head[:name.start()].strip():
        return None
    return head[:name.start()].strip(), name.group(1)


class Listing:
    """Reads a declarations block statement by statement and writes the checks of what it declares."""

    def __init__(self, block, checks):
        self.block = block
        self.checks = checks  # [(namespace, page, line number, C++ text)]
        self.count = 0
        code = code_only(block.lines)
        self.text, self.line_of = "", []
        for (number, _), stripped in zip(block.lines, code):
            stripped = re.sub(r"^\s*#.*$", "", stripped)  # #include lines
            self.text += stripped + "\n"
            self.line_of += [number] * (len(stripped) + 1)
        self.text = re.sub(r"\[\[[^\]]*\]\]", lambda m: " " * len(m.group(0)), self.text)  # attributes

    def check_name(self):
        self.count += 1
        return f"docs_check_{self.block.name}_{self.count}"

    def add(self, namespace, position, text):
        self.checks.append((namespace, self.block.page, self.line_of[min(position, len(self.line_of) - 1)], text))

    def skip_space(self, i):
        while i < len(self.text) and self.text[i].isspace():
            i += 1
        return i

    def matching(self, i, open_char="{", close_char="}"):
        depth = 0
        for j in range(i, len(self.text)):
            depth += self.text[j] == open_char
            depth -= self.text[j] == close_char
            if depth == 0:
                return j
        return len(self.text) - 1

    def statement_end(self, i):
        """The end of the declaration starting at i: its `;` (after a body, if any), or the body's `}` for a function
        or namespace definition. Returns (end, body start or -1)."""
        depth = 0
        for j in range(i, len(self.text)):
            c = self.text[j]
            if c in "(<[":
                depth += 1
            elif c in ")>]":
                depth -= 1
            elif c == "{" and depth == 0:
                head = self.text[i:j]
                close = self.matching(j)
                if re.search(r"(^|\W)(struct|class|union|enum)\W", " " + head) or re.search(r"[=,(]\s*$", head):
                    k = self.skip_space(close + 1)
                    semi = self.text.find(";", k)
                    return (semi if semi >= 0 else close), j
                return close, j
            elif c == ";" and depth <= 0:
                return j, -1
        return len(self.text) - 1, -1

    def scope(self, start, end, namespace, scope_class):
        i = self.skip_space(start)
        while i < end:
            stop, body = self.statement_end(i)
            stop = min(stop, end)
            decl = " ".join(self.text[i:body if body >= 0 else stop].split())
            opened = re.match(r"namespace\s+([\w:]+)\s*$", decl)
            if opened and body >= 0:
                inner = [n for n in opened.group(1).split("::") if n]
                if inner and inner[0] == "accel" and namespace == ["accel"]:
                    inner = inner[1:]
                self.scope(body + 1, self.matching(body), namespace + inner, None)
            elif re.match(r"template\b", decl) or not decl:
                pass
            elif re.match(r"(struct|class)\s+(\w+)", decl):
                self.structure(decl, i, body, namespace, scope_class)
            elif re.match(r"using\s+\w+\s*=", decl):
                alias = re.match(r"using\s+(\w+)\s*=\s*(.*)$", decl)
                target = f"{scope_class}::{alias.group(1)}" if scope_class else alias.group(1)
                self.add(namespace, i, f"static_assert(std::is_same_v<{target}, {alias.group(2)}>, "
                                       + quoted(self.block.where() + ": " + target + " is not accel's") + ");")
            elif scope_class:
                function = function_check(decl, scope_class)
                if function:
                    signature, name, is_static = function
                    check = self.check_name()
                    pointer = "*" if is_static else f"{scope_class}::*"
                    self.add(namespace, i, f"using {check}_t = {signature}; [[maybe_unused]] constexpr {check}_t "
                                           f"{pointer}{check} = &{scope_class}::{name};")
                else:
                    member = member_check(decl)
                    if member and not re.match(r"(static|constexpr)\b", decl):
                        self.add(namespace, i, f"static_assert(std::is_same_v<decltype({scope_class}::{member[1]}), "
                                               f"{member[0]}>, " + quoted(f"{self.block.where()}: {scope_class}::"
                                                                          f"{member[1]} is not declared {member[0]}")
                                               + ");")
            else:
                function = function_check(decl, None)
                if function:
                    signature, name, _ = function
                    check = self.check_name()
                    self.add(namespace, i, f"using {check}_t = {signature}; [[maybe_unused]] constexpr {check}_t* "
                                           f"{check} = &{name};")
            i = self.skip_space(stop + 1)

    def structure(self, decl, position, body, namespace, outer):
        head = re.match(r"(struct|class)\s+(\w+)\s*(?:final\s*)?(?::\s*(.*))?$", decl)
        if not head or body < 0:
            return
        name = f"{outer}::{head.group(2)}" if outer else head.group(2)
        for base in split_top(head.group(3) or ""):
            base = re.sub(r"\b(public|protected|private|virtual)\b", "", base).strip()
            if base:
                self.add(namespace, position, f"static_assert(std::is_base_of_v<{base}, {name}>, "
                                              + quoted(f"{self.block.where()}: {base} is not a base of {name}") + ");")
        self.scope(body + 1, self.matching(body), namespace, name)


def declarations(block, out, checks):
    opens_accel = any(re.match(r"\s*namespace\s+accel\b", line) for line in code_only(block.lines))
    # Inside namespace accel, where the listing's names find accel's first (not accel_docs' context, nor another
    # library's `detail`), in a namespace of its own.
    out.append(f"namespace accel::docs_{block.name} {{")
    out.append("namespace accel { using namespace ::accel; }  // for accel::NAME in the listing")
    if not opens_accel:
        out.append("namespace accel {")
    emit([(n, t) for n, t in block.lines if not INCLUDE.match(t)], block.page, out)
    if not opens_accel:
        out.append("}")
    out.append(f"}}  // namespace accel::docs_{block.name}")
    listing = Listing(block, checks)
    listing.scope(0, len(listing.text), ["accel"], None)


def held_in(block, path, source, out, what):
    """Each code line of `block` appears (whitespace and comments aside) in the repository's file `path`."""
    with open(os.path.join(source, path), encoding="utf-8") as f:
        held = {" ".join(line.split("//")[0].split()) for line in f}
    for number, code in zip((n for n, _ in block.lines), code_only(block.lines)):
        wanted = " ".join(code.split())
        if wanted and wanted not in held:
            error(block, f"this line of {what} is not in {path}", out, number)


def compile_fail(block, case, source, out):
    if not re.fullmatch(r"tests/compile_fail/\w+\.cpp", case) or not os.path.exists(os.path.join(source, case)):
        return error(block, f"the marker names {case}, not a file tests/compile_fail/NAME.cpp", out)
    held_in(block, case, source, out, "a compile-fail block (that case checks that it does not compile)")


def quotation(block, path, source, out):
    if not re.fullmatch(r"(include|src)/[\w/.]+", path) or not os.path.isfile(os.path.join(source, path)):
        return error(block, f"the marker names {path}, not a file under include/ or src/", out)
    held_in(block, path, source, out, "a quotation")


def statements_and_declarations(block, context, out):
    parts = items([(n, t) for n, t in block.lines if not INCLUDE.match(t)])
    global_scope = any(is_decl and SPECIALISES_ACCEL.match(" ".join(code_only(lines)).strip())
                       for is_decl, lines in parts)
    namespace = "accel_docs" + (f"::{context}" if context else "") + f"::{block.name}"
    declared = [lines for is_decl, lines in parts if is_decl]
    if global_scope:
        for lines in declared:
            emit(lines, block.page, out)
    out.append(f"namespace {namespace} {{")
    if not global_scope:
        for lines in declared:
            program = any(re.match(r"int\s+main\s*\(", t.strip()) for _, t in lines)
            if program:  # main, here a function like any other, may end without return as main does
                out.append("#pragma GCC diagnostic push")
                out.append('#pragma GCC diagnostic ignored "-Wreturn-type"')
            emit(lines, block.page, out, mark_unused=True)
            if program:
                out.append("#pragma GCC diagnostic pop")
    statements = [line for is_decl, lines in parts if not is_decl for line in lines]
    if any(t.strip() for _, t in statements):
        out.append("void snippet() {")
        emit(statements, block.page, out, mark_unused=True)
        out.append("}")
    out.append(f"}}  // namespace {namespace}")


def contexts(source):
    with open(os.path.join(source, "tests/docs/snippet_context.hpp"), encoding="utf-8") as f:
        return set(re.findall(r"^namespace accel_docs::(\w+) \{", f.read(), re.M))


def write_if_changed(path, text):
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    source, output = sys.argv[1], sys.argv[2]
    os.makedirs(output, exist_ok=True)
    pages = []
    for directory, _, files in sorted(os.walk(os.path.join(source, "docs"))):
        pages += sorted(os.path.relpath(os.path.join(directory, f), source).replace(os.sep, "/")
                        for f in files if f.endswith(".md"))
    known_contexts = contexts(source)
    units = {"main": [], "nccl": []}
    includes = {"main": [], "nccl": []}
    checks = {"main": [], "nccl": []}
    summary, compiled, excluded, failing, quoted = [], 0, [], [], []
    for page in pages:
        blocks, orphans = read_blocks(source, page)
        for line in orphans:
            units["main"] += [f'#line {line} "{page}"', "#error this snippet marker is not followed by a ```cpp fence"]
        if page in EXCLUDED_PAGES:
            if blocks:
                excluded.append(f"{page}: {len(blocks)} blocks not compiled: {EXCLUDED_PAGES[page]}")
            continue
        for block in blocks:
            unit = "nccl" if any("accel::nccl" in t for _, t in block.lines) else "main"
            out = units[unit]
            out.append(f"\n// ---- {block.where()}")
            for _, text in block.lines:
                if INCLUDE.match(text) and text.strip() not in includes[unit]:
                    includes[unit].append(text.strip())
            words = (block.marker or "").split()
            kind = words[0] if words else "code"
            if kind == "declarations" and len(words) == 1:
                declarations(block, out, checks[unit])
            elif kind == "compile-fail" and len(words) == 2:
                compile_fail(block, words[1], source, out)
                failing.append(f"{block.where()}: must not compile, as {words[1]} (compile_fail.* checks it)")
                continue
            elif kind == "quoted" and len(words) == 2:
                quotation(block, words[1], source, out)
                quoted.append(f"{block.where()}: quoted from {words[1]}, each line checked to be there")
                continue
            elif kind == "skip" and len(words) > 1:
                excluded.append(f"{block.where()}: {' '.join(words[1:])}")
                continue
            elif kind == "context" and len(words) == 2:
                if words[1] not in known_contexts:
                    error(block, f"no context {words[1]} in tests/docs/snippet_context.hpp (it has "
                                 f"{', '.join(sorted(known_contexts))})", out, block.marker_line)
                else:
                    statements_and_declarations(block, words[1], out)
            elif kind == "code":
                statements_and_declarations(block, None, out)
            else:
                error(block, f"unknown snippet marker '{block.marker}': declarations, context NAME, "
                             f"compile-fail tests/compile_fail/NAME.cpp, quoted FILE or skip REASON", out, block.marker_line)
            compiled += 1
            summary.append((page, unit))
    for unit, body in units.items():
        text = [f"// Generated by tests/scripts/docs_snippets.py from the ```cpp blocks of docs/: do not edit.",
                *includes[unit], '#include "docs/snippet_context.hpp"', "", "#include <type_traits>", *body, ""]
        if checks[unit]:
            text.append("// The declarations blocks' functions, members and aliases, checked against accel's.")
        for namespace, page, line, check in checks[unit]:
            text += [f"namespace {'::'.join(namespace)} {{", f'#line {line} "{page}"', check, "}"]
        path = os.path.join(output, f"snippets_{unit}.cpp")
        write_if_changed(path, "\n".join(text) + "\n")
    nccl = sum(1 for _, unit in summary if unit == "nccl")
    per_page = {}
    for page, _ in summary:
        per_page[page] = per_page.get(page, 0) + 1
    lines = [f"{compiled} C++ blocks of docs/ compiled ({compiled - nccl} in snippets_main.cpp, {nccl} in "
             f"snippets_nccl.cpp): " + ", ".join(f"{page[5:]} {n}" for page, n in per_page.items()),
             "not compiled:", *[f"  {x}" for x in quoted + failing + excluded]]
    with open(os.path.join(output, "summary.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
