/* The server of benchmarks/slowfs.py, the emulated slow disk: a read-only passthrough FUSE filesystem
 * that holds every open and read request for a fixed latency.
 *
 *     slowfs SRC MOUNTPOINT [--latency-ms 2] [--mbps MB/S] [--meta-latency-ms 0] [--stats-file FILE]
 *
 * Built (on first use, outside the repository) and started by benchmarks/slowfs.py:
 *
 *     cc -O2 -o slowfs slowfs.c $(pkg-config fuse --cflags --libs)
 *
 * libfuse 2, high-level API, multithreaded: each request runs on its own worker thread and waits
 * with a sleep, so concurrent requests overlap as on a network disk (latency adds per request, not
 * per byte). ``--mbps`` caps all reads together (MB/s, 10**6 bytes): the link carries one read at a
 * time at that rate. ``--meta-latency-ms`` delays getattr (which also serves lookups) and readdir.
 * Symlinks under SRC are shown as what they point to. Mount options: ro, auto_cache, allow_other when
 * root, libfuse's default 1 s attribute and entry timeouts; the kernel cuts reads into requests of at
 * most 128 KiB. No Python in the data path: the CPU it takes per request, on the cores the reader
 * under test uses too, stays small.
 *
 * The counters are served as JSON, in the shape of ``Stats.to_json`` in slowfs.py, from the hidden
 * file MOUNTPOINT/.slowfs-stats (not listed, not counted, never delayed, never cached) and written to
 * ``--stats-file`` when the filesystem stops (unmounted, SIGINT, SIGTERM or SIGHUP).
 */
#define FUSE_USE_VERSION 26
#define _GNU_SOURCE

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define STATS_PATH "/.slowfs-stats"
#define STATS_FH ((uint64_t)1 << 62) /* file handle of the counters file (never a real descriptor) */

/* ------------------------------------------------------------------ settings */

static char root[PATH_MAX];      /* SRC, resolved */
static double latency_s;         /* per open and read request */
static double meta_latency_s;    /* per getattr and readdir */
static double mbps;              /* 0: no bandwidth cap */

/* ------------------------------------------------------------------ counters (under `mu`) */

struct size_count {
    size_t size;
    uint64_t count;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t opens, reads, read_bytes, getattrs, readdirs;
static struct size_count *sizes; /* read request sizes, sorted by size */
static size_t n_sizes, cap_sizes;
static long in_flight, max_in_flight;
static double delay_s;   /* total time requests were held back (latency and bandwidth) */
static double link_free; /* when the bandwidth-capped link is next idle (monotonic seconds) */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* Sleep until the monotonic time `until` (seconds). */
static void sleep_until(double until) {
    struct timespec t;
    t.tv_sec = (time_t)until;
    t.tv_nsec = (long)((until - t.tv_sec) * 1e9);
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec += 1;
        t.tv_nsec -= 1000000000L;
    }
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) == EINTR)
        ;
}

/* Hold a request back for `seconds` and count it in delay_s (as `_wait` does in slowfs.py). */
static void wait_for(double seconds) {
    if (seconds <= 0)
        return;
    sleep_until(now_s() + seconds);
    pthread_mutex_lock(&mu);
    delay_s += seconds;
    pthread_mutex_unlock(&mu);
}

/* Count one read request of `size` bytes in the sorted histogram (caller holds `mu`). */
static void count_size(size_t size) {
    size_t i = 0;
    while (i < n_sizes && sizes[i].size < size)
        i++;
    if (i < n_sizes && sizes[i].size == size) {
        sizes[i].count++;
        return;
    }
    if (n_sizes == cap_sizes) {
        size_t cap = cap_sizes ? 2 * cap_sizes : 64;
        struct size_count *grown = realloc(sizes, cap * sizeof *grown);
        if (!grown)
            return; /* out of memory: the request goes uncounted in the histogram only */
        sizes = grown;
        cap_sizes = cap;
    }
    memmove(sizes + i + 1, sizes + i, (n_sizes - i) * sizeof *sizes);
    sizes[i] = (struct size_count){size, 1};
    n_sizes++;
}

/* The counters as JSON, the shape of Stats.to_json (malloc'd, NUL-terminated; NULL if out of memory). */
static char *stats_json(size_t *len) {
    pthread_mutex_lock(&mu);
    size_t cap = 512 + n_sizes * 48;
    char *out = malloc(cap);
    if (!out) {
        pthread_mutex_unlock(&mu);
        return NULL;
    }
    size_t n = snprintf(out, cap,
                        "{\"opens\": %llu, \"reads\": %llu, \"read_bytes\": %llu, \"getattrs\": %llu, "
                        "\"readdirs\": %llu, \"read_sizes\": {",
                        (unsigned long long)opens, (unsigned long long)reads,
                        (unsigned long long)read_bytes, (unsigned long long)getattrs,
                        (unsigned long long)readdirs);
    for (size_t i = 0; i < n_sizes; i++)
        n += snprintf(out + n, cap - n, "%s\"%zu\": %llu", i ? ", " : "", sizes[i].size,
                      (unsigned long long)sizes[i].count);
    double mean_kb = reads ? (double)read_bytes / reads / 1024 : 0.0;
    n += snprintf(out + n, cap - n,
                  "}, \"max_reads_in_flight\": %ld, \"delay_s\": %.9f, \"mean_read_kb\": %.9f}",
                  max_in_flight, delay_s, mean_kb);
    pthread_mutex_unlock(&mu);
    *len = n;
    return out;
}

