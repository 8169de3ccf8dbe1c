"""``python -m aenv_ray.cli``: the same as the ``aenv`` console script."""

import sys

from aenv_ray.cli import main

if __name__ == "__main__":
    sys.exit(main())
