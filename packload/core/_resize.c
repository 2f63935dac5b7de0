/* packload's compiled resize kernel (built as the optional extension module packload.core._resize; the
 * functions below are called through ctypes by loaders/resize_kernel.py, which falls back to torch
 * when the module was not built).
 *
 * Antialiased bilinear (triangle filter) resize of uint8 HxWx3 images, bit-exact with torch's
 * uint8 kernel (torch._C._nn._upsample_bilinear2d_aa, align_corners=False, antialias=True), which
 * follows PIL's ImagingResample: half-pixel centres, support scaled by the reduction factor,
 * weights normalised per output pixel, int16 fixed-point weights with a precision chosen from the
 * largest weight, horizontal pass first (rounded to uint8), then vertical pass.
 *
 * Built by setup.py (setuptools Extension, optional). C99 + GCC/clang builtins.
 * x86-64: baseline SSE2 code, plus AVX2 code chosen at run time (__builtin_cpu_supports);
 * anything else: portable scalar code.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(RS_PORTABLE)
#include <immintrin.h>
#define RS_X86 1
#define RS_AVX2 __attribute__((target("avx2")))
#else
#define RS_X86 0
#endif

typedef struct rs_weights {
    int in, out, prec;
    int kp;            /* taps per output in the padded layout (even), 0: use the scalar layout */
    int32_t *cstart;   /* compact layout: first nonzero tap ... */
    int32_t *count;    /* ... and the number of taps from there */
    int16_t *cw;       /* out * kmax */
    int kmax;
    int32_t *start;    /* padded layout: first tap, start + kp <= in */
    int16_t *w;        /* out * kp */
    int32_t *wpair;    /* out * kp/2: two int16 weights in one int32 (for pmaddwd) */
    /* horizontal enlargement: blocks of 4 output pixels whose taps lie in one 16-byte window */
    int nblocks;       /* 0: not usable */
    int32_t *boff;     /* byte offset of each block's window in the row */
    uint8_t *bshuf;    /* nblocks * 48: pshufb masks, 3 per block */
    int16_t *bw;       /* nblocks * 24: weight pairs */
    uint8_t *bshuf2;   /* the same in the order of the AVX2 loop: (nblocks/2) * 3 * 32 */
    int16_t *bw2;      /* (nblocks/2) * 3 * 16 */
    /* general: quads of 4 output values (RGB interleaved), each with its own 16-byte window;
       kq pairs of taps per value; the AVX2 loop takes 8 quads (32 output bytes) per step */
    int nsteps;        /* 0: not usable */
    int kq;
    int32_t *qoff;     /* nsteps * 8 window offsets, in loop order */
    uint8_t *qshuf;    /* nsteps * 4 * kq * 32 */
    int16_t *qw;       /* nsteps * 4 * kq * 16 */
} rs_weights;

static double tri(double x) { x = fabs(x); return x < 1.0 ? 1.0 - x : 0.0; }

void rs_weights_free(rs_weights *W) {
    if (!W) return;
    free(W->cstart); free(W->count); free(W->cw); free(W->start); free(W->w); free(W->wpair);
    free(W->boff); free(W->bshuf); free(W->bw); free(W->bshuf2); free(W->bw2);
    free(W->qoff); free(W->qshuf); free(W->qw); free(W);
}

/* Weights for resampling `in` samples to `out`, exactly as torch computes them
 * (HelperInterpLinear::compute_index_ranges_int16_weights). NULL on failure. */
