"""A task that writes its arguments to the file named by its first one."""

import sys
from pathlib import Path

Path(sys.argv[1]).write_text(" ".join(sys.argv[2:]))
