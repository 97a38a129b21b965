#!/usr/bin/env bash
# Sets up what the documentation site needs (scripts/setup.sh docs: MkDocs and its Material theme in .venv/), then
# builds docs/ into a static site with search and navigation (mkdocs.yml), strictly: a broken link or anchor, or a
# page missing from the navigation's files, fails the build.
#   scripts/docs.sh            the site in build-docs/site/ (open build-docs/site/index.html)
#   scripts/docs.sh DIRECTORY  the site in DIRECTORY
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
site=$(realpath -m "${1:-$root/build-docs/site}")
"$root/scripts/setup.sh" docs
# NO_MKDOCS_2_WARNING: Material's notice about the MkDocs project's future, printed on every build; it says nothing
# about these pages.
NO_MKDOCS_2_WARNING=1 "$root/.venv/bin/mkdocs" build --strict --config-file "$root/mkdocs.yml" --site-dir "$site"
echo "docs: the site is in $site (open $site/index.html)"
