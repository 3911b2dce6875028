"""`python3 cli.py ...` from a checkout: the same command line as the installed `specsample`."""
from specsample_cupy.cli.main import main

if __name__ == "__main__":
    main()
