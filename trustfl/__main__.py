"""`python -m trustfl` is the `trustfl` command."""
from trustfl.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