rs_weights *rs_weights_new(int in, int out) {
    if (in < 1 || out < 1) return NULL;
    rs_weights *W = calloc(1, sizeof *W);
    if (!W) return NULL;
    W->in = in; W->out = out;
    double scale = (double)in / out;
    double support = scale >= 1.0 ? scale : 1.0;            /* (interp_size / 2) * scale */
    int maxk = (int)ceil(support) * 2 + 1;
    double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
    double *wf = calloc((size_t)out * maxk, sizeof *wf);
    int64_t *xmin = calloc(out, sizeof *xmin), *xsize = calloc(out, sizeof *xsize);
    int16_t *wi = calloc((size_t)out * maxk, sizeof *wi);
    if (!wf || !xmin || !xsize || !wi) goto fail;
    double wmax = 0.0;
    for (int i = 0; i < out; i++) {
        double center = scale * (i + 0.5), total = 0.0;
        int64_t lo = (int64_t)(center - support + 0.5);
        if (lo < 0) lo = 0;
        int64_t hi = (int64_t)(center + support + 0.5);
        if (hi > in) hi = in;
        int64_t n = hi - lo;
        if (n < 0) n = 0;
        if (n > maxk) n = maxk;
        xmin[i] = lo; xsize[i] = n;
        for (int64_t j = 0; j < n; j++) {
            double w = tri((j + lo - center + 0.5) * invscale);
            wf[i * maxk + j] = w;
            total += w;
        }
        if (total != 0.0)
            for (int64_t j = 0; j < n; j++) {
                wf[i * maxk + j] /= total;
                if (wf[i * maxk + j] > wmax) wmax = wf[i * maxk + j];
            }
    }
    unsigned p;
    for (p = 0; p < 22; p++) {
        int next = (int)(0.5 + wmax * (1 << (p + 1)));
        if (next >= (1 << 15)) break;
    }
    W->prec = (int)p;
    if (p < 1) goto fail;
    for (int64_t t = 0; t < (int64_t)out * maxk; t++) {
        double v = wf[t] * (1 << p);
        wi[t] = (int16_t)(v < 0 ? (int)(-0.5 + v) : (int)(0.5 + v));
    }
    /* compact layout: drop zero weights at either end */
    W->cstart = calloc(out, sizeof(int32_t)); W->count = calloc(out, sizeof(int32_t));
    if (!W->cstart || !W->count) goto fail;
    int kmax = 1;
    for (int i = 0; i < out; i++) {
        int f = 0, l = (int)xsize[i] - 1;
        while (f <= l && wi[i * maxk + f] == 0) f++;
        while (l >= f && wi[i * maxk + l] == 0) l--;
        W->cstart[i] = (int32_t)(xmin[i] + (f <= l ? f : 0));
        W->count[i] = f <= l ? l - f + 1 : 0;
        if (W->count[i] > kmax) kmax = W->count[i];
    }
    W->kmax = kmax;
    W->cw = calloc((size_t)out * kmax, sizeof(int16_t));
    if (!W->cw) goto fail;
    for (int i = 0; i < out; i++)
        for (int k = 0; k < W->count[i]; k++)
            W->cw[i * kmax + k] = wi[i * maxk + (W->cstart[i] - xmin[i]) + k];
    /* padded layout for SIMD: kp taps (even) from start, start + kp <= in */
    int kp = kmax + (kmax & 1);
    if (kp <= in) {
        W->kp = kp;
        W->start = calloc(out, sizeof(int32_t));
        W->w = calloc((size_t)out * kp, sizeof(int16_t));
        W->wpair = calloc((size_t)out * kp / 2, sizeof(int32_t));
        if (!W->start || !W->w || !W->wpair) goto fail;
        for (int i = 0; i < out; i++) {
            int s = W->cstart[i];
            if (s > in - kp) s = in - kp;
            W->start[i] = s;
            for (int k = 0; k < W->count[i]; k++) W->w[i * kp + (W->cstart[i] - s) + k] = W->cw[i * kmax + k];
            for (int k = 0; k < kp; k += 2)
                W->wpair[i * kp / 2 + k / 2] = (int32_t)((uint32_t)(uint16_t)W->w[i * kp + k] |
                                                         ((uint32_t)(uint16_t)W->w[i * kp + k + 1] << 16));
        }
    }
    /* 16-byte windows of 4 output pixels (RGB), 2 taps each: enlargement */
    if (W->kp == 2 && out >= 4 && in * 3 >= 16) {
        int nb = out / 4, ok = 1;
        W->boff = calloc(nb, sizeof(int32_t));
        W->bshuf = calloc((size_t)nb * 48, 1);
        W->bw = calloc((size_t)nb * 24, sizeof(int16_t));
        if (!W->boff || !W->bshuf || !W->bw) goto fail;
        for (int b = 0; b < nb && ok; b++) {
            int off = 3 * W->start[4 * b];
            if (off > 3 * in - 16) off = 3 * in - 16;
            W->boff[b] = off;
            for (int v = 0; v < 12; v++) {
                int x = 4 * b + v / 3, c = v % 3;
                for (int t = 0; t < 2; t++) {
                    int byte = 3 * (W->start[x] + t) + c - off;
                    if (byte < 0 || byte > 15) { ok = 0; break; }
                    W->bshuf[b * 48 + 4 * v + 2 * t] = (uint8_t)byte;
                    W->bshuf[b * 48 + 4 * v + 2 * t + 1] = 0x80;
                    W->bw[b * 24 + 2 * v + t] = W->w[x * 2 + t];
                }
            }
        }
        if (ok) {
            W->bshuf2 = calloc((size_t)(nb / 2) * 96 + 1, 1);
            W->bw2 = calloc((size_t)(nb / 2) * 48 + 1, sizeof(int16_t));
            if (!W->bshuf2 || !W->bw2) goto fail;
            for (int b = 0; b + 2 <= nb; b += 2)
                for (int j = 0; j < 3; j++)
                    for (int l = 0; l < 2; l++) {
                        memcpy(W->bshuf2 + (b / 2) * 96 + j * 32 + l * 16, W->bshuf + (b + l) * 48 + j * 16, 16);
                        memcpy(W->bw2 + (b / 2) * 48 + j * 16 + l * 8, W->bw + (b + l) * 24 + j * 8, 16);
                    }
            W->nblocks = nb;
        }
    }
    /* quads with their own windows (any scale whose taps are close enough) */
    if (in * 3 >= 16 && out * 3 >= 32) {
        int ns = out * 3 / 32, kq = (kmax + 1) / 2, ok = 1;
        W->kq = kq;
        W->qoff = calloc((size_t)ns * 8, sizeof(int32_t));
        W->qshuf = calloc((size_t)ns * 4 * kq * 32, 1);
        W->qw = calloc((size_t)ns * 4 * kq * 16, sizeof(int16_t));
        if (!W->qoff || !W->qshuf || !W->qw) goto fail;
        static const int quad_of[4][2] = {{0, 2}, {1, 3}, {4, 6}, {5, 7}};
        for (int st = 0; st < ns && ok; st++)
            for (int r = 0; r < 4 && ok; r++)
                for (int l = 0; l < 2 && ok; l++) {
                    int q = st * 8 + quad_of[r][l], lo = 1 << 30, hi = -1;
                    for (int i = 0; i < 4; i++) {
                        int v = 4 * q + i, x = v / 3, c = v % 3;
                        if (W->count[x]) {
                            int a = 3 * W->cstart[x] + c, e = 3 * (W->cstart[x] + W->count[x] - 1) + c;
                            if (a < lo) lo = a;
                            if (e > hi) hi = e;
                        }
                    }
                    if (hi < 0) lo = hi = 0;
                    int off = lo > 3 * in - 16 ? 3 * in - 16 : lo;
                    if (hi - off > 15) { ok = 0; break; }
                    W->qoff[st * 8 + 2 * r + l] = off;
                    for (int t = 0; t < kq; t++) {
                        uint8_t *m = W->qshuf + (((size_t)st * 4 + r) * kq + t) * 32 + l * 16;
                        int16_t *w = W->qw + (((size_t)st * 4 + r) * kq + t) * 16 + l * 8;
                        for (int i = 0; i < 4; i++) {
                            int v = 4 * q + i, x = v / 3, c = v % 3;
                            for (int u = 0; u < 2; u++) {
                                int k = 2 * t + u;
                                if (k < W->count[x]) {
                                    m[4 * i + 2 * u] = (uint8_t)(3 * (W->cstart[x] + k) + c - off);
                                    w[2 * i + u] = W->cw[x * kmax + k];
                                } else {
                                    m[4 * i + 2 * u] = 0x80;
                                    w[2 * i + u] = 0;
                                }
                                m[4 * i + 2 * u + 1] = 0x80;
                            }
                        }
                    }
                }
        if (ok) W->nsteps = ns;
    }
    free(wf); free(xmin); free(xsize); free(wi);
    return W;
fail:
    free(wf); free(xmin); free(xsize); free(wi);
    rs_weights_free(W);
    return NULL;
}

