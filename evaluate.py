"""Evaluate methods on a benchmark at a context length: `python evaluate.py method=sparsespec_l ctx=64k`.

Several methods on the same samples: `method=[ar,magicdec,sparsespec_l]`. The command line is
composed into one config per method by sparsespec.eval.cli and run by sparsespec.eval.harness; bad
input exits with status 2 and a message naming the key or file, before any result file is written.
With `logger=wandb` the finished out_dir is logged to W&B (sparsespec.tracking.log_evaluation).
"""

from __future__ import annotations

import sys

from sparsespec.eval.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
