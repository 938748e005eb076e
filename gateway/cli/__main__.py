"""``python -m gateway.cli``: the ``thinkgate`` command."""

import sys

from gateway.cli.main import main

if __name__ == "__main__":  # imported (the import test walks every module): nothing runs
    sys.exit(main())
