"""The mount: `operations` the FUSE adapter over `libfuse` (the libfuse 3
binding), `attributes`/`memo` what getattr and readdir answer, `presented`
the store's current view of a file, `openfiles` what an open snapshots,
`readpath` a read's reply, `rescan` the rescan thread, `inodes`, `daemon`
the daemon's lifecycle, `sdnotify` systemd readiness."""
