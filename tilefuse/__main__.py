import sys

from tilefuse.cli.main import main

sys.exit(main())
