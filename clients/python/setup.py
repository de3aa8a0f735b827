"""The moongate Python package: `pip install --no-build-isolation clients/python` (in a venv made
with --system-site-packages: grpcio and protobuf come from Debian). The stubs of moongate's
protos are generated at build time (python3-grpc-tools) and shipped inside the package."""
import os
import shutil
import sys
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class build_py_with_stubs(build_py):
    def run(self):
        super().run()
        sys.path.insert(0, HERE)
        from gen_stubs import generate
        gen = tempfile.mkdtemp(prefix="mgstubs-")
        try:
            generate(gen)
            dst = os.path.join(self.build_lib, "moongate", "v1")
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(os.path.join(gen, "moongate", "v1"), dst)
        finally:
            shutil.rmtree(gen)


setup(
    name="moongate",
    version="0.1.0",
    description="Client of the moongate memory-transfer daemon; Mooncake's TransferEngine and "
                "NIXL's agent APIs",
    packages=["moongate", "moongate.compat"],
    package_data={"moongate.compat": ["shim/mooncake/*.py", "shim/nixl/*.py"]},
    py_modules=["moongate_client"],
    python_requires=">=3.9",
    cmdclass={"build_py": build_py_with_stubs},
)
