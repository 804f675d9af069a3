"""The names of the files a mount shows, and the kind of file that is served
unchanged: what the source, the tree, the views, the router and the FUSE
layer all call them (and nothing else)."""

MODEL_FILE = "model.gguf"  # a model folder's text view
MMPROJ_FILE = "mmproj.gguf"  # a model folder's projector view
LAYER_FILE = "layer"  # a file that is not GGUF (params, template, ..., models.ini), served unchanged
PRESET_FILE = "models.ini"  # llama-server's router preset at the mount's root
