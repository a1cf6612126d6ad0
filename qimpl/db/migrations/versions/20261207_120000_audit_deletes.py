"""The key audit records deletions and rotations too (issue 25, item 11; R-AUTH-1).

Revision ID: 20261207_120000_audit_deletes
Revises: 20261207_110000_failure_codes
Create Date: 2026-12-07 12:00:00

``qimpl_audit_api_keys`` (written whole) now runs on DELETE as well: a key deleted — from
psql, or by ``qualify up`` dropping the harness's template keys — leaves a ``deleted`` row
instead of a ``created`` row with no end. ``rotated`` is a kind of its own: ``api_keys
rotate`` writes one naming the old and the new ``key_id``.
"""

from alembic import op

revision = "20261207_120000_audit_deletes"
down_revision = "20261207_110000_failure_codes"
branch_labels = None
depends_on = None

#: Every trigger and SECURITY DEFINER function's search path, temporary relations last
#: (as since 20261201_100000_hardening).
SAFE_PATH = "SET search_path = pg_catalog, public, pg_temp"


OLD_ACTIONS = ("created", "disabled", "expiry_set", "tenant_assigned", "tenant_unassigned")
ACTIONS = (*OLD_ACTIONS, "deleted", "rotated")


def _actions_check(actions: tuple[str, ...], *, valid: bool = True) -> str:
    """The audit's action check over ``actions``; ``valid=False`` adds it NOT VALID."""
    listed = ", ".join(f"'{a}'" for a in actions)
    not_valid = "" if valid else " NOT VALID"
    return ("ALTER TABLE public.api_key_audit DROP CONSTRAINT api_key_audit_action_check;\n"
            "ALTER TABLE public.api_key_audit ADD CONSTRAINT api_key_audit_action_check"
            f" CHECK (action IN ({listed})){not_valid};\n")


def _audit(deletes: bool) -> str:
    """``qimpl_audit_api_keys`` whole and its trigger; with ``deletes``, this revision's."""
    on_delete = """
    IF TG_OP = 'DELETE' THEN
        INSERT INTO public.api_key_audit (key_id, tenant_id, principal_id, action, actor, detail)
        VALUES (OLD.key_id, OLD.tenant_id, OLD.principal_id, 'deleted', public.qimpl_api_key_actor(),
                jsonb_build_object('role', OLD.role, 'revoked_at', OLD.revoked_at));
        RETURN OLD;
    END IF;""" if deletes else ""
    events = "INSERT OR UPDATE OR DELETE" if deletes else "INSERT OR UPDATE"
    return f"""
CREATE OR REPLACE FUNCTION public.qimpl_audit_api_keys() RETURNS trigger
LANGUAGE plpgsql {SAFE_PATH} AS $$
BEGIN{on_delete}
    IF TG_OP = 'INSERT' THEN
        INSERT INTO public.api_key_audit (key_id, tenant_id, principal_id, action, actor, detail)
        VALUES (NEW.key_id, NEW.tenant_id, NEW.principal_id, 'created', public.qimpl_api_key_actor(),
                jsonb_build_object('role', NEW.role, 'expires_at', NEW.expires_at));
        RETURN NEW;
    END IF;
    IF OLD.revoked_at IS NULL AND NEW.revoked_at IS NOT NULL THEN
        INSERT INTO public.api_key_audit (key_id, tenant_id, principal_id, action, actor, detail)
        VALUES (NEW.key_id, NEW.tenant_id, NEW.principal_id, 'disabled', public.qimpl_api_key_actor(),
                jsonb_build_object('revoked_at', NEW.revoked_at));
    END IF;
    IF NEW.expires_at IS DISTINCT FROM OLD.expires_at THEN
        INSERT INTO public.api_key_audit (key_id, tenant_id, principal_id, action, actor, detail)
        VALUES (NEW.key_id, NEW.tenant_id, NEW.principal_id, 'expiry_set', public.qimpl_api_key_actor(),
                jsonb_build_object('expires_at', NEW.expires_at, 'previous', OLD.expires_at));
    END IF;
    RETURN NEW;
END;
$$;
DROP TRIGGER api_keys_audit ON public.api_keys;
CREATE TRIGGER api_keys_audit AFTER {events} ON public.api_keys
    FOR EACH ROW EXECUTE FUNCTION public.qimpl_audit_api_keys();
"""


def upgrade() -> None:
    op.execute(_actions_check(ACTIONS) + _audit(deletes=True))


def downgrade() -> None:
    # Audit rows of the new kinds stay: the audit is append-only (QG017), so the old check
    # is restored NOT VALID (it holds for every new row).
    op.execute(_audit(deletes=False) + _actions_check(OLD_ACTIONS, valid=False))
