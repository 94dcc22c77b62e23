"""`python -m ringside.client`: the `ringside` command."""

import sys

from ringside.client.cli import main

sys.exit(main())
