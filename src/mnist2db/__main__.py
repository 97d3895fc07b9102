"""``python -m mnist2db``: the same command line as ``mnist2db``."""

from .cli import main

if __name__ == "__main__":
    main(prog_name="mnist2db")
