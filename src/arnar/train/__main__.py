"""``python -m arnar.train ...`` (and ``torchrun --nproc_per_node N -m arnar.train ...``): ``arnar train``."""

import sys

from arnar.train import main

sys.exit(main())
