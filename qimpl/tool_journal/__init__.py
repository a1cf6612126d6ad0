"""The tool journal (R-TOOL-1..5), in one folder: a provider's tool calls run through the
runtime and each is journaled in ``tool_invocations`` so that a retried attempt reuses
what is known and parks what is not.

- ``seam``   what a provider may ask to run: tool kinds, specs, the registry (``QIMPL_TOOLS``);
- ``rules``  the pure rules: what a journal row means, which approval a call may use;
- ``steps``  the owner running one step's calls through the journal (fenced writes);
- ``store``  reads of the journal and the settlements made from outside the worker.

Its routes are ``qimpl.api.routers.tools``; its table and trigger are in the migrations
(QG009, QG011). Not to be confused with the *event journal* (``run_events``, the run's
stream) or the *transition audit* (``run_transitions``).
"""