int rs_weights_prec(const rs_weights *W) { return W->prec; }
int rs_weights_taps(const rs_weights *W) { return W->kmax; }
int rs_weights_blocks(const rs_weights *W) { return W->nblocks; }
int rs_weights_steps(const rs_weights *W) { return W->nsteps; }

static inline uint8_t clip8(int32_t v) { return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v; }

/* ---------------- portable scalar passes ---------------- */

static void hpass_scalar(const uint8_t *src, long sstride, int r0, int r1, uint8_t *tmp, long tstride,
                         const rs_weights *W) {
    const int32_t bias = 1 << (W->prec - 1), sh = W->prec, km = W->kmax;
    for (int r = r0; r < r1; r++) {
        const uint8_t *s = src + r * sstride;
        uint8_t *d = tmp + r * tstride;
        for (int x = 0; x < W->out; x++) {
            const uint8_t *p = s + 3 * W->cstart[x];
            const int16_t *w = W->cw + x * km;
            int32_t a0 = bias, a1 = bias, a2 = bias;
            for (int k = 0; k < W->count[x]; k++) {
                a0 += w[k] * p[3 * k]; a1 += w[k] * p[3 * k + 1]; a2 += w[k] * p[3 * k + 2];
            }
            d[3 * x] = clip8(a0 >> sh); d[3 * x + 1] = clip8(a1 >> sh); d[3 * x + 2] = clip8(a2 >> sh);
        }
    }
}

