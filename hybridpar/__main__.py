import sys

from hybridpar.cli.main import main

sys.exit(main())
