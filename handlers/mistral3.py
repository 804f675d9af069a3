"""mistral3: placeholder, being written (claims nothing yet)."""
from compatfs.translation import NEVER, Translation

TEXT = Translation(name="mistral3", detect=NEVER)
CLIP = Translation(name="mistral3-clip", detect=NEVER)
