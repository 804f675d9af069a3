"""The optional compiled kernels, `compatfs._accel` (compatfs/accel_c/, one C file a job).

Built where a C compiler and Python's headers are at hand; where they are
not, the build goes on without it (a warning, never a failure) and compatfs
runs on its numpy kernels, which give the same bytes (see compatfs/translate/accel.py).
Everything else about the package is in pyproject.toml.
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext that leaves out an extension it cannot build."""

    def run(self):
        try:
            super().run()
        except Exception as e:  # no compiler at all, no headers
            self.warn(f"compatfs._accel not built ({e}): the numpy kernels are used")

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:
            self.warn(f"{ext.name} not built ({e}): the numpy kernels are used")


ACCEL = [
    f"compatfs/accel_c/{job}.c"
    for job in ("module", "repack", "gather", "folders", "listings", "polling", "readgate", "stores", "ending")
]

setup(
    ext_modules=[
        Extension(
            "compatfs._accel", ACCEL, depends=["compatfs/accel_c/accel.h"], extra_compile_args=["-O3"], optional=True
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
