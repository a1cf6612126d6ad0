"""One ``APIRouter`` per resource, assembled by ``qimpl.api.app.create_app``:

- ``runs``        create and read a run (R-CREATE-1..6, R-READ-1)
- ``controls``    resume, cancel and approval decisions (R-RESUME-1..3, R-CANCEL-1, R-APPROVAL-1)
- ``events``      the run's event stream (R-EVENT-2, R-AUTH-3)
- ``legacy``      ``/v1/answer`` and the legacy controls (R-CREATE-7, R-LEGACY-1)
- ``operations``  ``/metrics`` and ``/healthz`` (R-OPS-6, R-OPS-7)
- ``listing``     a client's runs and an operator's runs across its tenants (R-READ-5)
- ``tools``       the tool journal's results and the operator's reconciliation (R-TOOL-3/4)
"""
