/* packload's compiled batch decoder: a batch of JPEG records decoded, cropped, resized and mirrored in
 * one call, decoding only the rows and columns each crop needs.
 *
 * Built by setup.py as the extension module packload.core._jpeg_boxes with nothing but a C compiler:
 * it is written against the libjpeg API (libjpeg 6.2 ABI, libjpeg-turbo's extensions), compiled
 * against the few public headers in packload/core/libjpeg/, and linked to no library. The library is
 * found at run time by packload/core/jpeg_kernel.py (the libjpeg-turbo that Pillow's wheels carry, else
 * a system libjpeg-turbo), which passes its functions' addresses in (an "api" table, in the order of
 * enum api_entry). jpeg_CreateDecompress() checks the ABI: it is given this file's JPEG_LIB_VERSION and
 * struct size, and refuses (through the error handler) when the library was built for another.
 *
 * Per record: the header is read; a JPEG whose size is not the index's, CMYK/YCCK, more scans than
 * allowed, any error or warning is left undone (the caller's general route decides: PIL, or an error
 * naming the record). Otherwise it is decoded at the DCT scale the caller chose (n/8, with the decode size
 * it gives), and only the box: jpeg_crop_scanline() narrows each row to the iMCU columns the
 * box touches, jpeg_skip_scanlines() skips the rows above it without their IDCT, upsampling and colour
 * conversion, and decoding stops after the box's last row. One iMCU of margin is kept on the left and
 * right where the image has it, so that the box's pixels equal a full decode's (libjpeg-turbo's fancy
 * upsampling treats the edges of a cropped row as image edges). The box is then resampled by the resize
 * kernel (packload/core/_resize.c, reached through a function pointer the caller passes) or copied when
 * it already has the output's size, and mirrored where asked.
 *
 * The caller gives up the GIL once for the whole batch (ctypes does, around the call).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "libjpeg/jpeglib.h"

/* rs_resize of packload/core/_resize.c */
typedef int (*resize_fn)(const uint8_t *src, long sstride, int ih, int iw, uint8_t *dst, long dstride, int oh,
                         int ow, const void *wh, const void *wv, uint8_t *scratch, size_t scratch_size);

/* The library's functions, in the order jpeg_kernel.py passes their addresses. */
enum api_entry {
    API_STD_ERROR, API_CREATE, API_DESTROY, API_MEM_SRC, API_READ_HEADER, API_START, API_CROP, API_SKIP, API_READ,
    API_ABORT, API_ENTRIES
};

typedef struct {
    struct jpeg_error_mgr *(*std_error)(struct jpeg_error_mgr *);
    void (*create)(j_decompress_ptr, int, size_t);
    void (*destroy)(j_decompress_ptr);
    void (*mem_src)(j_decompress_ptr, const unsigned char *, unsigned long);
    int (*read_header)(j_decompress_ptr, boolean);
    boolean (*start)(j_decompress_ptr);
    void (*crop)(j_decompress_ptr, JDIMENSION *, JDIMENSION *);
    JDIMENSION (*skip)(j_decompress_ptr, JDIMENSION);
    JDIMENSION (*read)(j_decompress_ptr, JSAMPARRAY, JDIMENSION);
    void (*abort)(j_decompress_ptr);
} api_t;

static void bind_api(api_t *api, const uint64_t *entries) {
    api->std_error = (struct jpeg_error_mgr * (*)(struct jpeg_error_mgr *))(uintptr_t)entries[API_STD_ERROR];
    api->create = (void (*)(j_decompress_ptr, int, size_t))(uintptr_t)entries[API_CREATE];
    api->destroy = (void (*)(j_decompress_ptr))(uintptr_t)entries[API_DESTROY];
    api->mem_src = (void (*)(j_decompress_ptr, const unsigned char *, unsigned long))(uintptr_t)entries[API_MEM_SRC];
    api->read_header = (int (*)(j_decompress_ptr, boolean))(uintptr_t)entries[API_READ_HEADER];
    api->start = (boolean(*)(j_decompress_ptr))(uintptr_t)entries[API_START];
    api->crop = (void (*)(j_decompress_ptr, JDIMENSION *, JDIMENSION *))(uintptr_t)entries[API_CROP];
    api->skip = (JDIMENSION(*)(j_decompress_ptr, JDIMENSION))(uintptr_t)entries[API_SKIP];
    api->read = (JDIMENSION(*)(j_decompress_ptr, JSAMPARRAY, JDIMENSION))(uintptr_t)entries[API_READ];
    api->abort = (void (*)(j_decompress_ptr))(uintptr_t)entries[API_ABORT];
}

