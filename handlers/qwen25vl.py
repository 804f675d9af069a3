"""qwen25vl: placeholder, being written (claims nothing yet)."""
from compatfs.translation import NEVER, Translation

TEXT = Translation(name="qwen25vl", detect=NEVER)
CLIP = Translation(name="qwen25vl-clip", detect=NEVER)
