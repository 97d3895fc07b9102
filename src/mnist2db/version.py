"""The package's version, on the ground floor: every module that reports it imports it from
here (``fetch/transport``'s User-Agent, ``--version`` of the CLI and of the drop-ins), never
from the public face ``mnist2db``, which stands above every operation."""

__version__ = "0.1.0"