/* ------------------------------------------------------------------ the filesystem */

/* The path under SRC behind a mount path ("/a/b" -> "SRC/a/b"); -ENAMETOOLONG if it does not fit. */
static int real_path(const char *path, char *buf) {
    return snprintf(buf, PATH_MAX, "%s%s", root, path) < PATH_MAX ? 0 : -ENAMETOOLONG;
}

static int sf_getattr(const char *path, struct stat *out) {
    memset(out, 0, sizeof *out);
    if (strcmp(path, STATS_PATH) == 0) { /* the counters: never delayed or counted, size 0 */
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        out->st_mode = S_IFREG | 0444;
        out->st_nlink = 1;
        out->st_atim = out->st_mtim = out->st_ctim = t;
        return 0;
    }
    wait_for(meta_latency_s);
    pthread_mutex_lock(&mu);
    getattrs++;
    pthread_mutex_unlock(&mu);
    char real[PATH_MAX];
    struct stat st;
    if (real_path(path, real) < 0)
        return -ENAMETOOLONG;
    if (stat(real, &st) < 0) /* symlinks followed: shown as what they point to */
        return -errno;
    /* These fields only (no inode, device or block size). */
    out->st_mode = st.st_mode & ~0222; /* read-only */
    out->st_nlink = st.st_nlink;
    out->st_size = st.st_size;
    out->st_uid = st.st_uid;
    out->st_gid = st.st_gid;
    out->st_blocks = st.st_blocks;
    out->st_atim = st.st_atim;
    out->st_mtim = st.st_mtim;
    out->st_ctim = st.st_ctim;
    return 0;
}

