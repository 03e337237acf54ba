import sys

from commbench.cli.main import main

sys.exit(main())