/* output rows [y0, y1), bytes [j0, n) of each; one tap at a time over a row of int32 sums, which
   compilers vectorise */
static void vpass_scalar(const uint8_t *tmp, long tstride, uint8_t *dst, long dstride, int n,
                         const rs_weights *W, int y0, int y1, int j0) {
    const int32_t bias = 1 << (W->prec - 1), sh = W->prec, km = W->kmax;
    int32_t acc[1024];
    for (int y = y0; y < y1; y++) {
        const uint8_t *s = tmp + W->cstart[y] * tstride;
        const int16_t *w = W->cw + y * km;
        uint8_t *d = dst + y * dstride;
        for (int j = j0; j < n; j += 1024) {
            int m = n - j < 1024 ? n - j : 1024;
            for (int i = 0; i < m; i++) acc[i] = bias;
            for (int k = 0; k < W->count[y]; k++) {
                const uint8_t *r = s + k * tstride + j;
                const int32_t wk = w[k];
                for (int i = 0; i < m; i++) acc[i] += wk * r[i];
            }
            for (int i = 0; i < m; i++) d[j + i] = clip8(acc[i] >> sh);
        }
    }
}

#if RS_X86
/* ---------------- SSE2 (x86-64 baseline) ---------------- */

static inline __m128i load32(const uint8_t *p) { int32_t v; memcpy(&v, p, 4); return _mm_cvtsi32_si128(v); }
static inline void store32(uint8_t *p, __m128i v) { int32_t x = _mm_cvtsi128_si32(v); memcpy(p, &x, 4); }

/* one row, one output pixel at a time, pairs of taps through pmaddwd; writes 1 byte past the
   row (tmp rows are padded). Reads 1 byte past the last pixel of the row: the caller passes a
   padded copy for the last row of the image. */
static void hrow_sse2(const uint8_t *s, uint8_t *d, const rs_weights *W) {
    const __m128i bias = _mm_set1_epi32(1 << (W->prec - 1)), z = _mm_setzero_si128();
    const int kp = W->kp, sh = W->prec;
    for (int x = 0; x < W->out; x++) {
        const uint8_t *p = s + 3 * W->start[x];
        const int32_t *wp = W->wpair + x * kp / 2;
        __m128i a = bias;
        for (int k = 0; k < kp; k += 2) {
            __m128i t = _mm_unpacklo_epi8(load32(p + 3 * k), load32(p + 3 * k + 3));
            a = _mm_add_epi32(a, _mm_madd_epi16(_mm_unpacklo_epi8(t, z), _mm_set1_epi32(wp[k / 2])));
        }
        a = _mm_srai_epi32(a, sh);
        a = _mm_packs_epi32(a, a);
        store32(d + 3 * x, _mm_packus_epi16(a, a));
    }
}

