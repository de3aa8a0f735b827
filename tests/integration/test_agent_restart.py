"""Agents' ports across a restart of their daemon: the daemon keeps its agents in
<shm-dir>/.moongate.agents, and the daemon started after it on the same shm directory holds each
agent's port for --agent-port-hold seconds, so that the serving processes reconnecting get
their ports back and nobody takes them meanwhile. Covered: after SIGKILL and after SIGTERM (a
drain: the agents that end with their connections as the daemon stops are still held), a new
agent is not assigned a held port, another agent asking for one is refused ALREADY_EXISTS naming
the hold and the option, the agent itself gets its port back asking for 0 or for the port; with
--agent-port-hold 1 a held port is free for anyone once the hold passed; a damaged file is
logged and ignored; a file that cannot be written is logged once per cause and counted.
"""
import os
import time

import grpc
import pytest

import conftest

os.environ.setdefault("MOONGATE_PYGEN", conftest.GEN)
import moongate_client as mg  # noqa: E402

STATE = ".moongate.agents"


@pytest.fixture(autouse=True)
def no_reconnect(monkeypatch):
    """The daemon's holds alone: the clients here do not come back by themselves (their
    libraries would register the agents again the moment the daemon is up: test_restart.py)."""
    monkeypatch.setenv("MOONGATE_RECONNECT_S", "0")


def client(d):
    return mg.Client("unix:" + d.sock)


def state(d):
    """The agents of tenant "default" the state file lists, {name: port} ({} without a file,
    None for one a daemon did not write)."""
    try:
        with open(os.path.join(d.shm, STATE)) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return {}
    if not lines or lines[0] != "moongate-agents 1":
        return None
    out = {}
    for line in lines[1:]:
        words = line.split(" ")
        if len(words) != 4:
            return None
        assert words[:2] == ["agent", "default"], line
        out[words[2]] = int(words[3])
    return out


def written(d, want):
    """Waits until the state file lists exactly `want` ({name: port}): the daemon writes it
    on a worker after each change."""
    deadline = time.monotonic() + 30
    while state(d) != want:
        assert time.monotonic() < deadline, "state file: %s, not %s" % (state(d), want)
        time.sleep(0.02)


def restarted(d, how):
    """d stopped (SIGKILL or SIGTERM) and started again: the same arguments, shm directory and
    ports."""
    if how == "kill":
        d.kill()
    else:
        assert d.stop() == 0, d.read_log()
    d.start()
    d.killed = False  # the new process must end well


def refused(c, name, port):
    """The message of the ALREADY_EXISTS that registering agent `name` with `port` gets."""
    with pytest.raises(mg.Error) as e:
        c.register_agent(name, port=port)
    assert e.value.code == grpc.StatusCode.ALREADY_EXISTS, e.value.message
    return e.value.message


def test_ports_are_held_across_a_kill_and_a_drain(make_daemon, tmp_path):
    # a small range, so that a daemon that held nothing would hand the first port out again
    d = make_daemon("--shm-dir", str(tmp_path / "shm"), "--agent-ports", "20000-20009")
    c1 = client(d)
    a = c1.register_agent("a").port
    b = c1.register_agent("b", port=20005).port
    assert (a, b) == (20000, 20005)
    written(d, {"a": a, "b": b})
    restarted(d, "kill")
    c1.close()  # its connection is gone (a new channel of this process would share it)

    c2 = client(d)
    c = c2.register_agent("c").port
    assert c not in (a, b)
    msg = refused(c2, "x", a)
    assert 'port %d is held for agent "a"' % a in msg and "--agent-port-hold" in msg, msg
    assert "before this daemon restarted" in msg, msg
    assert "held for agent" in refused(c2, "y", b)
    assert c2.register_agent("a").port == a  # port 0: its own again
    assert d.metric("moongate_agents_held") == 1  # b's
    # the file keeps the hold not taken up yet, for a restart before b comes back
    written(d, {"a": a, "c": c, "b": b})

    # a drain: a and c end with their connection as the daemon stops, and are held all the same
    restarted(d, "term")
    c2.close()
    c3 = client(d)
    e = c3.register_agent("e").port
    assert e not in (a, b, c)
    msg = refused(c3, "x", a)
    assert 'port %d is held for agent "a"' % a in msg and "--agent-port-hold" in msg, msg
    assert c3.register_agent("a").port == a
    assert c3.register_agent("b", port=b).port == b  # asking for its port: its own
    assert c3.register_agent("c").port == c
    assert d.metric("moongate_agents_held") == 0
    assert "event=agent_ports_held" in d.read_log() and "ports=3" in d.read_log()
    assert d.metric("moongate_agents_state_writes_total", result="failed") == 0
    c3.close()


