"""The commands: `main` parses and dispatches, `launch` (`mount`, `umount`),
`report` (`inspect`), `verdict` (`ls`'s llama.cpp column), `export`, `fstab`
(`mount.compatfs`'s options), `demo` the demo store."""