static void vpass_sse2(const uint8_t *tmp, long tstride, uint8_t *dst, long dstride, int n, const rs_weights *W) {
    const __m128i bias = _mm_set1_epi32(1 << (W->prec - 1)), z = _mm_setzero_si128();
    const int kp = W->kp, sh = W->prec;
    for (int y = 0; y < W->out; y++) {
        const uint8_t *s = tmp + W->start[y] * tstride;
        const int32_t *wp = W->wpair + y * kp / 2;
        uint8_t *d = dst + y * dstride;
        int j = 0;
        for (; j + 16 <= n; j += 16) {
            __m128i a0 = bias, a1 = bias, a2 = bias, a3 = bias;
            for (int k = 0; k < kp; k += 2) {
                __m128i u = _mm_loadu_si128((const __m128i *)(s + k * tstride + j));
                __m128i v = _mm_loadu_si128((const __m128i *)(s + (k + 1) * tstride + j));
                __m128i w = _mm_set1_epi32(wp[k / 2]);
                __m128i lo = _mm_unpacklo_epi8(u, v), hi = _mm_unpackhi_epi8(u, v);
                a0 = _mm_add_epi32(a0, _mm_madd_epi16(_mm_unpacklo_epi8(lo, z), w));
                a1 = _mm_add_epi32(a1, _mm_madd_epi16(_mm_unpackhi_epi8(lo, z), w));
                a2 = _mm_add_epi32(a2, _mm_madd_epi16(_mm_unpacklo_epi8(hi, z), w));
                a3 = _mm_add_epi32(a3, _mm_madd_epi16(_mm_unpackhi_epi8(hi, z), w));
            }
            a0 = _mm_packs_epi32(_mm_srai_epi32(a0, sh), _mm_srai_epi32(a1, sh));
            a2 = _mm_packs_epi32(_mm_srai_epi32(a2, sh), _mm_srai_epi32(a3, sh));
            _mm_storeu_si128((__m128i *)(d + j), _mm_packus_epi16(a0, a2));
        }
        if (j < n) vpass_scalar(tmp, tstride, dst, dstride, n, W, y, y + 1, j);
    }
}

/* ---------------- AVX2 (chosen at run time) ---------------- */

RS_AVX2 static void hblocks_avx2(const uint8_t *s, uint8_t *d, const rs_weights *W) {
    const __m256i bias = _mm256_set1_epi32(1 << (W->prec - 1));
    const int sh = W->prec, nb = W->nblocks;
    int b = 0;
    for (; b + 2 <= nb; b += 2) {
        __m256i px = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(s + W->boff[b]))),
            _mm_loadu_si128((const __m128i *)(s + W->boff[b + 1])), 1);
        const __m256i *m = (const __m256i *)(W->bshuf2 + (b / 2) * 96);
        const __m256i *w = (const __m256i *)(W->bw2 + (b / 2) * 48);
        __m256i a0 = _mm256_madd_epi16(_mm256_shuffle_epi8(px, _mm256_loadu_si256(m)), _mm256_loadu_si256(w));
        __m256i a1 = _mm256_madd_epi16(_mm256_shuffle_epi8(px, _mm256_loadu_si256(m + 1)), _mm256_loadu_si256(w + 1));
        __m256i a2 = _mm256_madd_epi16(_mm256_shuffle_epi8(px, _mm256_loadu_si256(m + 2)), _mm256_loadu_si256(w + 2));
        a0 = _mm256_srai_epi32(_mm256_add_epi32(a0, bias), sh);
        a1 = _mm256_srai_epi32(_mm256_add_epi32(a1, bias), sh);
        a2 = _mm256_srai_epi32(_mm256_add_epi32(a2, bias), sh);
        __m256i o = _mm256_packus_epi16(_mm256_packs_epi32(a0, a1), _mm256_packs_epi32(a2, a2));
        _mm_storeu_si128((__m128i *)(d + 12 * b), _mm256_castsi256_si128(o));
        _mm_storeu_si128((__m128i *)(d + 12 * b + 12), _mm256_extracti128_si256(o, 1));
    }
    for (; b < nb; b++) {
        const __m128i bias1 = _mm256_castsi256_si128(bias);
        __m128i px = _mm_loadu_si128((const __m128i *)(s + W->boff[b]));
        const __m128i *m = (const __m128i *)(W->bshuf + b * 48), *w = (const __m128i *)(W->bw + b * 24);
        __m128i a0 = _mm_madd_epi16(_mm_shuffle_epi8(px, _mm_loadu_si128(m)), _mm_loadu_si128(w));
        __m128i a1 = _mm_madd_epi16(_mm_shuffle_epi8(px, _mm_loadu_si128(m + 1)), _mm_loadu_si128(w + 1));
        __m128i a2 = _mm_madd_epi16(_mm_shuffle_epi8(px, _mm_loadu_si128(m + 2)), _mm_loadu_si128(w + 2));
        a0 = _mm_srai_epi32(_mm_add_epi32(a0, bias1), sh);
        a1 = _mm_srai_epi32(_mm_add_epi32(a1, bias1), sh);
        a2 = _mm_srai_epi32(_mm_add_epi32(a2, bias1), sh);
        _mm_storeu_si128((__m128i *)(d + 12 * b), _mm_packus_epi16(_mm_packs_epi32(a0, a1), _mm_packs_epi32(a2, a2)));
    }
}

