"""python -m minigate.course build [--check] | grade NOTEBOOK... | nbgrader DIR: see minigate/course/__init__.py."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
