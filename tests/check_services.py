#!/usr/bin/env python3
"""Services sit side by side: none includes another's header or calls a function another
defines, and the core and the ops pages call none of them. The core calls nothing of the ops
pages, and each header of the core keeps to its readers.

A service is named by its files, gateway/svc/svc_NAME.c and svc_NAME_*.c (with svc_NAME.h and
svc_NAME_*.h): the text after "svc_" up to the next "_" or ".". What several services use is
the core's (gateway/core: mg_service.h, mg_peer_rpc.h), never a service's. Checked:

  1. a service file includes no other service's svc_*.h, and no file of gateway/core,
     gateway/ops or the helpers beside the services (gateway/svc/mg_*) includes any;
  2. a service file names no function or object another service defines (its non-static
     definitions at file level: functions, descriptors such as mg_svc_NAME), and no file of
     gateway/core, gateway/ops or the helpers names any, nor calls an mg_svc_* function;
  3. no file of gateway/core or gateway/svc names a function or object that a file of
     gateway/ops defines, or includes a header of gateway/ops: the daemon reaches the ops pages
     only through their descriptor, listed in gateway/mg_services.c;
  4. no file of gateway/ops includes the core's internals (mg_server_int.h, mg_tls.h, or a
     header of gateway/core that includes one of them): ops uses the handler API (mg_gateway.h)
     and the core's own header (mg_core.h);
  5. no file of gateway/svc includes the core's own header (mg_core.h) or its internals: the
     services use the handler API (mg_gateway.h) and mg_service.h.
     Comments and string literals are not looked at.

    tests/check_services.py     prints each offence (file:line); exits 1 when there is one
"""
import glob
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
IDENT = re.compile(r"[A-Za-z_]\w*")
KEYWORDS = {"static", "inline", "extern", "typedef", "const", "struct", "union", "enum",
            "unsigned", "signed", "void", "int", "char", "long", "short", "double", "float",
            "__attribute__", "volatile", "return", "sizeof", "if", "for", "while", "switch"}


def service_of(path):
    """NAME of gateway/svc/svc_NAME[_...].{c,h}, or None for any other file."""
    base = os.path.basename(path)
    m = re.match(r"svc_([A-Za-z0-9]+)[_.]", base)
    return m.group(1) if m and os.path.dirname(path).endswith(os.path.join("gateway", "svc")) \
        else None


def strip(text):
    """The code with comments and string and character literals blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def definitions(code):
    """Names of the non-static functions and objects defined at file level in `code`
    (stripped): what a file gives the others."""
    code = "\n".join("" if l.lstrip().startswith("#") else l for l in code.split("\n"))
    found, head, depth, body_of_function = [], [], 0, False

    def statement(h):  # a declaration or definition ending in ';' (its braces emptied)
        words = IDENT.findall(h)
        if not words or {"static", "extern", "typedef"} & set(words):
            return
        if "=" in h:  # an object with an initializer: the name before '='
            before = IDENT.findall(h.split("=")[0])
            if before:
                found.append(before[-1])
        elif "(" not in h and "{" not in h and not (
                words[0] in ("struct", "union", "enum") and len(words) == 2):
            found.append(words[-1])  # a tentative definition (int x;), not struct x;

    for ch in code:
        if ch == "{":
            if depth == 0:
                h = "".join(head)
                m = re.search(r"([A-Za-z_]\w*)\s*\(", h)
                body_of_function = "(" in h and "=" not in h and m is not None
                if body_of_function:
                    words = set(IDENT.findall(h))
                    if "static" not in words and m.group(1) not in KEYWORDS:
                        found.append(m.group(1))
                    head = []
                else:
                    head.append("{")
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0 and not body_of_function:
                head.append("}")
        elif depth == 0:
            if ch == ";":
                statement("".join(head))
                head = []
            else:
                head.append(ch)
    return found


CORE_INTERNAL = ("mg_server_int.h", "mg_tls.h")  # the core's internals: core files only
CORE_OWN = CORE_INTERNAL + ("mg_core.h",)  # with the core's own header: no service file
INCLUDE = re.compile(r'\s*#\s*include\s+"([^"]+)"')


def includes(path):
    """(line number, name) of each quoted #include of a file."""
    return [(no, m.group(1)) for no, line in enumerate(open(path).read().split("\n"), 1)
            for m in [INCLUDE.match(line)] if m]


