"""The GGUF format: typed values (`values`) and a blob's parsed header
(`header`).  Imports nothing else of compatfs."""
