/* packload's compiled batch decoder (built as the optional extension module packload.core._jpeg_boxes when
 * libjpeg-turbo's TurboJPEG headers and library are present; packload/core/jpeg_kernel.py calls it
 * through ctypes and packload decodes JPEGs one by one with simplejpeg when it was not built).
 *
 * One call decodes, crops, resizes and mirrors a whole batch of JPEG records, so a caller gives up
 * the GIL once for the batch instead of several times per image (a training loop that holds the GIL
 * makes every hand-back wait; benchmarks/bench_gil.py). Each record is decoded by TurboJPEG exactly
 * as simplejpeg.decode_jpeg(colorspace="RGB", min_height=..., min_width=...) decodes it: the same
 * API calls, flags and output size, so the same pixels; its box is resampled by the resize kernel
 * (packload/core/_resize.c, reached through a function pointer the caller passes: one kernel, one
 * weights cache) or copied when it is already the output's size.
 *
 * A record this code does not take (not a JPEG, a size other than the index's, CMYK, any TurboJPEG
 * warning or error) is left undone, and the caller takes it through its general route, which
 * decides what happens to it (PIL, or an error naming the record).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>
#include <turbojpeg.h>

/* rs_resize of packload/core/_resize.c */
typedef int (*resize_fn)(const uint8_t *src, long sstride, int ih, int iw, uint8_t *dst, long dstride, int oh,
                         int ow, const void *wh, const void *wv, uint8_t *scratch, size_t scratch_size);

enum { G_HEIGHT, G_WIDTH, G_DECODE_HEIGHT, G_DECODE_WIDTH, G_TOP, G_LEFT, G_BOX_HEIGHT, G_BOX_WIDTH, G_FIELDS };

static void mirror_rows(uint8_t *dst, long dstride, int rows, int cols) {
    for (int y = 0; y < rows; y++) {
        uint8_t *a = dst + y * dstride, *b = a + (long)(cols - 1) * 3;
        for (; a < b; a += 3, b -= 3) {
            uint8_t t0 = a[0], t1 = a[1], t2 = a[2];
            a[0] = b[0]; a[1] = b[1]; a[2] = b[2];
            b[0] = t0; b[1] = t1; b[2] = t2;
        }
    }
}

/* One record: 1 done, 0 left to the caller. raw: the payload is the stored image's pixels (h x w x 3). */
static int one_record(tjhandle tj, const uint8_t *src, unsigned long len, int raw, const int32_t *g, const void *wh,
                      const void *wv, int mirror, uint8_t *dst, long dstride, int out, int flags, resize_fn resize,
                      uint8_t *pixels, size_t pixels_bytes, uint8_t *scratch, size_t scratch_bytes) {
    int dh = g[G_DECODE_HEIGHT], dw = g[G_DECODE_WIDTH];
    int top = g[G_TOP], left = g[G_LEFT], bh = g[G_BOX_HEIGHT], bw = g[G_BOX_WIDTH];
    if (dh < 1 || dw < 1 || top < 0 || left < 0 || bh < 1 || bw < 1 || top + bh > dh || left + bw > dw) return 0;
    const uint8_t *image = pixels;
    if (raw) {  /* resized straight from the payload */
        if (dh != g[G_HEIGHT] || dw != g[G_WIDTH] || len != (unsigned long)dh * (unsigned long)dw * 3) return 0;
        image = src;
    } else {
        if (len < 3 || src[0] != 0xFF || src[1] != 0xD8 || src[2] != 0xFF) return 0;  /* not a JPEG's start */
        int width = 0, height = 0, subsamp = 0, colorspace = 0;
        if (tjDecompressHeader3(tj, src, len, &width, &height, &subsamp, &colorspace) != 0) return 0;
        if (height != g[G_HEIGHT] || width != g[G_WIDTH]) return 0;  /* not the index's size */
        if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK) return 0;  /* simplejpeg converts these itself */
        if ((size_t)dh * (size_t)dw * 3 > pixels_bytes) return 0;
        if (tjDecompress2(tj, src, len, pixels, dw, 0, dh, TJPF_RGB, flags) != 0) return 0;  /* warnings too */
    }
    const uint8_t *region = image + ((size_t)top * dw + left) * 3;
    long row = (long)dw * 3;
    if (bh == out && bw == out) {
        for (int y = 0; y < out; y++) memcpy(dst + y * dstride, region + y * row, (size_t)out * 3);
    } else if (resize(region, row, bh, bw, dst, dstride, out, out, wh, wv, scratch, scratch_bytes) != 0) {
        return 0;
    }
    if (mirror) mirror_rows(dst, dstride, out, out);
    return 1;
}

