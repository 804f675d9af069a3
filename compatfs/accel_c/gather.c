/* gather_read(fd, dst, offset, unit, stride, count, period): `count` runs of
 * `unit` bytes of the file `fd` holds, run i from byte offset + i * stride,
 * read straight into `dst` at i * period: the file's span from `offset` to
 * the end of the last run read with preadv in one pass, each run's bytes
 * scattered into its place in `dst` and the bytes between runs into one
 * small buffer that is thrown away (what compatfs.view.assemble otherwise
 * does by reading the span into scratch memory and copying the runs out with
 * numpy).  Returns the bytes of the span read: fewer than its size where the
 * file ends first.  Runs without the GIL; OSError as preadv fails. */
#include "accel.h"

#include <errno.h>
#include <limits.h>
#include <sys/uio.h>

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

/* The span's bytes from `done` on, as iovecs (at most IOV_MAX) into `iov`:
 * run i's bytes into out + i * period, the gap after it into `junk`.
 * Returns how many iovecs were made. */
static int span_iovecs(struct iovec *iov, uint8_t *out, uint8_t *junk, Py_ssize_t unit, Py_ssize_t stride,
                       Py_ssize_t count, Py_ssize_t period, Py_ssize_t done)
{
    int n = 0;
    Py_ssize_t i = done / stride, at = done % stride;
    while (i < count && n < IOV_MAX) {
        if (at < unit) {
            iov[n].iov_base = out + i * period + at;
            iov[n].iov_len = (size_t)(unit - at);
            n++;
            at = unit;
        } else if (i + 1 < count) {
            if (stride > at) {
                iov[n].iov_base = junk;
                iov[n].iov_len = (size_t)(stride - at);
                n++;
            }
            at = 0;
            i++;
        } else {
            break;
        }
    }
    return n;
}

PyObject *accel_gather_read(PyObject *self, PyObject *args)
{
    Py_buffer dst;
    int fd;
    long long offset;
    Py_ssize_t unit, stride, count, period;
    (void)self;
    if (!PyArg_ParseTuple(args, "iw*Lnnnn", &fd, &dst, &offset, &unit, &stride, &count, &period))
        return NULL;
    const char *bad = NULL;
    if (fd < 0 || offset < 0 || unit <= 0 || stride < unit || period < unit || count <= 0)
        bad = "gather_read: a negative descriptor or offset, runs of no bytes, or runs that overlap";
    else if (count - 1 > (PY_SSIZE_T_MAX - unit) / stride || count - 1 > (PY_SSIZE_T_MAX - unit) / period
             || (count - 1) * stride + unit > LLONG_MAX - offset)
        bad = "gather_read: runs beyond any file or buffer";
    else if ((count - 1) * period + unit > dst.len)
        bad = "gather_read: the output buffer is shorter than the runs it must hold";
    if (bad) {
        PyBuffer_Release(&dst);
        PyErr_SetString(PyExc_ValueError, bad);
        return NULL;
    }
    Py_ssize_t span = (count - 1) * stride + unit, done = 0;
    uint8_t *junk = malloc(stride > unit ? (size_t)(stride - unit) : 1);
    struct iovec *iov = malloc(sizeof(struct iovec) * IOV_MAX);
    if (!junk || !iov) {
        free(junk);
        free(iov);
        PyBuffer_Release(&dst);
        return PyErr_NoMemory();
    }
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    while (done < span) {
        int n = span_iovecs(iov, dst.buf, junk, unit, stride, count, period, done);
        ssize_t got = preadv(fd, iov, n, (off_t)(offset + done));
        if (got < 0) {
            if (errno == EINTR)
                continue;
            err = errno;
            break;
        }
        if (got == 0)
            break;
        done += got;
    }
    Py_END_ALLOW_THREADS
    free(junk);
    free(iov);
    PyBuffer_Release(&dst);
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromSsize_t(done);
}
