"""Build tqstore; the C record path (tqstore._native._frames) is optional.

Metadata lives in pyproject.toml.  If the extension does not compile (no compiler, no
Python headers), a warning is printed and tqstore installs without it: the package then
uses the pure-Python record path (tqstore/_native/_pure.py).
"""
import os
import re
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def read_version():
    with open(os.path.join(HERE, "tqstore", "_version.py"), encoding="utf-8") as f:
        m = re.search(r'^__version__\s*=\s*["\']([^"\']+)["\']', f.read(), re.M)
    if not m:
        raise RuntimeError("cannot find __version__ in tqstore/_version.py")
    return m.group(1)


WARNING = """
************************************************************************
WARNING: the tqstore C extension (tqstore._native._frames) could not be
built ({error}).
tqstore will install and work with its pure-Python record path, which is
slower. Install a C compiler and the Python development headers, then
reinstall, to get the native path.
************************************************************************
"""


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing when the extension does not compile."""

    def build_extensions(self):
        ctype = self.compiler.compiler_type
        for ext in self.extensions:
            if ctype == "msvc":
                ext.extra_compile_args = ["/O2"]
            else:
                ext.extra_compile_args = ["-O3", "-Wall", "-fno-strict-aliasing"]
        self._failed = []
        super().build_extensions()
        # drop what did not build, so that nothing tries to copy or install it
        self.extensions = [ext for ext in self.extensions if ext not in self._failed]

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:  # CompileError, LinkError, DistutilsExecError, ...
            self._failed.append(ext)
            self._warn(e)

    def run(self):
        try:
            super().run()
        except Exception as e:  # no compiler at all (DistutilsPlatformError, ...)
            self._warn(e)

    @staticmethod
    def _warn(error):
        sys.stderr.write(WARNING.format(error=str(error).strip() or type(error).__name__))


setup(
    name="tqstore",
    version=read_version(),
    packages=find_packages(include=["tqstore*"]),
    package_data={"tqstore": ["py.typed"]},
    ext_modules=[
        Extension(
            "tqstore._native._frames",
            sources=["tqstore/_native/_frames.c"],
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt},
    zip_safe=False,
)
