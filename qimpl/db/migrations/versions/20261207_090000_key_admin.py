"""API keys an operator can list, disable and rotate, audited; operators assigned to
tenants (issue 25, items 10 and 11; R-AUTH-1, R-READ-5, R-OPS-7).

Revision ID: 20261207_090000_key_admin
Revises: 20261206_090000_claim_events
Create Date: 2026-12-07 09:00:00

- ``api_keys.key_id``: a public name for a key (``key_`` and the first 12 hex digits of
  its SHA-256), generated from the stored hash: listing, disabling and rotating name a
  key by it, so neither the key nor its full hash is ever shown.
- ``api_keys.expires_at``: a rotated key stays valid until then (a grace period for
  clients to switch); ``qimpl_authenticate`` and ``qimpl_authenticate_operator`` refuse
  a key past it, as they refuse a revoked (disabled) key.
- A disabled key stays disabled: ``revoked_at`` never goes back to NULL, and a key's
  tenant, principal, role and hash never change (``qimpl_api_key_guard``, QG016).
- ``operator_tenants``: the further tenants an operator key is assigned to, besides its
  own; ``qimpl_operator_tenants(hash)`` answers them (its own first) for a live operator
  key only. The application role reads neither table.
- ``api_key_audit``: one row per creation, disable, expiry change, tenant assignment
  and unassignment, written by triggers on the two tables (so a write from psql is
  audited too), with the actor (``qimpl.actor`` of the writing transaction, else the
  session's user) on the database's clock. Append-only (QG017).
"""

from alembic import op

revision = "20261207_090000_key_admin"
down_revision = "20261206_090000_claim_events"
branch_labels = None
depends_on = None

#: Every trigger and SECURITY DEFINER function's search path, temporary relations last
#: (as since 20261201_100000_hardening).
SAFE_PATH = "SET search_path = pg_catalog, public, pg_temp"



def _authenticate(expiry: bool) -> str:
    """Both authentication functions whole; with ``expiry`` they refuse expired keys."""
    live = "k.revoked_at IS NULL" + (
        " AND (k.expires_at IS NULL OR k.expires_at > pg_catalog.clock_timestamp())" if expiry else "")
    return f"""
CREATE OR REPLACE FUNCTION public.qimpl_authenticate(p_key_hash text)
RETURNS TABLE (tenant_id text, principal_id text)
LANGUAGE sql STABLE SECURITY DEFINER {SAFE_PATH} AS $$
    SELECT k.tenant_id, k.principal_id FROM public.api_keys k
    WHERE k.key_hash = p_key_hash AND {live}
$$;
CREATE OR REPLACE FUNCTION public.qimpl_authenticate_operator(p_key_hash text)
RETURNS TABLE (tenant_id text, principal_id text)
LANGUAGE sql STABLE SECURITY DEFINER {SAFE_PATH} AS $$
    SELECT k.tenant_id, k.principal_id FROM public.api_keys k
    WHERE k.key_hash = p_key_hash AND {live} AND k.role = 'operator'
$$;
"""


