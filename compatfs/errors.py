"""The error every refusal of a file's bytes is: the bottom of the package,
imported by the readers of bytes (`files`) and of the format (`format`)
alike."""


class GGUFError(ValueError):
    """A GGUF file that cannot be read; the message names what is wrong."""
