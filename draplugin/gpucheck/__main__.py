"""`python -m draplugin.gpucheck`: the GPU check (`draplugin.gpucheck.check`)."""

import sys

from draplugin.gpucheck.check import main

sys.exit(main())
