import sys

from commlab.run import main

sys.exit(main())
