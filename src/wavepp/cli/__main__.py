import sys

from wavepp.cli import main

sys.exit(main())
