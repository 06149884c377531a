"""`python -m demo`: the demo (README command 1), as `pcs-demo`."""

from demo.demo import main

main()
