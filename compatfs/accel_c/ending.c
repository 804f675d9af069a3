/* Whether the mount's FUSE session goes on, for the path invalidations the
 * rescan thread sends: on its way out libfuse frees the high-level
 * library's table of nodes before the filesystem's destroy runs (and stops
 * that thread), so an invalidation of a path sent meanwhile would walk
 * freed memory.  The session's end waits for any invalidation under way,
 * and none is sent after it.
 *
 * notices_hold(): whether the session goes on; where it does the caller
 * holds it (a read lock) until it calls notices_release(), on the same
 * thread.
 * notices_begin(): a session begins (the end of an earlier one forgotten).
 * notices_end(): the session ends, once every hold is released; also
 * called from C (accel_session_ended) where a read of the FUSE device says
 * the connection ended. */
#include "accel.h"

#include <pthread.h>

static pthread_rwlock_t going = PTHREAD_RWLOCK_INITIALIZER;
static int ended;

/* The session's `ended` set to `value` once no hold is left. */
static void set_ended(int value)
{
    pthread_rwlock_wrlock(&going);
    ended = value;
    pthread_rwlock_unlock(&going);
}

void accel_session_ended(void)
{
    set_ended(1);
}

PyObject *accel_notices_hold(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    int held;
    Py_BEGIN_ALLOW_THREADS
    pthread_rwlock_rdlock(&going);
    held = !ended;
    if (!held)
        pthread_rwlock_unlock(&going);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(held);
}

PyObject *accel_notices_release(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    pthread_rwlock_unlock(&going);
    Py_RETURN_NONE;
}

PyObject *accel_notices_begin(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    set_ended(0);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

PyObject *accel_notices_end(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    set_ended(1);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}
