"""The views of a blob and their bytes: `catalog` which views a blob has and
which handler makes them, `index` the persistent index of their sizes,
`layout` a virtual file laid out as `segments` (what its bytes are made of),
`assemble` the one assembler of their bytes,
`ahead` op ranges computed ahead of a reader, `opcache` the op cache,
`sampling` a model folder's model.gguf with its params layer's sampling keys."""
