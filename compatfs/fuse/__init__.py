"""The mount: `operations` the FUSE adapter over `libfuse` (the libfuse 3
binding), `attributes` what getattr and readdir answer, `paths` everything
kept per path (one owner), `current` the store's current view of a file,
`openfiles` what an open snapshots and a release closes, `readpath` a read's
reply, `rescan` the rescan thread (the only sender of kernel notifications),
`listings` the folders' listings kept for the readdir gate in C, `inodes`,
`daemon` the daemon's lifecycle, `sdnotify` systemd readiness."""
