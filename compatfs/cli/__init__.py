"""The commands: `main` parses and dispatches, `locate` (which source a
command reads), `listing` (`ls`, `inspect`), `launch` (`mount`, `umount`),
`report` (`inspect`'s account), `verdict` (`ls`'s llama.cpp column), `export`,
`fstab` (`mount.compatfs`'s options), `demo` the demo store."""


class CliError(Exception):
    """One clear line for the user; exit status 1."""
