"""gemma4: placeholder, being written (claims nothing yet)."""
from compatfs.translation import NEVER, Translation

TEXT = Translation(name="gemma4", detect=NEVER)
CLIP = Translation(name="gemma4-clip", detect=NEVER)