/* Errors and warnings jump back to the record being decoded; nothing is printed. */
typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    int max_scans;
} guard_t;

static void on_error(j_common_ptr cinfo) { longjmp(((guard_t *)cinfo->err)->jump, 1); }

static void on_message(j_common_ptr cinfo, int level) {
    if (level < 0) longjmp(((guard_t *)cinfo->err)->jump, 1); /* a warning: damaged data, left to the caller */
}

static void on_output(j_common_ptr cinfo) { (void)cinfo; }

/* Called before each step of reading a multi-scan (progressive) JPEG: stops past the scan limit, as
   TurboJPEG's scan limit does, so that a file of thousands of legal scans costs little. */
static void on_progress(j_common_ptr cinfo) {
    guard_t *guard = (guard_t *)cinfo->err;
    if (((j_decompress_ptr)cinfo)->input_scan_number > guard->max_scans) longjmp(guard->jump, 1);
}

typedef struct {
    api_t api;
    struct jpeg_decompress_struct cinfo;
    guard_t guard;
    struct jpeg_progress_mgr progress;
} decoder_t;

/* Make a decompressor; 0 when the library refuses (its message, if any, in message). */
static int open_decoder(decoder_t *dec, const uint64_t *entries, int max_scans, char *message, size_t message_size) {
    memset(dec, 0, sizeof(*dec));
    bind_api(&dec->api, entries);
    dec->cinfo.err = dec->api.std_error(&dec->guard.pub);
    dec->guard.pub.error_exit = on_error;
    dec->guard.pub.emit_message = on_message;
    dec->guard.pub.output_message = on_output;
    dec->guard.max_scans = max_scans;
    if (setjmp(dec->guard.jump)) {
        if (message && message_size) {
            char text[JMSG_LENGTH_MAX] = "";
            if (dec->guard.pub.format_message) dec->guard.pub.format_message((j_common_ptr)&dec->cinfo, text);
            snprintf(message, message_size, "%s", text);
        }
        return 0;
    }
    dec->api.create(&dec->cinfo, JPEG_LIB_VERSION, sizeof(struct jpeg_decompress_struct));
    dec->progress.progress_monitor = on_progress;
    dec->cinfo.progress = &dec->progress;
    return 1;
}

enum { G_HEIGHT, G_WIDTH, G_SCALE, G_DECODE_HEIGHT, G_DECODE_WIDTH, G_TOP, G_LEFT, G_BOX_HEIGHT, G_BOX_WIDTH, G_FIELDS };
enum { FLAG_FAST_IDCT = 1, FLAG_WHOLE = 2 };

/* Whether the geometry's scale n (of n/8) gives its decode size (sides rounded up, as libjpeg rounds
   them). Tiny images decode to the same size at several scales, each with other pixels: the scale is
   the caller's choice, never guessed from the size. */
static int scale_fits(const int32_t *g) {
    const long n = g[G_SCALE];
    return n >= 1 && n <= 8 && (long)g[G_DECODE_HEIGHT] == ((long)g[G_HEIGHT] * n + 7) / 8 &&
           (long)g[G_DECODE_WIDTH] == ((long)g[G_WIDTH] * n + 7) / 8;
}

/* Decode the box of one JPEG record into pixels: 1 done (its first pixel at pixels + *offset, rows
   *stride bytes apart), 0 left to the caller. Everything it reads from g is read after setjmp, so
   nothing live across a longjmp is ever modified. */
