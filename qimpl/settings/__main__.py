"""``python -m qimpl.settings``: print the settings table of ``docs/operations.md``."""

import sys

from qimpl.settings.loading import settings_table

sys.stdout.write(settings_table())