RS_AVX2 static void vpass_avx2(const uint8_t *tmp, long tstride, uint8_t *dst, long dstride, int n, const rs_weights *W) {
    const __m256i bias = _mm256_set1_epi32(1 << (W->prec - 1)), z = _mm256_setzero_si256();
    const int kp = W->kp, sh = W->prec;
    for (int y = 0; y < W->out; y++) {
        const uint8_t *s = tmp + W->start[y] * tstride;
        const int32_t *wp = W->wpair + y * kp / 2;
        uint8_t *d = dst + y * dstride;
        int j = 0;
        if (kp == 2) { /* two taps (every enlargement): no accumulator loop, which the general one pays per pixel */
            const uint8_t *s1 = s + tstride;
            const __m256i w = _mm256_set1_epi32(wp[0]);
            for (; j + 32 <= n; j += 32) {
                __m256i u = _mm256_loadu_si256((const __m256i *)(s + j));
                __m256i v = _mm256_loadu_si256((const __m256i *)(s1 + j));
                __m256i lo = _mm256_unpacklo_epi8(u, v), hi = _mm256_unpackhi_epi8(u, v);
                __m256i a0 = _mm256_add_epi32(bias, _mm256_madd_epi16(_mm256_unpacklo_epi8(lo, z), w));
                __m256i a1 = _mm256_add_epi32(bias, _mm256_madd_epi16(_mm256_unpackhi_epi8(lo, z), w));
                __m256i a2 = _mm256_add_epi32(bias, _mm256_madd_epi16(_mm256_unpacklo_epi8(hi, z), w));
                __m256i a3 = _mm256_add_epi32(bias, _mm256_madd_epi16(_mm256_unpackhi_epi8(hi, z), w));
                a0 = _mm256_packs_epi32(_mm256_srai_epi32(a0, sh), _mm256_srai_epi32(a1, sh));
                a2 = _mm256_packs_epi32(_mm256_srai_epi32(a2, sh), _mm256_srai_epi32(a3, sh));
                _mm256_storeu_si256((__m256i *)(d + j), _mm256_packus_epi16(a0, a2));
            }
        }
        for (; j + 32 <= n; j += 32) {
            __m256i a0 = bias, a1 = bias, a2 = bias, a3 = bias;
            for (int k = 0; k < kp; k += 2) {
                __m256i u = _mm256_loadu_si256((const __m256i *)(s + k * tstride + j));
                __m256i v = _mm256_loadu_si256((const __m256i *)(s + (k + 1) * tstride + j));
                __m256i w = _mm256_set1_epi32(wp[k / 2]);
                __m256i lo = _mm256_unpacklo_epi8(u, v), hi = _mm256_unpackhi_epi8(u, v);
                a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_unpacklo_epi8(lo, z), w));
                a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_unpackhi_epi8(lo, z), w));
                a2 = _mm256_add_epi32(a2, _mm256_madd_epi16(_mm256_unpacklo_epi8(hi, z), w));
                a3 = _mm256_add_epi32(a3, _mm256_madd_epi16(_mm256_unpackhi_epi8(hi, z), w));
            }
            a0 = _mm256_packs_epi32(_mm256_srai_epi32(a0, sh), _mm256_srai_epi32(a1, sh));
            a2 = _mm256_packs_epi32(_mm256_srai_epi32(a2, sh), _mm256_srai_epi32(a3, sh));
            _mm256_storeu_si256((__m256i *)(d + j), _mm256_packus_epi16(a0, a2));
        }
        if (j < n) vpass_scalar(tmp, tstride, dst, dstride, n, W, y, y + 1, j);
    }
}