static int decode_box(decoder_t *dec, const uint8_t *src, unsigned long len, const int32_t *g, int flags,
                      uint8_t *pixels, size_t pixels_bytes, size_t *offset, long *stride) {
    j_decompress_ptr cinfo = &dec->cinfo;
    if (setjmp(dec->guard.jump)) {
        dec->api.abort(cinfo);
        return 0;
    }
    dec->api.mem_src(cinfo, src, len);
    if (dec->api.read_header(cinfo, TRUE) != JPEG_HEADER_OK || (long)cinfo->image_height != g[G_HEIGHT] ||
        (long)cinfo->image_width != g[G_WIDTH] || cinfo->jpeg_color_space == JCS_CMYK ||
        cinfo->jpeg_color_space == JCS_YCCK || (cinfo->num_components != 1 && cinfo->num_components != 3)) {
        dec->api.abort(cinfo); /* not the index's size, or colours PIL converts: the caller decides */
        return 0;
    }
    cinfo->scale_num = (unsigned int)g[G_SCALE];
    cinfo->scale_denom = 8;
    cinfo->out_color_space = JCS_EXT_RGB;
    cinfo->dct_method = (flags & FLAG_FAST_IDCT) ? JDCT_IFAST : JDCT_ISLOW;
    dec->api.start(cinfo);
    const int dh = g[G_DECODE_HEIGHT], dw = g[G_DECODE_WIDTH], top = g[G_TOP], left = g[G_LEFT];
    if ((int)cinfo->output_height != dh || (int)cinfo->output_width != dw || cinfo->output_components != 3) {
        dec->api.abort(cinfo);
        return 0;
    }
    JDIMENSION x = 0, cols = (JDIMENSION)dw, first_row = 0, rows = (JDIMENSION)dh;
    if (!(flags & FLAG_WHOLE)) {
        /* the box's columns, one iMCU column of margin each side (within the image), then widened by
           jpeg_crop_scanline to start on an iMCU boundary */
        const int imcu = cinfo->min_DCT_scaled_size * (cinfo->num_components == 1 ? 1 : cinfo->max_h_samp_factor);
        const int from = left > imcu ? left - imcu : 0;
        const int to = left + g[G_BOX_WIDTH] + imcu < dw ? left + g[G_BOX_WIDTH] + imcu : dw;
        x = (JDIMENSION)from;
        cols = (JDIMENSION)(to - from);
        if (cols < (JDIMENSION)dw) dec->api.crop(cinfo, &x, &cols);
        first_row = (JDIMENSION)top;
        rows = (JDIMENSION)g[G_BOX_HEIGHT];
    }
    const long row_bytes = (long)cols * 3;
    if ((size_t)rows * (size_t)row_bytes > pixels_bytes || (int)x > left) {
        dec->api.abort(cinfo);
        return 0;
    }
    if (first_row) dec->api.skip(cinfo, first_row);
    JSAMPROW pointers[16];
    for (JDIMENSION done = 0; done < rows;) {
        const JDIMENSION ask = rows - done < 16 ? rows - done : 16;
        for (JDIMENSION k = 0; k < ask; k++) pointers[k] = pixels + (size_t)(done + k) * (size_t)row_bytes;
        const JDIMENSION got = dec->api.read(cinfo, pointers, ask);
        if (!got) {
            dec->api.abort(cinfo);
            return 0;
        }
        done += got;
    }
    dec->api.abort(cinfo); /* the rows below the box are never decoded */
    *offset = ((flags & FLAG_WHOLE) ? (size_t)top * (size_t)row_bytes : 0) + (size_t)(left - (int)x) * 3;
    *stride = row_bytes;
    return 1;
}

/* The box of one JPEG record decoded into pixels: 1 done (*region, rows *stride bytes apart), 0 left
   to the caller. */
static int decode_jpeg(decoder_t *dec, const uint8_t *src, unsigned long len, const int32_t *g, int flags,
                       uint8_t *pixels, size_t pixels_bytes, const uint8_t **region, long *stride) {
    if (len < 3 || src[0] != 0xFF || src[1] != 0xD8 || src[2] != 0xFF) return 0; /* not a JPEG's start */
    size_t offset = 0;
    if (!scale_fits(g) || !decode_box(dec, src, len, g, flags, pixels, pixels_bytes, &offset, stride)) return 0;
    *region = pixels + offset;
    return 1;
}

