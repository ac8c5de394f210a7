"""``python -m lightning_scale``: the ``lightning-scale`` command (see :mod:`lightning_scale.cli`)."""

from lightning_scale.cli import main

if __name__ == "__main__":
    main()
