import sys

from commscope.cli import main

sys.exit(main())
