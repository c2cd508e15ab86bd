"""``python -m flowwarden.cli``: the ``flowwarden`` command."""

from flowwarden.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
