"""``python -m dtc_entrypoint [train] [--plan]``: same as the ``train`` command."""

from .cli import main

main()
