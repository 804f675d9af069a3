"""What the index keeps of a blob (`Summary`): its views as `stat` sees
them, and the checks every value read back from disk must pass."""

from __future__ import annotations

from dataclasses import dataclass

_MAX_SIZE = 1 << 62  # a view size beyond this is no size of a real file


@dataclass(frozen=True)
class Summary:
    """A blob's views as `stat` sees them: sizes (None: no such view), the
    handlers that make them, or why the blob cannot be presented."""

    model_size: int
    mmproj_size: int | None
    text: str | None = None
    clip: str | None = None
    error: str | None = None
    arch: str | None = None  # general.architecture of model.gguf (after translation)
    model_error: str | None = None  # why model.gguf is refused (its size then 0)
    mmproj_error: str | None = None  # why mmproj.gguf is refused (its size then 0)
    embedding: bool = False  # model.gguf names a pooling type for its architecture
    context_length: int | None = None  # the blob's trained context (`summaries.Trained`)
    block_count: int = 0  # the blocks the blob holds tensors of (`summaries.Trained`)

    def sound(self) -> bool:
        """Whether every value is of its kind (an entry read from disk may be anything)."""

        def text(v) -> bool:
            return v is None or type(v) is str

        return (
            sound_size(self.model_size)
            and (self.mmproj_size is None or sound_size(self.mmproj_size))
            and all(map(text, (self.text, self.clip, self.error, self.arch, self.model_error, self.mmproj_error)))
            and type(self.embedding) is bool
            and (self.context_length is None or sound_context_length(self.context_length))
            and sound_block_count(self.block_count)
        )

    @property
    def failed(self) -> bool:
        return any((self.error, self.model_error, self.mmproj_error))


def sound_size(v) -> bool:
    """Whether `v` can be the size of a view."""
    return type(v) is int and 0 <= v < _MAX_SIZE


def sound_context_length(v) -> bool:
    """Whether `v` can be a model's trained context length: a positive int32."""
    return type(v) is int and 0 < v < 1 << 31


def sound_block_count(v) -> bool:
    """Whether `v` can be a count of a model's blocks."""
    return type(v) is int and 0 <= v < 1 << 31
