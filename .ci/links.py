#!/usr/bin/env python3
"""Links that work where users read them: the README on crates.io, the crate docs on
docs.rs. Run after `cargo doc --no-deps --all-features`.

- The README's links are absolute (crates.io resolves no relative link without a
  repository) or a fragment of the README itself. Links to tollgate's docs on docs.rs
  must name a page (and a heading) that the local build has; links to the packaged
  sources (`https://docs.rs/crate/tollgate/latest/source/<path>`) must name a file that
  `cargo package --list` packages.
- In the built docs, every link that stays inside tollgate's pages names a page that
  exists and, with a fragment, an element of it.

    python3 .ci/links.py    # exit 1, listing each broken link
"""
import html
import json
import os
import re
import subprocess
import sys
from urllib.parse import unquote, urldefrag

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
DOCS_RS = "https://docs.rs/tollgate/latest/tollgate/"
SOURCE = "https://docs.rs/crate/tollgate/latest/source/"

# Inline links and images, autolinks, and reference definitions. Code spans and fenced
# blocks are removed first.
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
AUTO = re.compile(r"<(https?://[^>\s]+)>")
REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
ID = re.compile(r'\bid="([^"]+)"')
HREF = re.compile(r'\bhref="([^"]+)"')


def target_dir():
    meta = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    )
    return json.loads(meta.stdout)["target_directory"]


def packaged():
    out = subprocess.run(
        ["cargo", "package", "--list", "--allow-dirty"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    )
    return set(out.stdout.split())


def markdown_links(text):
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return INLINE.findall(text) + AUTO.findall(text) + REFDEF.findall(text)


def slug(heading):
    """A heading's anchor as GitHub and crates.io make it."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


_ids = {}


def ids(page):
    if page not in _ids:
        _ids[page] = set(ID.findall(open(page, encoding="utf-8").read()))
    return _ids[page]


def check_doc_page(doc_root, rel, fragment):
    """None when `rel` (a path under the doc root) and its fragment exist, else why."""
    page = os.path.normpath(os.path.join(doc_root, rel))
    if os.path.isdir(page):
        page = os.path.join(page, "index.html")
    if not os.path.isfile(page):
        return "no such page"
    if fragment and fragment not in ids(page):
        return f"no #{fragment} on the page"
    return None


def check_absolute(url, fragment, doc_root, files):
    """None when an absolute link to tollgate's docs or packaged sources resolves (other
    sites are not checked), else why."""
    if url.startswith(DOCS_RS) or url + "/" == DOCS_RS:
        return check_doc_page(os.path.join(doc_root, "tollgate"), url[len(DOCS_RS):] or ".", fragment)
    if url.startswith(SOURCE):
        path = unquote(url[len(SOURCE):])
        if path not in files and not any(f.startswith(path.rstrip("/") + "/") for f in files):
            return "not in the package"
    return None


def check_readme(doc_root, files):
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    headings = {slug(h) for h in re.findall(r"^#+\s+(.*)$", prose, re.M)}
    errors = []
    for link in markdown_links(text):
        url, fragment = urldefrag(link)
        if not url:
            why = None if fragment in headings else "no such heading"
        elif not re.match(r"https?://", url):
            why = "relative (crates.io cannot resolve it)"
        else:
            why = check_absolute(url, fragment, doc_root, files)
        if why:
            errors.append(f"README.md: {link}: {why}")
    return errors


def check_docs(doc_root, files):
    errors = []
    crate = os.path.join(doc_root, "tollgate")
    for dirpath, _, names in os.walk(crate):
        for name in names:
            if not name.endswith(".html"):
                continue
            page = os.path.join(dirpath, name)
            text = open(page, encoding="utf-8").read()
            # Auto-trait and blanket impls carry other crates' docs, with their links.
            text = text.split('id="synthetic-implementations"')[0]
            for href in set(HREF.findall(text)):
                href = html.unescape(href)
                url, fragment = urldefrag(href)
                if re.match(r"[a-z]+:", href):
                    why = check_absolute(url, fragment, doc_root, files)
                    if why:
                        errors.append(f"{os.path.relpath(page, doc_root)}: {href}: {why}")
                    continue
                target = os.path.normpath(os.path.join(dirpath, unquote(url))) if url else page
                # Only links that stay inside tollgate's own pages (not its sources,
                # rustdoc's static files, or other crates' docs).
                if not target.startswith(crate + os.sep) and target != crate:
                    continue
                why = check_doc_page(dirpath, unquote(url) or name, fragment)
                if why:
                    errors.append(f"{os.path.relpath(page, doc_root)}: {href}: {why}")
    return errors


def main():
    doc_root = os.path.join(target_dir(), "doc")
    if not os.path.isfile(os.path.join(doc_root, "tollgate", "index.html")):
        sys.exit("no docs: run `cargo doc --no-deps --all-features` first")
    files = packaged()
    errors = check_readme(doc_root, files) + check_docs(doc_root, files)
    for e in errors:
        print(e)
    if errors:
        sys.exit(1)
    print("links: README and crate docs resolve")


if __name__ == "__main__":
    main()
