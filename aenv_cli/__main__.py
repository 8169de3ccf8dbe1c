"""``python -m aenv_cli``: the same as the ``aenv`` console script."""

import sys

from aenv_cli import main

if __name__ == "__main__":
    sys.exit(main())
