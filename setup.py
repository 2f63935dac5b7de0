"""Build configuration beyond pyproject.toml: the optional compiled kernels, built with a C compiler alone.

``packload/core/_resize.c`` is built as the extension module ``packload.core._resize``; without a C
compiler the build goes on without it (``optional=True``) and packload resizes with torch instead
(same pixels, slower on x86-64 with AVX2; see packload/core/resize_kernel.py).

``packload/core/_jpeg_boxes.c`` is built as ``packload.core._jpeg_boxes``, the batch decoder that
decodes only each crop's region. It is compiled against the libjpeg API headers in
packload/core/libjpeg/ and linked to no library: at run time it uses the libjpeg-turbo that Pillow's
wheels carry (or a system libjpeg-turbo), found by packload/core/jpeg_kernel.py. Without a C compiler,
or without a usable libjpeg-turbo at run time, ``PackLoader`` decodes JPEGs one by one instead.
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("packload.core._resize", ["packload/core/_resize.c"], optional=True, extra_compile_args=["-O3"]),
    Extension("packload.core._jpeg_boxes", ["packload/core/_jpeg_boxes.c"], optional=True,
              extra_compile_args=["-O3"],
              depends=["packload/core/libjpeg/jpeglib.h", "packload/core/libjpeg/jmorecfg.h",
                       "packload/core/libjpeg/jconfig.h"]),
])
