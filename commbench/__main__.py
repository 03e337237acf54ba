import sys

from commbench.cli import main

sys.exit(main())
