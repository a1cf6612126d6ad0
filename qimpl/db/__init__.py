"""PostgreSQL storage: migrations, connections, the run repository and the fence (the
owner's fenced writes in ``owner``, the ownership lease in ``lease``), listings and key
administration. The tool journal's reads and settlements are ``qimpl.tool_journal.store``."""
