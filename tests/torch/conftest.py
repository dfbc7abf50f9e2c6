"""Make the helper modules beside the torch tests importable (also inside spawned ranks)."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
