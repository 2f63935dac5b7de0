"""Build configuration beyond pyproject.toml: the optional compiled kernels.

``packload/core/_resize.c`` is built as the extension module ``packload.core._resize`` when a C compiler is
present; without one the build goes on without it (``optional=True``) and packload resizes with
torch instead (same pixels, slower on x86-64 with AVX2; see packload/core/resize_kernel.py).

``packload/core/_jpeg_boxes.c`` is built as ``packload.core._jpeg_boxes`` when libjpeg-turbo's TurboJPEG
headers and library are installed as well (Debian/Ubuntu: ``libturbojpeg0-dev``); without them the
build goes on without it and ``PackLoader`` decodes JPEGs one by one through simplejpeg (same
pixels; see packload/core/jpeg_kernel.py).
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("packload.core._resize", ["packload/core/_resize.c"], optional=True, extra_compile_args=["-O3"]),
    Extension("packload.core._jpeg_boxes", ["packload/core/_jpeg_boxes.c"], optional=True,
              extra_compile_args=["-O3"], libraries=["turbojpeg"]),
])