/* Decode, crop, resize (and mirror) n JPEG records into out x out x 3 slots.
 *   payloads[i], lengths[i]: record i's bytes; raw[i]: they are its pixels, not a JPEG (no decode).
 *   geometry: n x 8 int32: the index's height and width, the decode size (a TurboJPEG scale of
 *       them, as simplejpeg picks it), the box's top, left, height and width in the decoded image.
 *   weights: n x 2 handles of rs_weights (box width -> out, box height -> out; 0 where a side keeps
 *       its size), as rs_resize takes them.
 *   mirror[i]: mirror slot i horizontally after resizing.
 *   dests[i]: slot i (rows dest_row_bytes apart).
 *   fast_idct: TurboJPEG's fast integer IDCT (simplejpeg's fastdct).
 *   pixels: a buffer for one decoded image (at least the largest decode size x 3 bytes);
 *   scratch: rs_scratch_bytes(largest box height, out) bytes for the resize.
 *   done[i]: set to 1 for each record done, 0 for each left to the caller.
 * Returns the number of records done, or -1 when no TurboJPEG decoder could be made (none done). */
int pl_jpeg_boxes(int n, const uint64_t *payloads, const uint64_t *lengths, const uint8_t *raw, const int32_t *geometry,
                  const uint64_t *weights, const uint8_t *mirror, const uint64_t *dests, long dest_row_bytes, int out,
                  int fast_idct, uint64_t resize_entry, uint8_t *pixels, size_t pixels_bytes, uint8_t *scratch,
                  size_t scratch_bytes, uint8_t *done) {
    memset(done, 0, (size_t)(n > 0 ? n : 0));
    resize_fn resize = (resize_fn)(uintptr_t)resize_entry;
    if (n <= 0) return 0;
    if (!resize) return -1;
    tjhandle tj = tjInitDecompress();
    if (!tj) return -1;
    int flags = TJFLAG_NOREALLOC | (fast_idct ? TJFLAG_FASTDCT : 0);
    int count = 0;
    for (int i = 0; i < n; i++) {
        done[i] = (uint8_t)one_record(tj, (const uint8_t *)(uintptr_t)payloads[i], (unsigned long)lengths[i], raw[i],
                                      geometry + (size_t)i * G_FIELDS, (const void *)(uintptr_t)weights[2 * i],
                                      (const void *)(uintptr_t)weights[2 * i + 1], mirror[i],
                                      (uint8_t *)(uintptr_t)dests[i], dest_row_bytes, out, flags, resize, pixels,
                                      pixels_bytes, scratch, scratch_bytes);
        count += done[i];
    }
    tjDestroy(tj);
    return count;
}

/* An importable module, so that setuptools can build this file as an extension; it has no Python
   functions (packload/core/jpeg_kernel.py calls the one above through ctypes). */
static struct PyModuleDef jpeg_boxes_module = {PyModuleDef_HEAD_INIT, "_jpeg_boxes",
                                               "packload's compiled batch decoder (see packload/core/jpeg_kernel.py).",
                                               -1, NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__jpeg_boxes(void) { return PyModule_Create(&jpeg_boxes_module); }