static void mirror_rows(uint8_t *dst, long dstride, int rows, int cols) {
    for (int y = 0; y < rows; y++) {
        uint8_t *a = dst + y * dstride, *b = a + (long)(cols - 1) * 3;
        for (; a < b; a += 3, b -= 3) {
            uint8_t t0 = a[0], t1 = a[1], t2 = a[2];
            a[0] = b[0];
            a[1] = b[1];
            a[2] = b[2];
            b[0] = t0;
            b[1] = t1;
            b[2] = t2;
        }
    }
}

/* Whether the geometry's box lies inside its decode size. */
static int box_inside(const int32_t *g) {
    return g[G_DECODE_HEIGHT] >= 1 && g[G_DECODE_WIDTH] >= 1 && g[G_TOP] >= 0 && g[G_LEFT] >= 0 &&
           g[G_BOX_HEIGHT] >= 1 && g[G_BOX_WIDTH] >= 1 && (long)g[G_TOP] + g[G_BOX_HEIGHT] <= g[G_DECODE_HEIGHT] &&
           (long)g[G_LEFT] + g[G_BOX_WIDTH] <= g[G_DECODE_WIDTH];
}

/* One record into its slot: 1 done, 0 left to the caller. raw: the payload is the stored image's
   pixels (h x w x 3), resized straight from where it lies. */
static int one_record(decoder_t *dec, const uint8_t *src, unsigned long len, int raw, const int32_t *g,
                      const void *wh, const void *wv, int mirror, uint8_t *dst, long dstride, int out, int flags,
                      resize_fn resize, uint8_t *pixels, size_t pixels_bytes, uint8_t *scratch,
                      size_t scratch_bytes) {
    if (!box_inside(g)) return 0;
    const int dw = g[G_DECODE_WIDTH], bh = g[G_BOX_HEIGHT], bw = g[G_BOX_WIDTH];
    const uint8_t *region;
    long row;
    if (raw) {
        if (g[G_DECODE_HEIGHT] != g[G_HEIGHT] || dw != g[G_WIDTH] ||
            len != (unsigned long)g[G_DECODE_HEIGHT] * (unsigned long)dw * 3)
            return 0;
        row = (long)dw * 3;
        region = src + (size_t)g[G_TOP] * (size_t)row + (size_t)g[G_LEFT] * 3;
    } else if (!dec || !decode_jpeg(dec, src, len, g, flags, pixels, pixels_bytes, &region, &row)) {
        return 0;
    }
    if (bh == out && bw == out) {
        for (int y = 0; y < out; y++) memcpy(dst + y * dstride, region + y * row, (size_t)out * 3);
    } else if (resize(region, row, bh, bw, dst, dstride, out, out, wh, wv, scratch, scratch_bytes) != 0) {
        return 0;
    }
    if (mirror) mirror_rows(dst, dstride, out, out);
    return 1;
}

/* Whether the library whose functions are at api accepts this file's ABI (libjpeg 6.2 and its
   decompression struct's size): 1, or 0 with the library's message in message. */
int pl_jpeg_accepts(const uint64_t *api, char *message, size_t message_size) {
    decoder_t dec;
    if (message_size) message[0] = 0;
    if (!open_decoder(&dec, api, 1, message, message_size)) return 0;
    dec.api.destroy(&dec.cinfo);
    return 1;
}

/* Decode, crop, resize (and mirror) n JPEG records into out x out x 3 slots.
 *   api: the library's functions (enum api_entry); NULL: none, raw records only (JPEGs are left).
 *   payloads[i], lengths[i]: record i's bytes; raw[i]: they are its pixels, not a JPEG (no decode).
 *   geometry: n x 9 int32: the index's height and width, the DCT scale n (of n/8: 8 is full size), the
 *       decode size (that scale of the index's size, sides rounded up), the box's top, left, height and
 *       width in the decoded image.
 *   weights: n x 2 handles of rs_weights (box width -> out, box height -> out), as rs_resize takes them.
 *   mirror[i]: mirror slot i horizontally after resizing.
 *   dests[i]: slot i (rows dest_row_bytes apart).
 *   flags: FLAG_FAST_IDCT (the fast integer IDCT), FLAG_WHOLE (decode every row and column, then crop:
 *       for comparing with crop-first decoding).
 *   max_scans: a multi-scan JPEG with more scans than this is left to the caller.
 *   pixels: a buffer for one decoded region (the largest decode size x 3 bytes is always enough);
 *   scratch: rs_scratch_bytes(largest box height, out) bytes for the resize.
 *   done[i]: set to 1 for each record done, 0 for each left to the caller.
 * Returns the number of records done, or -1 when no decompressor could be made (none done). */
