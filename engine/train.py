"""Entry point: `python -m engine.train SPEC.json [--events OUT.jsonl] [--bus URL --job ID]`."""

import sys

from engine.runtime.cli import main

if __name__ == "__main__":
    sys.exit(main())
