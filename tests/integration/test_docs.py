"""The reference documentation checked against what it documents: every RPC of the protos in
docs/api.md, every option of `moongate --help` in docs/operations.md, every metric a running
daemon exports in docs/operations.md — so that none is added without its documentation."""
import os
import re
import subprocess

from conftest import MOONGATE, ROOT


def read(*parts):
    with open(os.path.join(ROOT, *parts)) as f:
        return f.read()


def test_every_rpc_is_in_the_api_reference():
    api = read("docs", "api.md")
    missing = []
    for name in sorted(os.listdir(os.path.join(ROOT, "proto", "moongate", "v1"))):
        text = read("proto", "moongate", "v1", name)
        service = None
        for line in text.splitlines():
            m = re.match(r"\s*service (\w+)", line)
            if m:
                service = m.group(1)
            m = re.match(r"\s*rpc (\w+)\(", line)
            if m:  # Debug's too: what tests switch on is documented like the rest
                method = m.group(1)
                # the table names "moongate.v1.Service/Method", or a later method of the same
                # service in a row like "`Service/A`, `B`"
                if not re.search(r"moongate\.v1\.%s/[^|]*\b%s\b" % (service, method), api):
                    missing.append("%s/%s" % (service, method))
    assert not missing, "not in docs/api.md: %s" % ", ".join(missing)


def test_every_option_is_in_the_operations_reference():
    ops = read("docs", "operations.md")
    out = subprocess.run([MOONGATE, "--help"], capture_output=True, text=True).stdout
    options = re.findall(r"^  --([a-z0-9-]+)", out, re.M)
    assert len(options) > 50, out[:500]
    missing = [o for o in options if "--" + o not in ops and o not in ("help", "version")]
    assert not missing, "options not in docs/operations.md: %s" % ", ".join(missing)


def test_every_metric_is_in_the_operations_reference(daemon):
    ops = read("docs", "operations.md")
    names = set()
    for line in daemon.metrics().splitlines():
        m = re.match(r"# TYPE (moongate_\w+) ", line)
        if m:
            names.add(m.group(1))
    assert len(names) > 30
    missing = sorted(n for n in names if n not in ops)
    assert not missing, "metrics not in docs/operations.md: %s" % ", ".join(missing)


def test_the_readmes_test_time_is_the_one_measured_in_testing_md():
    readme = re.sub(r"\s+", " ", read("README.md"))
    testing = read("docs", "testing.md")
    said = re.search(r"`tests/run.sh` takes about (\d+) minutes", readme)
    measured = re.search(r"\*\*total\*\* \| \*\*\d+ \(about (\d+) minutes", testing)
    assert said and measured, "README or docs/testing.md no longer states the suite's time"
    assert said.group(1) == measured.group(1), "README says %s minutes, docs/testing.md %s" % (
        said.group(1), measured.group(1))


def slug(heading):
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as '-'."""
    h = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", h).replace(" ", "-")


def test_every_link_of_the_readme_and_the_docs_resolves():
    pages = ["README.md"] + ["docs/" + f for f in sorted(os.listdir(os.path.join(ROOT, "docs")))
                             if f.endswith(".md")]
    bad = []
    for page in pages:
        text = read(page)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # another site
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path)) if path \
                else os.path.join(ROOT, page)
            if not os.path.exists(full):
                bad.append("%s: %s" % (page, target))
            elif anchor and full.endswith(".md"):
                with open(full) as f:
                    heads = {slug(h) for h in re.findall(r"^#+ (.*)$", f.read(), re.M)}
                if anchor not in heads:
                    bad.append("%s: %s (no such heading)" % (page, target))
    assert not bad, "links that lead nowhere:\n" + "\n".join(bad)
