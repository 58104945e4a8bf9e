#!/usr/bin/env python3
"""The crate's public API as rustdoc documents it: one line per public item (its kind
and path), then one indented line per method, variant, field or associated item on its
page. CI compares it with the checked-in .ci/public-api.txt, so a change to the public API
is made on purpose and shows in review.

    python3 .ci/public_api.py            # print the list (after `cargo doc --all-features`)
    python3 .ci/public_api.py --check    # exit 1, with a diff, when it differs
    python3 .ci/public_api.py --write    # write .ci/public-api.txt
"""
import difflib
import html
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DOC = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "doc", "tollgate")
LIST = os.path.join(ROOT, ".ci", "public-api.txt")
KINDS = {"struct", "enum", "trait", "fn", "type", "constant", "macro", "static", "union", "traitalias"}
MEMBER = re.compile(r'id="((?:method|tymethod|variant|structfield|associatedtype|associatedconstant)\.[A-Za-z0-9_]+)"')


def items():
    page = open(os.path.join(DOC, "all.html"), encoding="utf-8").read()
    for href in sorted(set(re.findall(r'<li><a href="([^"]+\.html)">', page))):
        parts = href.split("/")
        kind, name = parts[-1].split(".", 1)
        if kind not in KINDS:
            continue
        path = "::".join(parts[:-1] + [name[: -len(".html")]])
        yield kind, path, os.path.join(DOC, href)


def api():
    lines = []
    for kind, path, file in items():
        lines.append(f"{kind} {path}")
        text = open(file, encoding="utf-8").read()
        # Members of the item itself, not of the blanket and auto-trait impls below them.
        text = text.split('id="synthetic-implementations"')[0].split('id="blanket-implementations"')[0]
        for member in sorted(set(MEMBER.findall(text))):
            lines.append("    " + html.unescape(member))
    return lines


def main():
    lines = api()
    if "--write" in sys.argv:
        with open(LIST, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        return 0
    if "--check" in sys.argv:
        want = open(LIST, encoding="utf-8").read().splitlines()
        if want != lines:
            sys.stdout.writelines(difflib.unified_diff([l + "\n" for l in want], [l + "\n" for l in lines], LIST, "rustdoc"))
            print("the public API changed: if on purpose, run `python3 .ci/public_api.py --write` and commit the list")
            return 1
        print(f"public API as listed: {sum(1 for l in lines if not l.startswith(' '))} items")
        return 0
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
