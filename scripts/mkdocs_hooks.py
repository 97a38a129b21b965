"""MkDocs hooks for accel's site (mkdocs.yml): the pages are the repository's Markdown files as GitHub shows them.

- Anchors are GitHub's (a heading's text, lower case, punctuation dropped, each space a hyphen), so that a link that
  works on GitHub works on the site, and the other way round.
- The changelog (CHANGELOG.md, at the repository's root) becomes the page changelog.md.
- A link from a page to a file outside docs/ (the changelog, a header, an example) is rewritten to lead to the
  site's copy of it: the changelog page, or the file itself copied under source/.
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


def site_path(repository_path):
    return "changelog.md" if repository_path == "CHANGELOG.md" else "source/" + repository_path


def rewrite(markdown, page_path, config):
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


def changelog_markdown():
    with open(os.path.join(ROOT, "CHANGELOG.md"), encoding="utf-8") as f:
        text = f.read()
    # Its links are written from the repository's root: docs/X is X on the site.
    return LINK.sub(lambda m: m.group(1) + (m.group(2)[5:] if m.group(2).startswith("docs/") else
                                            "source/" + m.group(2) if not re.match(r"[a-z]+:|#", m.group(2))
                                            else m.group(2)) + m.group(3), text)


def linked_sources(files, config):
    """Repository files outside docs/ that some page links to, other than the changelog."""
    found = set()
    for file in files.documentation_pages():
        with open(file.abs_src_path, encoding="utf-8") as f:
            for target in LINK.findall(f.read()):
                repository_path = outside_docs(config, file.src_uri, target[1])
                if repository_path and repository_path != "CHANGELOG.md":
                    found.add(repository_path)
    return found


def on_files(files, config):
    sources = sorted(linked_sources(files, config))
    files.append(File.generated(config, "changelog.md", content=changelog_markdown()))
    for repository_path in sources:
        source = os.path.join(ROOT, repository_path)
        if os.path.isfile(source):
            files.append(File.generated(config, site_path(repository_path), abs_src_path=source))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == "changelog.md":
        return markdown
    return rewrite(markdown, page.file.src_uri, config)
