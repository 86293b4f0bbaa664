"""``python -m sglang_fp4ext.cli`` = the ``fp4ext`` command."""

import sys

from sglang_fp4ext.cli import main

sys.exit(main())
