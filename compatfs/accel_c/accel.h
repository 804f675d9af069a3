/* What the files of compatfs._accel share: each one's functions the
 * module's method table (module.c) names, and whether root's opens of
 * folders are answered in C (folders.c), which polling.c asks. */
#ifndef COMPATFS_ACCEL_H
#define COMPATFS_ACCEL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

PyObject *accel_mxfp4_repack(PyObject *self, PyObject *args);
PyObject *accel_gather_read(PyObject *self, PyObject *args);
PyObject *accel_keep_opendir(PyObject *self, PyObject *args);
PyObject *accel_opendir_gate(PyObject *self, PyObject *args);
PyObject *accel_dir_handle(PyObject *self, PyObject *unused);
PyObject *accel_listed(PyObject *self, PyObject *args);
PyObject *accel_readdir_gate(PyObject *self, PyObject *args);
PyObject *accel_polling_io(PyObject *self, PyObject *args);
PyObject *accel_polled(PyObject *self, PyObject *unused);
PyObject *accel_read_gate(PyObject *self, PyObject *args);
PyObject *accel_read_plan(PyObject *self, PyObject *args);
PyObject *accel_read_forget(PyObject *self, PyObject *args);
PyObject *accel_read_planned(PyObject *self, PyObject *args);
PyObject *accel_read_events(PyObject *self, PyObject *unused);
PyObject *accel_read_generation(PyObject *self, PyObject *unused);
PyObject *accel_read_served(PyObject *self, PyObject *unused);

int accel_root_opens_gated(void);

#endif
