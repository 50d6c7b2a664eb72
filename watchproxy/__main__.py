import sys

from watchproxy.cli import main

sys.exit(main())
