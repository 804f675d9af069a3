/* Minimal libfuse3 read-only passthrough of one file, the baseline that
 * scripts/bench.py compares compatfs against.
 *
 *   passthrough FILE MOUNTPOINT [fuse options]   ->  MOUNTPOINT/blob
 */
#define FUSE_USE_VERSION 31
#include <fuse.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *source;
static struct stat source_st;

static void *bench_init(struct fuse_conn_info *conn, struct fuse_config *cfg) {
    /* Requests in flight as compatfs allows them (its 64 workers): the
     * kernel's 12 would make the baseline wait where compatfs does not. */
    conn->max_background = 64;
    conn->congestion_threshold = 48;
    cfg->kernel_cache = 1;
    cfg->attr_timeout = cfg->entry_timeout = 3600;
    return NULL;
}

static int bench_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
    (void)fi;
    memset(st, 0, sizeof *st);
    if (strcmp(path, "/") == 0) {
        st->st_mode = S_IFDIR | 0555;
        st->st_nlink = 2;
    } else if (strcmp(path, "/blob") == 0) {
        st->st_mode = S_IFREG | 0444;
        st->st_nlink = 1;
        st->st_size = source_st.st_size;
    } else {
        return -ENOENT;
    }
    return 0;
}

static int bench_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
                         struct fuse_file_info *fi, enum fuse_readdir_flags flags) {
    (void)off; (void)fi; (void)flags;
    if (strcmp(path, "/") != 0) return -ENOENT;
    fill(buf, ".", NULL, 0, 0);
    fill(buf, "..", NULL, 0, 0);
    fill(buf, "blob", NULL, 0, 0);
    return 0;
}

static int bench_open(const char *path, struct fuse_file_info *fi) {
    if (strcmp(path, "/blob") != 0) return -ENOENT;
    if ((fi->flags & O_ACCMODE) != O_RDONLY) return -EROFS;
    int fd = open(source, O_RDONLY);
    if (fd < 0) return -errno;
    fi->fh = (uint64_t)fd;
    return 0;
}

static int bench_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi) {
    (void)path;
    ssize_t n = pread((int)fi->fh, buf, size, off);
    return n < 0 ? -errno : (int)n;
}

static int bench_release(const char *path, struct fuse_file_info *fi) {
    (void)path;
    close((int)fi->fh);
    return 0;
}

static const struct fuse_operations ops = {
    .init = bench_init, .getattr = bench_getattr, .readdir = bench_readdir,
    .open = bench_open, .read = bench_read, .release = bench_release,
};

int main(int argc, char *argv[]) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s FILE MOUNTPOINT [fuse options]\n", argv[0]);
        return 2;
    }
    source = argv[1];
    if (stat(source, &source_st) != 0) { perror(source); return 1; }
    argv[1] = argv[0];
    return fuse_main(argc - 1, argv + 1, &ops, NULL);
}