int pl_jpeg_boxes(const uint64_t *api, int n, const uint64_t *payloads, const uint64_t *lengths, const uint8_t *raw,
                  const int32_t *geometry, const uint64_t *weights, const uint8_t *mirror, const uint64_t *dests,
                  long dest_row_bytes, int out, int flags, int max_scans, uint64_t resize_entry, uint8_t *pixels,
                  size_t pixels_bytes, uint8_t *scratch, size_t scratch_bytes, uint8_t *done) {
    memset(done, 0, (size_t)(n > 0 ? n : 0));
    resize_fn resize = (resize_fn)(uintptr_t)resize_entry;
    if (n <= 0) return 0;
    if (!resize) return -1;
    decoder_t *dec = NULL; /* none without a library: raw records only */
    if (api) {
        dec = (decoder_t *)malloc(sizeof(decoder_t));
        if (!dec) return -1;
        if (!open_decoder(dec, api, max_scans, NULL, 0)) {
            free(dec);
            return -1;
        }
    }
    int count = 0;
    for (int i = 0; i < n; i++) {
        done[i] = (uint8_t)one_record(dec, (const uint8_t *)(uintptr_t)payloads[i], (unsigned long)lengths[i], raw[i],
                                      geometry + (size_t)i * G_FIELDS, (const void *)(uintptr_t)weights[2 * i],
                                      (const void *)(uintptr_t)weights[2 * i + 1], mirror[i],
                                      (uint8_t *)(uintptr_t)dests[i], dest_row_bytes, out, flags, resize, pixels,
                                      pixels_bytes, scratch, scratch_bytes);
        count += done[i];
    }
    if (dec) {
        dec->api.destroy(&dec->cinfo);
        free(dec);
    }
    return count;
}

/* The box of one JPEG (geometry as for pl_jpeg_boxes) decoded into dst (box height x box width x 3,
   rows packed), without resizing: for tests and the library's self-check. 1 done, 0 refused, -1 no
   decompressor. */
int pl_jpeg_region(const uint64_t *api, const uint8_t *src, unsigned long len, const int32_t *geometry, int flags,
                   int max_scans, uint8_t *pixels, size_t pixels_bytes, uint8_t *dst) {
    decoder_t *dec = (decoder_t *)malloc(sizeof(decoder_t));
    if (!dec) return -1;
    if (!open_decoder(dec, api, max_scans, NULL, 0)) {
        free(dec);
        return -1;
    }
    const uint8_t *region;
    long row;
    int ok = box_inside(geometry) && decode_jpeg(dec, src, len, geometry, flags, pixels, pixels_bytes, &region, &row);
    if (ok)
        for (int y = 0; y < geometry[G_BOX_HEIGHT]; y++)
            memcpy(dst + (size_t)y * (size_t)geometry[G_BOX_WIDTH] * 3, region + (size_t)y * (size_t)row,
                   (size_t)geometry[G_BOX_WIDTH] * 3);
    dec->api.destroy(&dec->cinfo);
    free(dec);
    return ok;
}

/* An importable module, so that setuptools can build this file as an extension; it has no Python
   functions (packload/core/jpeg_kernel.py calls the ones above through ctypes). */
static struct PyModuleDef jpeg_boxes_module = {PyModuleDef_HEAD_INIT, "_jpeg_boxes",
                                               "packload's compiled batch decoder (see packload/core/jpeg_kernel.py).",
                                               -1, NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__jpeg_boxes(void) { return PyModule_Create(&jpeg_boxes_module); }
