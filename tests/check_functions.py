#!/usr/bin/env python3
"""No function under gateway/ or engine/ longer than 120 lines, but main(); no file under
gateway/ longer than 900 lines, and the two services that only translate for the engine's
machine held lower (FILE_LIMITS); the segment registry (engine/src/mg_segment.c) under 900.

No branch on a segment's kind outside the kinds' own files (engine/src/mg_seg_kind.h): the
values of mg_seg_source (read from moongate/segment.h) appear only in the header that defines
them, in a kind's file (one that defines a `const mg_seg_kind` table), in the registry's table
selection (`[MG_SEG_X] = &mg_seg_x`) and where a registration names the kind it wants
(`source = MG_SEG_ANON;`); and no code under engine/, gateway/, client/ or common/ compares a
source, switches on one, or compares a kind's table (`== &mg_seg_x`). What a kind allows is
asked of the engine (mg_segment_caps, mg_segment_allows, mg_seg_source_caps).

How a function is counted: the files are formatted by .clang-format (Linux braces), so a
function body opens with "{" alone at column 0 and closes with "}" alone at column 0; its
length is the lines from that "{" to that "}", both included (the signature above it is not
counted). A function waiting to be cut may be listed in PENDING with the length it may not grow
past; none is today.

    tests/check_functions.py [LIMIT]     prints the offenders; exits 1 when there is one
"""
import glob
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
PENDING = {}  # (path, function): a length it may not grow past, while it waits to be cut
GATEWAY_FILE_LIMIT = 900
FILE_LIMITS = {"gateway/svc/svc_transfer.c": 700, "gateway/svc/svc_pool.c": 500,
               "engine/src/mg_segment.c": 900}
KIND_HEADER = "engine/include/moongate/segment.h"


def functions(path):
    lines = open(path).read().split("\n")
    start = None
    for i, line in enumerate(lines):
        if line == "{" and i > 0:
            j = i - 1
            while j > 0 and "(" not in lines[j]:
                j -= 1
            m = re.search(r"(\w+)\s*\(", lines[j])
            start, name = i, m.group(1) if m else "?"
        elif line == "}" and start is not None:
            yield name, start + 1, i - start + 1
            start = None


def kind_branches():
    """Lines that branch on a segment's kind outside the kinds' files (see the docstring)."""
    header = open(os.path.join(ROOT, KIND_HEADER)).read()
    m = re.search(r"typedef enum \{([^}]*)\} mg_seg_source;", header)
    values = re.findall(r"\b(MG_SEG_\w+)\s*=", m.group(1)) if m else []
    if not values:
        return ["%s: no mg_seg_source enum found" % KIND_HEADER]
    named = re.compile(r"\b(%s)\b" % "|".join(values))
    allowed = [re.compile(r"\[(%s)\]\s*=\s*&mg_seg_\w+" % "|".join(values)),
               re.compile(r"\bsource\s*=\s*(%s)\s*[;,]" % "|".join(values))]
    branch = re.compile(r"\bsource\s*[!=]=|[!=]=\s*[\w.>-]*\bsource\b|switch\s*\([^)]*source"
                        r"|[!=]=\s*&mg_seg_\w+|&mg_seg_\w+\s*[!=]=")
    bad = []
    paths = []
    for top in ("engine", "gateway", "client", "common"):
        for ext in ("c", "h"):
            paths += glob.glob(os.path.join(ROOT, top, "**", "*." + ext), recursive=True)
    for path in sorted(paths):
        rel = os.path.relpath(path, ROOT)
        text = open(path).read()
        if rel == KIND_HEADER or re.search(r"^const mg_seg_kind mg_seg_\w+ = \{", text, re.M):
            continue  # the enum's own header, or a kind's file
        for i, line in enumerate(text.split("\n"), 1):
            code = line.split("//")[0]
            if code.lstrip().startswith(("*", "/*")):
                continue  # a comment
            rest = code
            for a in allowed:
                rest = a.sub("", rest)
            if named.search(rest) or branch.search(code):
                bad.append("%s:%d branches on a segment's kind outside its kind's file: %s"
                           % (rel, i, line.strip()))
    return bad


def main():
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 120
    bad = []
    for path in sorted(glob.glob(os.path.join(ROOT, "gateway", "**", "*.c"), recursive=True) +
                       glob.glob(os.path.join(ROOT, "engine", "src", "*.c"))):
        rel = os.path.relpath(path, ROOT)
        if rel.startswith("gateway") or rel in FILE_LIMITS:
            nlines = open(path).read().count("\n")
            most = FILE_LIMITS.get(rel, GATEWAY_FILE_LIMIT)
            if nlines > most:
                bad.append("%s is %d lines (at most %d)" % (rel, nlines, most))
        for name, line, n in functions(path):
            allowed = PENDING.get((rel, name), 999999 if name == "main" else limit)
            if n > allowed:
                bad.append("%s:%d %s() is %d lines (at most %d)" % (rel, line, name, n, allowed))
    bad += kind_branches()
    for b in bad:
        print(b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