RS_AVX2 static void hquads_avx2(const uint8_t *s, uint8_t *d, const rs_weights *W) {
    const __m256i bias = _mm256_set1_epi32(1 << (W->prec - 1));
    const int sh = W->prec, kq = W->kq;
    const int32_t *off = W->qoff;
    const __m256i *m = (const __m256i *)W->qshuf, *w = (const __m256i *)W->qw;
    for (int st = 0; st < W->nsteps; st++, off += 8) {
        __m256i acc[4];
        for (int r = 0; r < 4; r++) {
            __m256i px = _mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(s + off[2 * r]))),
                _mm_loadu_si128((const __m128i *)(s + off[2 * r + 1])), 1);
            __m256i a = bias;
            for (int t = 0; t < kq; t++, m++, w++)
                a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_shuffle_epi8(px, _mm256_loadu_si256(m)),
                                                          _mm256_loadu_si256(w)));
            acc[r] = _mm256_srai_epi32(a, sh);
        }
        __m256i o = _mm256_packus_epi16(_mm256_packs_epi32(acc[0], acc[1]), _mm256_packs_epi32(acc[2], acc[3]));
        _mm256_storeu_si256((__m256i *)(d + 32 * st), _mm256_permute4x64_epi64(o, 0xD8));
    }
}

static int cpu_avx2 = -1;
static int use_avx2(void) {
    if (cpu_avx2 < 0) {
        __builtin_cpu_init();
        cpu_avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
    }
    return cpu_avx2;
}
#endif

/* Horizontal pass over rows [r0, r1) into tmp (rows padded by 16 bytes past ow*3). */
static void hpass(const uint8_t *src, long sstride, int ih, int r0, int r1, uint8_t *tmp, long tstride,
                  const rs_weights *W, int level) {
#if RS_X86
    if (level >= 1 && W->kp) {
        int iw3 = W->in * 3;
        int tail = 0, quads = 0;
        if (level >= 2 && W->nblocks) tail = W->nblocks * 4;
        else if (level >= 2 && W->nsteps) { quads = 1; tail = W->nsteps * 32 / 3; }
        uint8_t last[iw3 + 16];
        for (int r = r0; r < r1; r++) {
            const uint8_t *s = src + r * sstride;
            uint8_t *d = tmp + r * tstride;
            if (r == ih - 1 && tail < W->out) { memcpy(last, s, iw3); memset(last + iw3, 0, 16); s = last; }
            if (quads) hquads_avx2(s, d, W);
            else if (tail) hblocks_avx2(s, d, W);
            if (tail < W->out) {
                /* remaining pixels (rarely any): shift the pointers so hrow_sse2 starts at `tail` */
                if (tail == 0) hrow_sse2(s, d, W);
                else {
                    const __m128i bias = _mm_set1_epi32(1 << (W->prec - 1)), z = _mm_setzero_si128();
                    for (int x = tail; x < W->out; x++) {
                        const uint8_t *p = s + 3 * W->start[x];
                        __m128i a = bias;
                        for (int k = 0; k < W->kp; k += 2) {
                            __m128i t = _mm_unpacklo_epi8(load32(p + 3 * k), load32(p + 3 * k + 3));
                            a = _mm_add_epi32(a, _mm_madd_epi16(_mm_unpacklo_epi8(t, z),
                                                                _mm_set1_epi32(W->wpair[x * W->kp / 2 + k / 2])));
                        }
                        a = _mm_srai_epi32(a, W->prec);
                        a = _mm_packs_epi32(a, a);
                        store32(d + 3 * x, _mm_packus_epi16(a, a));
                    }
                }
            }
        }
        return;
    }
#endif
    (void)ih; (void)level;
    hpass_scalar(src, sstride, r0, r1, tmp, tstride, W);
}

static void vpass(const uint8_t *tmp, long tstride, uint8_t *dst, long dstride, int n, const rs_weights *W, int level) {
#if RS_X86
    if (level >= 2 && W->kp) { vpass_avx2(tmp, tstride, dst, dstride, n, W); return; }
    if (level >= 1 && W->kp) { vpass_sse2(tmp, tstride, dst, dstride, n, W); return; }
#endif
    (void)level;
    vpass_scalar(tmp, tstride, dst, dstride, n, W, 0, W->out, 0);
}

