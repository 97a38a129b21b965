"""MkDocs hooks for accel's site (mkdocs.yml): the pages are the repository's Markdown files as GitHub shows them.

- Anchors are GitHub's (a heading's text, lower case, punctuation dropped, each space a hyphen), so that a link that
  works on GitHub works on the site, and the other way round.
- The README and the changelog, at the repository's root, become the pages readme.md and changelog.md.
- A link from a page to a file outside docs/ (the README, the changelog, a header, an example) is rewritten to lead
  to the site's copy of it: the README's or changelog's page, or the file itself copied under source/.
"""
import os
import re

from mkdocs.structure.files import File

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"(\]\()([^)\s]+)(\))")


def github_anchor(text, separator="-"):
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", separator)


def on_config(config):
    config.mdx_configs.setdefault("toc", {})["slugify"] = github_anchor
    return config


def outside_docs(config, page_path, target):
    """The repository path a relative link from docs/PAGE_PATH leads to, when it leaves docs/; else None."""
    if re.match(r"[a-z]+:", target) or target.startswith(("#", "/")):
        return None
    path = target.partition("#")[0]
    resolved = os.path.normpath(os.path.join(config["docs_dir"], os.path.dirname(page_path), path))
    relative = os.path.relpath(resolved, ROOT)
    return None if not os.path.relpath(resolved, config["docs_dir"]).startswith("..") else relative


ROOT_PAGES = {"README.md": "readme.md", "CHANGELOG.md": "changelog.md"}  # pages written from the repository's root


def site_path(repository_path):
    return ROOT_PAGES.get(repository_path, "source/" + repository_path)


def rewrite(markdown, page_path, config):
    """The page's links that leave docs/ made to lead to the site's copies."""
    def fix(match):
        target = match.group(2)
        repository_path = outside_docs(config, page_path, target)
        if repository_path is None:
            return match.group(0)
        anchor = target.partition("#")[2]
        new = os.path.relpath(site_path(repository_path), os.path.dirname(page_path) or ".")
        return match.group(1) + new + ("#" + anchor if anchor else "") + match.group(3)

    out, fenced = [], False
    for line in markdown.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        out.append(line if fenced else LINK.sub(fix, line))
    return "\n".join(out)


def root_page_links(text):
    """The repository files other than docs/ pages that a page written from the root links to."""
    return {t.partition("#")[0] for _, t, _ in LINK.findall(text)
            if not re.match(r"[a-z]+:|#|/|docs/", t) and t.partition("#")[0]}


def root_page_markdown(repository_path):
    """A page of the repository's root as a site page: its links are written from the root, docs/X is X."""
    with open(os.path.join(ROOT, repository_path), encoding="utf-8") as f:
        text = f.read()

    def fix(match):
        target = match.group(2)
        if re.match(r"[a-z]+:|#|/", target):
            return match.group(0)
        path, _, anchor = target.partition("#")
        new = path[len("docs/"):] if path.startswith("docs/") else site_path(path)
        return match.group(1) + new + ("#" + anchor if anchor else "") + match.group(3)

    return LINK.sub(fix, text)


def linked_sources(files, config):
    """Repository files outside docs/ that a page links to (the root pages included, and what they link to)."""
    found = set(ROOT_PAGES)
    for file in files.documentation_pages():
        with open(file.abs_src_path, encoding="utf-8") as f:
            for _, target, _ in LINK.findall(f.read()):
                repository_path = outside_docs(config, file.src_uri, target)
                if repository_path:
                    found.add(repository_path)
    for page in ROOT_PAGES:
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            found |= root_page_links(f.read())
    return found


def on_files(files, config):
    sources = sorted(linked_sources(files, config))
    for repository_path in sources:
        if repository_path in ROOT_PAGES:
            files.append(File.generated(config, site_path(repository_path),
                                        content=root_page_markdown(repository_path)))
        elif os.path.isfile(os.path.join(ROOT, repository_path)):
            files.append(File.generated(config, site_path(repository_path),
                                        abs_src_path=os.path.join(ROOT, repository_path)))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri in ROOT_PAGES.values():
        return markdown
    return rewrite(markdown, page.file.src_uri, config)