def closure(core_headers, names):
    """The names, and every header of gateway/core that includes one of them, directly or
    through another: what a file may not include when it may not include `names`."""
    out, grew = set(names), True
    while grew:
        grew = False
        for h in core_headers:
            base = os.path.basename(h)
            if base not in out and any(n in out for _, n in includes(h)):
                out.add(base)
                grew = True
    return out


def layers(gw, files, code, rel):
    """Checks 3 to 5: the offences, as lines."""
    core_dir, ops_dir, svc_dir = (os.path.join(gw, d) + os.sep for d in ("core", "ops", "svc"))
    core_h = [f for f in files if f.startswith(core_dir) and f.endswith(".h")]
    ops_files = [f for f in files if f.startswith(ops_dir)]
    ops_headers = {os.path.basename(f) for f in ops_files if f.endswith(".h")}
    ops_defs = {}
    for f in ops_files:
        if f.endswith(".c"):
            for name in definitions(code[f]):
                ops_defs.setdefault(name, f)
    internal, own = closure(core_h, CORE_INTERNAL), closure(core_h, CORE_OWN)
    bad = []
    for f in files:
        in_ops, in_svc = f.startswith(ops_dir), f.startswith(svc_dir)
        if not (in_ops or in_svc or f.startswith(core_dir)):
            continue
        for no, name in includes(f):
            if not in_ops and name in ops_headers:
                bad.append("%s:%d includes %s: only ops' own files may" % (rel(f), no, name))
            if in_ops and name in internal:
                bad.append("%s:%d includes %s, the core's internals: ops uses mg_gateway.h "
                           "and mg_core.h" % (rel(f), no, name))
            if in_svc and name in own:
                bad.append("%s:%d includes %s, the core's own: a service uses mg_gateway.h "
                           "and mg_service.h" % (rel(f), no, name))
        if in_ops:
            continue
        for no, line in enumerate(code[f].split("\n"), 1):
            if line.lstrip().startswith("#") and "include" in line:
                continue
            for name in set(IDENT.findall(line)):
                if name in ops_defs:
                    bad.append("%s:%d names %s, which %s defines: ops is reached only through "
                               "its descriptor (mg_services.c)" % (rel(f), no, name,
                                                                   rel(ops_defs[name])))
    return bad


def main():
    gw = os.path.join(ROOT, "gateway")
    files = sorted(glob.glob(os.path.join(gw, "**", "*.[ch]"), recursive=True))
    code = {f: strip(open(f).read()) for f in files}
    services = [f for f in files if service_of(f)]
    others = [f for f in files if not service_of(f) and (
        f.startswith(os.path.join(gw, "core") + os.sep) or
        f.startswith(os.path.join(gw, "ops") + os.sep) or
        f.startswith(os.path.join(gw, "svc") + os.sep))]
    owner = {}  # name -> the file that defines it
    for f in services:
        if f.endswith(".c"):
            for name in definitions(code[f]):
                owner.setdefault(name, f)
    bad = []

    def rel(f):
        return os.path.relpath(f, ROOT)

    for f in services + others:
        mine = service_of(f)
        raw = open(f).read().split("\n")
        for no, line in enumerate(code[f].split("\n"), 1):
            m = re.match(r'\s*#\s*include\s+"(svc_[^"]+)"', raw[no - 1])
            if m and service_of(os.path.join(gw, "svc", m.group(1))) != mine:
                bad.append("%s:%d includes %s, another service's header" %
                           (rel(f), no, m.group(1)) if mine else
                           "%s:%d includes %s: only a service's own files may" %
                           (rel(f), no, m.group(1)))
            if line.lstrip().startswith("#") and "include" in line:
                continue
            for name in set(IDENT.findall(line)):
                o = owner.get(name)
                if o and service_of(o) != mine:
                    bad.append("%s:%d names %s, which %s defines" % (rel(f), no, name, rel(o)))
            for name in re.findall(r"\b(mg_svc_\w+)\s*\(", line) if not mine else []:
                if name not in owner:  # one no service file defines (a declaration's)
                    bad.append("%s:%d calls %s: the core calls no service" % (rel(f), no, name))
    bad += layers(gw, files, code, rel)
    for b in sorted(set(bad)):
        print(b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