UP_SQL = f"""
ALTER TABLE public.api_keys
    ADD COLUMN key_id text GENERATED ALWAYS AS ('key_' || left(key_hash, 12)) STORED,
    ADD COLUMN expires_at timestamp with time zone;
CREATE UNIQUE INDEX api_keys_key_id ON public.api_keys (key_id);

CREATE TABLE public.operator_tenants (
    key_hash text NOT NULL REFERENCES public.api_keys (key_hash) ON DELETE CASCADE,
    tenant_id text NOT NULL CHECK (btrim(tenant_id) <> ''),
    assigned_at timestamp with time zone NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (key_hash, tenant_id)
);

CREATE TABLE public.api_key_audit (
    id bigserial PRIMARY KEY,
    key_id text NOT NULL,
    tenant_id text NOT NULL,
    principal_id text NOT NULL,
    action text NOT NULL CHECK (action IN ('created', 'disabled', 'expiry_set',
                                           'tenant_assigned', 'tenant_unassigned')),
    actor text NOT NULL,
    detail jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    at timestamp with time zone NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX api_key_audit_key ON public.api_key_audit (key_id, id);

CREATE FUNCTION public.qimpl_api_key_guard() RETURNS trigger
LANGUAGE plpgsql {SAFE_PATH} AS $$
BEGIN
    IF OLD.revoked_at IS NOT NULL AND NEW.revoked_at IS DISTINCT FROM OLD.revoked_at THEN
        RAISE EXCEPTION 'api key %: a disabled key stays disabled', OLD.key_id USING ERRCODE = 'QG016';
    END IF;
    IF (NEW.key_hash, NEW.tenant_id, NEW.principal_id, NEW.role)
       IS DISTINCT FROM (OLD.key_hash, OLD.tenant_id, OLD.principal_id, OLD.role) THEN
        RAISE EXCEPTION 'api key %: its hash, tenant, principal and role never change', OLD.key_id
            USING ERRCODE = 'QG016';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER api_keys_guard BEFORE UPDATE ON public.api_keys
    FOR EACH ROW EXECUTE FUNCTION public.qimpl_api_key_guard();

CREATE FUNCTION public.qimpl_api_key_actor() RETURNS text
LANGUAGE sql STABLE {SAFE_PATH} AS $$
    SELECT coalesce(nullif(pg_catalog.current_setting('qimpl.actor', true), ''), session_user::text)
$$;

CREATE FUNCTION public.qimpl_audit_api_keys() RETURNS trigger
LANGUAGE plpgsql {SAFE_PATH} AS $$
BEGIN
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
CREATE TRIGGER api_keys_audit AFTER INSERT OR UPDATE ON public.api_keys
    FOR EACH ROW EXECUTE FUNCTION public.qimpl_audit_api_keys();

CREATE FUNCTION public.qimpl_audit_operator_tenants() RETURNS trigger
LANGUAGE plpgsql {SAFE_PATH} AS $$
DECLARE
    k public.api_keys;
    o public.operator_tenants;
BEGIN
    o := CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    SELECT * INTO k FROM public.api_keys WHERE key_hash = o.key_hash;
    IF FOUND THEN
        INSERT INTO public.api_key_audit (key_id, tenant_id, principal_id, action, actor, detail)
        VALUES (k.key_id, k.tenant_id, k.principal_id,
                CASE WHEN TG_OP = 'DELETE' THEN 'tenant_unassigned' ELSE 'tenant_assigned' END,
                public.qimpl_api_key_actor(), jsonb_build_object('tenant_id', o.tenant_id));
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER operator_tenants_audit AFTER INSERT OR DELETE ON public.operator_tenants
    FOR EACH ROW EXECUTE FUNCTION public.qimpl_audit_operator_tenants();

CREATE FUNCTION public.qimpl_audit_append_only() RETURNS trigger
LANGUAGE plpgsql {SAFE_PATH} AS $$
BEGIN
    RAISE EXCEPTION 'api_key_audit is append-only' USING ERRCODE = 'QG017';
END;
$$;
CREATE TRIGGER api_key_audit_append_only BEFORE UPDATE OR DELETE ON public.api_key_audit
    FOR EACH ROW EXECUTE FUNCTION public.qimpl_audit_append_only();

{_authenticate(expiry=True)}

CREATE FUNCTION public.qimpl_operator_tenants(p_key_hash text) RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER {SAFE_PATH} AS $$
    SELECT t.tenant_id FROM (
        SELECT k.tenant_id, 0 AS rank FROM public.api_keys k WHERE k.key_hash = p_key_hash
        UNION ALL
        SELECT o.tenant_id, 1 FROM public.operator_tenants o
        JOIN public.api_keys k ON k.key_hash = o.key_hash
        WHERE o.key_hash = p_key_hash AND o.tenant_id <> k.tenant_id
    ) t
    WHERE EXISTS (SELECT 1 FROM public.qimpl_authenticate_operator(p_key_hash))
    ORDER BY t.rank, t.tenant_id
$$;
REVOKE ALL ON FUNCTION public.qimpl_operator_tenants(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION public.qimpl_operator_tenants(text) TO qimpl_app;
"""

DOWN_SQL = f"""
DROP FUNCTION public.qimpl_operator_tenants(text);
{_authenticate(expiry=False)}
DROP TABLE public.api_key_audit;
DROP FUNCTION public.qimpl_audit_append_only();
DROP TABLE public.operator_tenants;
DROP FUNCTION public.qimpl_audit_operator_tenants();
DROP TRIGGER api_keys_audit ON public.api_keys;
DROP FUNCTION public.qimpl_audit_api_keys();
DROP FUNCTION public.qimpl_api_key_actor();
DROP TRIGGER api_keys_guard ON public.api_keys;
DROP FUNCTION public.qimpl_api_key_guard();
DROP INDEX public.api_keys_key_id;
ALTER TABLE public.api_keys DROP COLUMN expires_at, DROP COLUMN key_id;
"""


def upgrade() -> None:
    op.execute(UP_SQL)


#: A downgrade below this revision loses the key audit: refused while it holds rows, unless
#: the operator said so (``migrate --downgrade REV --discard-keys`` sets the setting).
REFUSE_LOSING_THE_AUDIT = """
DO $$
BEGIN
    IF coalesce(current_setting('qimpl.downgrade_discards_keys', true), '') <> 'on'
       AND EXISTS (SELECT 1 FROM public.api_key_audit) THEN
        RAISE EXCEPTION 'downgrade refused: it drops the API key audit (% rows); pass --discard-keys to drop it',
            (SELECT count(*) FROM public.api_key_audit);
    END IF;
END $$;
"""


def downgrade() -> None:
    op.execute(REFUSE_LOSING_THE_AUDIT)
    op.execute(DOWN_SQL)
