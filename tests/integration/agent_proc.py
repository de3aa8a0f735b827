"""An agent in a process of its own, for the agent tests: it names itself on a daemon, allocates
a remote-accessible buffer, says where it is (one JSON line) and then obeys lines on stdin:

  dump OFF LEN    prints the buffer's bytes there, in hex
  fill OFF HEX    writes them
  put AGENT ADDR LEN [PEER]   WRITEs its buffer's first LEN bytes to ADDR of AGENT
  get AGENT ADDR LEN [PEER]   READs them from there into its buffer
  again           frees the buffer and allocates another (a re-registration)
  quit            exits (its connection closes: the agent ends)

Usage: agent_proc.py SOCKET NAME PORT SIZE [TOKEN]
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "clients", "python"))
import moongate_client as mg  # noqa: E402


def main():
    sock, name, port, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    token = sys.argv[5] if len(sys.argv) > 5 else None
    c = mg.Client("unix:" + sock, token=token)
    info = c.register_agent(name, port)
    buf = c.allocate_buffer(size, remote_accessible=True)

    def say():
        print(json.dumps({"port": info.port, "address": buf.address, "segment": buf.segment.id}),
              flush=True)
    say()
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "dump":
            off, n = int(cmd[1]), int(cmd[2])
            print(bytes(buf.view[off:off + n]).hex(), flush=True)
        elif cmd[0] == "fill":
            data = bytes.fromhex(cmd[2])
            buf.view[int(cmd[1]):int(cmd[1]) + len(data)] = data
            print("ok", flush=True)
        elif cmd[0] in ("put", "get"):  # its buffer's first LEN bytes to / from an agent
            agent, addr, n = cmd[1], int(cmd[2]), int(cmd[3])
            peer = cmd[4] if len(cmd) > 4 else ""
            op = mg.write if cmd[0] == "put" else mg.read
            try:
                c.transfer([op(address=buf.address, peer=peer, agent=agent, remote_address=addr,
                               length=n)])
                print("ok", flush=True)
            except mg.Error as e:
                print("err %s %s" % (e.code.name, e.message), flush=True)
        elif cmd[0] == "again":
            buf.free()
            buf = c.allocate_buffer(size, remote_accessible=True)
            say()
        elif cmd[0] == "quit":
            break


if __name__ == "__main__":
    main()
