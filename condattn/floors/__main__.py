import sys

from .compute import main

sys.exit(main())
