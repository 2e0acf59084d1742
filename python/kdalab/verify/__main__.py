"""`python -m kdalab.verify`: see kdalab.verify.cli."""
import sys

from .cli import main

sys.exit(main())
