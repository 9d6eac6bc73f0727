#!/usr/bin/env python3
"""Extract plain English prose from the Python 3.11 documentation sources.

Source: Debian package `python3.11-doc` (bookworm), files
/usr/share/doc/python3.11/html/_sources/**/*.rst.txt, licensed under the
Python Software Foundation License Version 2 (see models/README.md).

Usage:
  apt-get download python3.11-doc && dpkg -x python3.11-doc_*.deb /tmp/pydoc
  python3 tools/corpus/extract_python_docs.py /tmp/pydoc/usr/share/doc/python3.11/html/_sources OUTDIR

Writes OUTDIR/train.txt and OUTDIR/heldout.txt (documents separated by blank lines,
one paragraph per line).  The split is deterministic: every document whose path hashes
into bucket 0 of 50 goes to heldout.txt.
"""
import hashlib
import os
import re
import sys

# Directives whose body is not prose (code, tables, machinery): skip line and body.
SKIP_BODY = {
    "code-block", "sourcecode", "code", "testcode", "testsetup", "testcleanup", "doctest",
    "testoutput", "productionlist", "literalinclude", "toctree", "index", "table",
    "csv-table", "list-table", "image", "figure", "highlight", "raw", "only", "include",
    "audit-event", "audit-event-table", "availability", "impl-detail", "grammar-snippet",
    "sectionauthor", "moduleauthor", "module", "currentmodule", "opcode", "cmdoption",
    "option", "envvar", "limited-api-list", "c:macro", "c:type", "c:var", "c:member",
    "tabularcolumns", "rubric", "centered", "hlist", "data-table", "math",
}
SKIP_DIRS = set()
SKIP_FILES = {"license.rst.txt", "copyright.rst.txt", "contents.rst.txt", "about.rst.txt"}

DIRECTIVE = re.compile(r"^(\s*)\.\.\s+([\w:-]+)::(.*)$")
COMMENT = re.compile(r"^(\s*)\.\.(\s|$)")
UNDERLINE = re.compile(r"^\s*([=\-~^\"'`#*+<>_.:])\1{2,}\s*$")
TABLE = re.compile(r"^\s*(\+[-=+]+\+|=+(\s+=+)+)\s*$")


def indent(s):
    return len(s) - len(s.lstrip(" "))


def inline(text):
    # :role:`title <target>` -> title ; :role:`~a.b.c` -> c ; :role:`x` -> x
    def role(m):
        body = m.group(1)
        mm = re.match(r"^(.*?)\s*<[^>]*>$", body, re.S)
        if mm and mm.group(1):
            body = mm.group(1)
        body = body.lstrip("!")
        if body.startswith("~"):
            body = body[1:].split(".")[-1]
        return body
    text = re.sub(r":[\w:+-]+:`([^`]*)`", role, text)
    text = re.sub(r"``([^`]*)``", r"\1", text)
    text = re.sub(r"`([^`<]*?)\s*<[^>]*>`__?", r"\1", text)
    text = re.sub(r"`([^`]*)`_{0,2}", r"\1", text)
    text = re.sub(r"\[#\w*\]_|\[\d+\]_", "", text)
    text = re.sub(r"\*\*([^*]+)\*\*", r"\1", text)
    text = re.sub(r"(?<![\w*])\*([^*\s][^*]*)\*(?![\w*])", r"\1", text)
    text = re.sub(r"\|(\w[\w-]*)\|", r"\1", text)
    text = text.replace("\\ ", "").replace("\\", "")
    text = re.sub(r"\s+", " ", text).strip()
    if text.endswith(" ::"):
        text = text[:-3] + "."
    elif text.endswith("::"):
        text = text[:-1]
    return text


def good(p):
    words = p.split()
    if len(words) < 6:
        return False
    letters = sum(c.isalpha() or c == " " for c in p)
    if letters < 0.8 * len(p):
        return False
    if any(t in p for t in (">>>", "...", "{", "}", "==", "->", "()", "__", "::")):
        return False
    if not p[0].isupper() or p[-1] not in ".!?:":
        return False
    try:
        p.encode("ascii")
    except UnicodeEncodeError:
        return False
    return True


def paragraphs(lines):
    out, cur = [], []
    skip_at = None          # skip lines with indent > skip_at (and blank lines) while set
    i = 0
    n = len(lines)
    while i < n:
        line = lines[i].rstrip("\n").replace("\t", "    ")
        if skip_at is not None:
            if not line.strip() or indent(line) > skip_at:
                i += 1
                continue
            skip_at = None
        if not line.strip():
            if cur:
                out.append(" ".join(cur))
                cur = []
            i += 1
            continue
        ind = indent(line)
        m = DIRECTIVE.match(line)
        if m:
            if cur:
                out.append(" ".join(cur)); cur = []
            name = m.group(2)
            if name in SKIP_BODY or name.startswith("c:"):
                skip_at = ind
            else:
                # drop directive line and its :option: lines; keep body prose
                i += 1
                while i < n and lines[i].strip().startswith(":") and indent(lines[i]) > ind:
                    i += 1
                continue
            i += 1
            continue
        if COMMENT.match(line):
            if cur:
                out.append(" ".join(cur)); cur = []
            skip_at = ind
            i += 1
            continue
        if UNDERLINE.match(line) or TABLE.match(line) or line.lstrip().startswith(("|", ">>>", "...")):
            # title: drop the collected title line(s)
            cur = []
            i += 1
            continue
        s = line.strip()
        if re.match(r"^([*+-]|#\.|\d+\.)\s+", s):
            if cur:
                out.append(" ".join(cur)); cur = []
            s = re.sub(r"^([*+-]|#\.|\d+\.)\s+", "", s)
        cur.append(s)
        if s.endswith("::"):
            out.append(" ".join(cur)); cur = []
            skip_at = ind
        i += 1
    if cur:
        out.append(" ".join(cur))
    return out


def main():
    src, dst = sys.argv[1], sys.argv[2]
    os.makedirs(dst, exist_ok=True)
    files = []
    for root, dirs, names in os.walk(src):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for nm in sorted(names):
            if nm.endswith(".rst.txt") and nm not in SKIP_FILES:
                files.append(os.path.join(root, nm))
    files.sort()
    train, held = [], []
    for f in files:
        rel = os.path.relpath(f, src)
        with open(f, encoding="utf-8", errors="replace") as fh:
            paras = [inline(p) for p in paragraphs(fh.readlines())]
        paras = [p for p in paras if good(p)]
        if not paras:
            continue
        doc = "\n".join(paras)
        bucket = int(hashlib.sha256(rel.encode()).hexdigest(), 16) % 50
        (held if bucket == 0 else train).append(doc)
    for name, docs in (("train.txt", train), ("heldout.txt", held)):
        with open(os.path.join(dst, name), "w", encoding="utf-8") as fh:
            fh.write("\n\n".join(docs) + "\n")
        print(name, len(docs), "docs", sum(len(d) for d in docs), "chars")


if __name__ == "__main__":
    main()