def test_a_held_port_is_free_once_the_hold_passed(make_daemon, tmp_path):
    d = make_daemon("--shm-dir", str(tmp_path / "shm"), "--agent-port-hold", "1")
    c1 = client(d)
    a = c1.register_agent("a").port
    written(d, {"a": a})
    restarted(d, "kill")
    c1.close()
    log = d.read_log()
    assert "event=agent_ports_held" in log and "ports=1 for_s=1" in log, log
    with client(d) as c2:
        # held first (the daemon started a moment ago), then free: asked until it is
        deadline = time.monotonic() + 30
        while True:
            try:
                assert c2.register_agent("x", port=a).port == a
                break
            except mg.Error as e:
                assert e.code == grpc.StatusCode.ALREADY_EXISTS, e.message
                assert 'held for agent "a"' in e.message, e.message
                assert time.monotonic() < deadline, e.message
                time.sleep(0.05)
        # "a" comes back too late: it is an agent like any other, with another port
        assert c2.register_agent("a").port != a
        written(d, {"x": a, "a": c2.describe_agent("a").port})


@pytest.mark.parametrize("text,why", [
    (b"garbage\n", "line 1: not a moongate agents file"),
    (b"moongate-agents 2\nagent default a 20000\n", "line 1: version 2"),
    (b"moongate-agents 1\nagent default a 20000\nagent default b\n", "line 3: the agent's name"),
    (b"moongate-agents 1\nagent default a 20000", "line 2: cut short"),
])
def test_a_damaged_state_file_is_ignored(make_daemon, tmp_path, text, why):
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / STATE).write_bytes(text)
    d = make_daemon("--shm-dir", str(shm), "--agent-ports", "20000-20009")
    log = d.read_log()
    assert "event=agents_state_ignored" in log and STATE in log and why in log, log
    with client(d) as c:
        assert c.register_agent("x", port=20000).port == 20000  # nothing held
        written(d, {"x": 20000})


def test_a_state_file_that_cannot_be_written_is_logged_once_and_counted(make_daemon, tmp_path):
    shm = tmp_path / "shm"
    d = make_daemon("--shm-dir", str(shm))
    (shm / (STATE + ".tmp")).mkdir()  # where the daemon writes the new file first

    def failures(n):
        deadline = time.monotonic() + 30
        while (d.metric("moongate_agents_state_writes_total", result="failed") or 0) < n:
            assert time.monotonic() < deadline, d.read_log()
            time.sleep(0.02)
    with client(d) as c:
        c.register_agent("a")
        failures(1)
        c.register_agent("b")
        failures(2)  # the agents are served all the same
        assert d.metric("moongate_agents") == 2
        log = d.read_log()
        assert log.count("event=agents_state_write_failed") == 1, log  # once for the cause
        assert "step=open" in log and STATE in log, log
        (shm / (STATE + ".tmp")).rmdir()
        c.register_agent("c")
        written(d, {"a": c.describe_agent("a").port, "b": c.describe_agent("b").port,
                    "c": c.describe_agent("c").port})
        # said by the loop once the worker's write is back: after the file is in place
        deadline = time.monotonic() + 30
        while "event=agents_state_written" not in d.read_log():
            assert time.monotonic() < deadline, d.read_log()
            time.sleep(0.02)
