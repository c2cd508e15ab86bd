"""The optional compiled converter of flowwarden.spark (everything else is in pyproject.toml).

``flowwarden.spark.convert._native`` turns raw change-event BSON into Arrow buffers in one pass. It is
optional: without a C compiler (it needs GCC or Clang), on a big-endian or a 32-bit machine the
build skips it, the install still succeeds, and flowwarden.spark converts events in Python with the same
output.
"""

import sys

from setuptools import Extension, setup

native = Extension(
    "flowwarden.spark.convert._native",
    sources=["src/flowwarden/spark/convert/_native.c"],
    extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
    optional=True,
)

setup(ext_modules=[native] if sys.byteorder == "little" and sys.maxsize > 2**32 else [])