static int sf_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t offset,
                      struct fuse_file_info *fi) {
    (void)offset;
    (void)fi;
    wait_for(meta_latency_s);
    pthread_mutex_lock(&mu);
    readdirs++;
    pthread_mutex_unlock(&mu);
    char real[PATH_MAX];
    if (real_path(path, real) < 0)
        return -ENAMETOOLONG;
    DIR *dir = opendir(real);
    if (!dir)
        return -errno;
    fill(buf, ".", NULL, 0);
    fill(buf, "..", NULL, 0);
    struct dirent *e;
    while ((e = readdir(dir)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            fill(buf, e->d_name, NULL, 0);
    closedir(dir);
    return 0;
}

static int sf_statfs(const char *path, struct statvfs *out) {
    char real[PATH_MAX];
    if (real_path(path, real) < 0)
        return -ENAMETOOLONG;
    return statvfs(real, out) < 0 ? -errno : 0;
}

static int sf_access(const char *path, int mode) {
    (void)path;
    return mode & W_OK ? -EROFS : 0;
}

static int sf_open(const char *path, struct fuse_file_info *fi) {
    if (fi->flags & (O_WRONLY | O_RDWR | O_TRUNC | O_APPEND))
        return -EROFS;
    if (strcmp(path, STATS_PATH) == 0) {
        fi->fh = STATS_FH;
        fi->direct_io = 1; /* never cached: every read sees the current counters */
        return 0;
    }
    wait_for(latency_s);
    char real[PATH_MAX];
    if (real_path(path, real) < 0)
        return -ENAMETOOLONG;
    int fd = open(real, O_RDONLY);
    if (fd < 0)
        return -errno;
    fi->fh = (uint64_t)fd;
    pthread_mutex_lock(&mu);
    opens++;
    pthread_mutex_unlock(&mu);
    return 0;
}

static int sf_read(const char *path, char *buf, size_t size, off_t offset, struct fuse_file_info *fi) {
    (void)path;
    if (fi->fh == STATS_FH) {
        size_t len;
        char *json = stats_json(&len);
        if (!json)
            return -ENOMEM;
        size_t n = (size_t)offset < len ? len - (size_t)offset : 0;
        if (n > size)
            n = size;
        memcpy(buf, json + (n ? offset : 0), n);
        free(json);
        return (int)n;
    }
    double start = now_s(), done = start + latency_s;
    pthread_mutex_lock(&mu);
    if (++in_flight > max_in_flight)
        max_in_flight = in_flight;
    if (mbps > 0) { /* the link carries one read at a time at the capped rate */
        double begin = done > link_free ? done : link_free;
        done = link_free = begin + size / (mbps * 1e6);
    }
    pthread_mutex_unlock(&mu);
    if (done > start)
        sleep_until(done);
    ssize_t n = pread((int)fi->fh, buf, size, offset);
    int err = errno;
    pthread_mutex_lock(&mu);
    in_flight--;
    delay_s += done > start ? done - start : 0.0;
    if (n >= 0) {
        reads++;
        read_bytes += (uint64_t)n;
        count_size(size); /* the size asked for, as the kernel sent it */
    }
    pthread_mutex_unlock(&mu);
    return n < 0 ? -err : (int)n;
}

static int sf_release(const char *path, struct fuse_file_info *fi) {
    (void)path;
    if (fi->fh != STATS_FH)
        close((int)fi->fh);
    return 0;
}

/* As fusepy's defaults, so the kernel keeps sending the same requests: a flush on every close
 * (an unimplemented flush would tell the kernel to stop), and no extended attributes. */
static int sf_flush(const char *path, struct fuse_file_info *fi) {
    (void)path;
    (void)fi;
    return 0;
}

static int sf_getxattr(const char *path, const char *name, char *value, size_t size) {
    (void)path;
    (void)name;
    (void)value;
    (void)size;
    return -ENOTSUP;
}

static int sf_listxattr(const char *path, char *list, size_t size) {
    (void)path;
    (void)list;
    (void)size;
    return 0;
}

static const struct fuse_operations ops = {
    .getattr = sf_getattr,
    .readdir = sf_readdir,
    .statfs = sf_statfs,
    .access = sf_access,
    .open = sf_open,
    .read = sf_read,
    .release = sf_release,
    .flush = sf_flush,
    .getxattr = sf_getxattr,
    .listxattr = sf_listxattr,
};

/* ------------------------------------------------------------------ command line */

static int usage(const char *why) {
    fprintf(stderr, "slowfs: %s\nusage: slowfs SRC MOUNTPOINT [--latency-ms MS] [--mbps MB/S] "
                    "[--meta-latency-ms MS] [--stats-file FILE]\n", why);
    return 2;
}

/* A number >= 0 (> 0 when `positive`) from an option's argument, or -1. */
static double parse_number(const char *text, int positive) {
    char *end;
    double v = strtod(text, &end);
    if (end == text || *end != '\0' || v < 0 || (positive && v == 0))
        return -1;
    return v;
}

int main(int argc, char **argv) {
    static const struct option options[] = {
        {"latency-ms", required_argument, NULL, 'l'},
        {"mbps", required_argument, NULL, 'b'},
        {"meta-latency-ms", required_argument, NULL, 'm'},
        {"stats-file", required_argument, NULL, 's'},
        {NULL, 0, NULL, 0},
    };
    const char *stats_file = NULL;
    latency_s = 0.002;
    int c;
    while ((c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        double v = c == 's' || c == '?' ? 0 : parse_number(optarg, c == 'b');
        if (v < 0)
            return usage("latencies must be >= 0 and --mbps > 0");
        switch (c) {
        case 'l': latency_s = v / 1000; break;
        case 'm': meta_latency_s = v / 1000; break;
        case 'b': mbps = v; break;
        case 's': stats_file = optarg; break;
        default: return usage("unknown option");
        }
    }
    if (argc - optind != 2)
        return usage("give SRC and MOUNTPOINT");
    const char *source = argv[optind], *mountpoint = argv[optind + 1];
    struct stat st;
    if (!realpath(source, root) || stat(root, &st) < 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "slowfs: %s: not a folder; give the folder to serve\n", source);
        return 2;
    }
    if (strcmp(root, "/") == 0)
        root[0] = '\0'; /* "/" + "/a" would be "//a": harmless, but keep paths clean */

    /* fsname "slowfs:NAME" with NAME the last part of SRC as given (as Path(source).name). */
    char name[NAME_MAX + 1];
    size_t end = strlen(source);
    while (end > 1 && source[end - 1] == '/')
        end--;
    size_t begin = end;
    while (begin > 0 && source[begin - 1] != '/')
        begin--;
    snprintf(name, sizeof name, "%.*s", (int)(end - begin), source + begin);
    char mount_options[NAME_MAX + 64];
    snprintf(mount_options, sizeof mount_options, "ro,%sauto_cache,fsname=slowfs:%s,subtype=slowfs",
             geteuid() == 0 ? "allow_other," : "", name);

    char *fuse_argv[] = {"slowfs", "-f", "-o", mount_options, (char *)mountpoint, NULL};
    int rc = fuse_main(5, fuse_argv, &ops, NULL); /* multithreaded: no -s */

    if (stats_file) {
        size_t len;
        char *json = stats_json(&len);
        FILE *f = fopen(stats_file, "wb");
        if (json && f)
            fwrite(json, 1, len, f);
        if (f)
            fclose(f);
        free(json);
    }
    if (rc != 0) {
        fprintf(stderr, "slowfs: %s: mount failed; is it empty and not mounted already?\n", mountpoint);
        return 1;
    }
    return 0;
}
