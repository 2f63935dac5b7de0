/* jconfig.h for packload's compiled batch decoder (packload/core/_jpeg_boxes.c).
 *
 * libjpeg-turbo generates this file when it is built; this copy records the configuration of the
 * libjpeg API that packload calls: the libjpeg 6.2 ABI (JPEG_LIB_VERSION 62), which the
 * libjpeg-turbo in Pillow's wheels and the distributions' libjpeg62-turbo packages export, with
 * 8-bit samples and the in-memory source manager. jpeg_CreateDecompress() checks the version and
 * the size of the decompression struct it is given, so a library built differently refuses at once.
 * Derived from libjpeg-turbo's src/jconfig.h.in (see README.ijg and LICENSE.md beside it).
 */
#define JPEG_LIB_VERSION  62

#define MEM_SRCDST_SUPPORTED  1

#ifndef BITS_IN_JSAMPLE
#define BITS_IN_JSAMPLE  8
#endif

#ifdef _WIN32

#undef RIGHT_SHIFT_IS_UNSIGNED

/* Define "boolean" as unsigned char, not int, per Windows custom */
#ifndef __RPCNDR_H__            /* don't conflict if rpcndr.h already read */
typedef unsigned char boolean;
#endif
#define HAVE_BOOLEAN            /* prevent jmorecfg.h from redefining it */

/* Define "INT32" as int, not long, per Windows custom */
#if !(defined(_BASETSD_H_) || defined(_BASETSD_H))   /* don't conflict if basetsd.h already read */
typedef short INT16;
typedef signed int INT32;
#endif
#define XMD_H                   /* prevent jmorecfg.h from redefining it */

#endif
