"""docs/runbook.md's curl cookbook, run: every `sh` block of the page against a real daemon
over TLS with a bearer token, as a bash script that stops at the first failing command."""
import hashlib
import os
import re
import subprocess

import pytest

from conftest import ROOT

TOKEN = "runbook-token-0123456789"


def blocks():
    with open(os.path.join(ROOT, "docs", "runbook.md")) as f:
        text = f.read()
    return re.findall(r"```sh\n(.*?)```", text, re.S)


def test_the_page_has_runnable_blocks():
    assert len(blocks()) >= 8


@pytest.fixture(scope="module")
def env(certs, tmp_path_factory):
    from conftest import Daemon
    work = str(tmp_path_factory.mktemp("runbook"))
    auth = os.path.join(work, "auth")
    with open(auth, "w") as f:
        f.write("token sha256:%s ops\n" % hashlib.sha256(TOKEN.encode()).hexdigest())
    header = os.path.join(work, "auth-header")
    with open(header, "w") as f:
        f.write("authorization: Bearer %s\n" % TOKEN)
    d = Daemon(certs, work, ("--allow-anonymous=false", "--auth-file", auth,
                             "--pool-bytes", "8M")).start()
    yield dict(os.environ, CTL=d.tls, OPS="%s:%d" % (d.host, d.ops_port),
               CA=os.path.join(certs, "ca.pem"), AUTH=header)
    assert d.stop() == 0, d.read_log()


@pytest.mark.parametrize("index", range(len(blocks())))
def test_cookbook_block(env, index):
    script = blocks()[index]
    p = subprocess.run(["bash", "-euo", "pipefail", "-c", script], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, "block %d failed (%d):\n%s\nstdout: %s\nstderr: %s" % (
        index, p.returncode, script, p.stdout[-1500:], p.stderr[-1500:])
