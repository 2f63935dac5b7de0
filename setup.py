"""Build configuration beyond pyproject.toml: the optional compiled resize kernel.

``packload/core/_resize.c`` is built as the extension module ``packload.core._resize`` when a C compiler is
present; without one the build goes on without it (``optional=True``) and packload resizes with
torch instead (same pixels, slower on x86-64 with AVX2; see packload/core/resize_kernel.py).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("packload.core._resize", ["packload/core/_resize.c"], optional=True,
                             extra_compile_args=["-O3"])])