static int level_default(void) {
#if RS_X86
    return use_avx2() ? 2 : 1;
#else
    return 0;
#endif
}

/* Bytes of scratch a resize of ih rows to ow columns needs (the horizontal pass's output). */
size_t rs_scratch_bytes(int ih, int ow) { return (size_t)ih * (size_t)ow * 3 + 64; }

static int resize_level(const uint8_t *src, long sstride, int ih, int iw, uint8_t *dst, long dstride, int oh, int ow,
                        const rs_weights *wh, const rs_weights *wv, int level, uint8_t *scratch, size_t scratch_size) {
    if (ih < 1 || iw < 1 || oh < 1 || ow < 1) return -1;
    if (ih == oh && iw == ow) {
        for (int y = 0; y < ih; y++) memcpy(dst + y * dstride, src + y * sstride, (size_t)iw * 3);
        return 0;
    }
    if (iw != ow && (!wh || wh->in != iw || wh->out != ow)) return -2;
    if (ih != oh && (!wv || wv->in != ih || wv->out != oh)) return -3;
    if (iw == ow) {  /* vertical only: straight from the source rows */
        vpass(src, sstride, dst, dstride, iw * 3, wv, level);
        return 0;
    }
    long tstride = (long)ow * 3;
    if (!scratch || scratch_size < rs_scratch_bytes(ih, ow)) return -4;
    if (ih == oh) {  /* horizontal only */
        hpass(src, sstride, ih, 0, ih, scratch, tstride, wh, level);
        for (int y = 0; y < ih; y++) memcpy(dst + y * dstride, scratch + y * tstride, (size_t)ow * 3);
        return 0;
    }
    /* rows the vertical pass reads */
    int r0 = ih, r1 = 0;
    for (int y = 0; y < oh; y++) {
        int a = wv->kp && level >= 1 ? wv->start[y] : wv->cstart[y];
        int b = a + (wv->kp && level >= 1 ? wv->kp : wv->count[y]);
        if (a < r0) r0 = a;
        if (b > r1) r1 = b;
    }
    if (r0 >= r1) { r0 = 0; r1 = 0; }
    hpass(src, sstride, ih, r0, r1, scratch, tstride, wh, level);
    vpass(scratch, tstride, dst, dstride, ow * 3, wv, level);
    return 0;
}

/* Resize the ih x iw x 3 region at src (row stride sstride bytes) into the oh x ow x 3 region at
   dst (row stride dstride). wh: weights (iw -> ow), wv: weights (ih -> oh); either may be NULL when
   that side keeps its size. scratch: rs_scratch_bytes(ih, ow) bytes the call may use. Rows of the
   source are read up to 16 bytes past their last pixel (never past the last row's), so a source
   row must span at least 16 bytes. Returns 0, or a negative number on bad arguments. */
int rs_resize(const uint8_t *src, long sstride, int ih, int iw, uint8_t *dst, long dstride, int oh, int ow,
              const rs_weights *wh, const rs_weights *wv, uint8_t *scratch, size_t scratch_size) {
    return resize_level(src, sstride, ih, iw, dst, dstride, oh, ow, wh, wv, level_default(), scratch, scratch_size);
}

/* Same with a forced code path: 0 scalar, 1 SSE2, 2 AVX2 (if the CPU has it). */
int rs_resize_level(const uint8_t *src, long sstride, int ih, int iw, uint8_t *dst, long dstride, int oh, int ow,
                    const rs_weights *wh, const rs_weights *wv, int level, uint8_t *scratch, size_t scratch_size) {
    int top = level_default();
    return resize_level(src, sstride, ih, iw, dst, dstride, oh, ow, wh, wv, level < top ? level : top, scratch,
                        scratch_size);
}

/* The code path rs_resize takes here: 2 AVX2, 1 SSE2, 0 portable C. */
int rs_level(void) { return level_default(); }

/* An importable module, so that setuptools can build this file as an extension; it has no Python
   functions (loaders/resize_kernel.py calls the ones above through ctypes). */
static struct PyModuleDef resize_module = {PyModuleDef_HEAD_INIT, "_resize",
                                           "packload's compiled resize kernel (see loaders/resize_kernel.py).", -1,
                                           NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__resize(void) { return PyModule_Create(&resize_module); }
