"""Build configuration beyond pyproject.toml: the optional compiled resize kernel.

``loaders/_resize.c`` is built as the extension module ``loaders._resize`` when a C compiler is
present; without one the build goes on without it (``optional=True``) and packload resizes with
torch instead (same pixels, about 3× slower on x86-64 with AVX2; see loaders/resize_kernel.py).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("loaders._resize", ["loaders/_resize.c"], optional=True,
                             extra_compile_args=["-O3"])])
