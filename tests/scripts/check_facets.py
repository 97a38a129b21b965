"""docs.parallel_facets: the parallel seam's hooks are written once, in include/accel/concepts.hpp (one facet concept
per purpose, marked `/// \\facet NAME`); this checks that the two other places that list them say the same:

- each facet's compile-time message in `parallel_policy` names exactly that facet's hooks;
- docs/architecture.md has a table per facet (under a line holding the facet concept's name) listing exactly them.

usage: check_facets.py CONCEPTS_HPP ARCHITECTURE_MD
"""
import re
import sys

from checks import CheckFailed, check

CALL = re.compile(r"\b(?:q|cq)\.(\w+)\(")
MESSAGE_HOOK = re.compile(r"(\w+)\(")


def facets_in_concepts(text):
    """{concept name: [hooks]} for every `/// \\facet` concept, in order."""
    facets = {}
    for match in re.finditer(r"/// \\facet [^\n]*\n(?:///[^\n]*\n)*template <class Q>\nconcept (\w+) =(.*?)\n\s*};",
                             text, re.S):
        name, body = match.group(1), match.group(2)
        hooks = []
        for line in body.splitlines():
            code = line.split("//")[0]
            for hook in CALL.findall(code):
                if hook not in hooks:
                    hooks.append(hook)
        facets[name] = hooks
    return facets


def messages_in_concepts(text):
    """{concept name: [hooks the message names]} from parallel_policy's disjunctions."""
    body = text[text.index("concept parallel_policy ="):]
    body = body[:body.index(";\n")]
    messages = {}
    for match in re.finditer(r"detail::(\w+)<Q> \|\|\s*\n\s*detail::unsatisfied<\"([^\"]*)\"", body):
        hooks = MESSAGE_HOOK.findall(match.group(2).split(":", 1)[1])
        messages[match.group(1)] = [h for h in hooks if h != "from"]
    return messages


def facets_in_docs(text, names):
    """{concept name: [hooks]}: the first table after the line that names `detail::NAME`."""
    tables = {}
    lines = text.splitlines()
    for name in names:
        heading = next((i for i, line in enumerate(lines) if f"`detail::{name}`" in line and line.startswith("**")),
                       None)
        check(heading is not None, f"docs/architecture.md has no **...** (`detail::{name}`) heading for the facet")
        hooks, started = [], False
        for line in lines[heading + 1:]:
            if line.startswith("|"):
                started = True
                cell = line.split("|")[1]
                hook = re.match(r"\s*`(?:static )?(\w+)\(", cell)
                if hook:
                    hooks.append(hook.group(1))
            elif started:
                break
        tables[name] = hooks
    return tables


def main():
    concepts_path, docs_path = sys.argv[1:3]
    concepts = open(concepts_path, encoding="utf-8").read()
    docs = open(docs_path, encoding="utf-8").read()
    facets = facets_in_concepts(concepts)
    check(len(facets) >= 6, f"found {len(facets)} facet concepts in {concepts_path}: {sorted(facets)}")
    messages = messages_in_concepts(concepts)
    tables = facets_in_docs(docs, facets)
    for name, hooks in facets.items():
        if name in messages:  # the declared facet (uneven_inputs) has its message too
            check(sorted(messages[name]) == sorted(hooks),
                  f"{name}: the concept requires {hooks}, its message in parallel_policy names {messages[name]}")
        else:
            raise CheckFailed(f"{name} has no message in parallel_policy")
        check(sorted(tables[name]) == sorted(hooks),
              f"{name}: the concept requires {hooks}, docs/architecture.md's table lists {tables[name]}")
        print(f"{name}: {', '.join(hooks)}")
    print("the facets, their messages and docs/architecture.md agree")


if __name__ == "__main__":
    try:
        main()
    except CheckFailed as failure:
        print(f"FAILED: {failure}")
        sys.exit(1)
