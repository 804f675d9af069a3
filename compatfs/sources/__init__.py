"""What is mounted: `base` what any source tells the tree (its folders, their
files, owners and times), `ollama` an Ollama store, `folder` a folder of GGUF
files, `choose` which of the two a path is.  Only these know a store's
layout."""
