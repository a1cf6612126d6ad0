"""Operator tool for credentials: ``python -m qimpl.scripts.api_keys COMMAND ...``

    create   --tenant T --principal P [--key K] [--role operator]
                                        print a new API key (stored hashed; its key_id on stderr);
                                        an operator key reaches /v1/operator/...
    list     [--tenant T] [--principal P] [--all] [--json]
                                        keys by key_id, never the key (--all: disabled, expired too)
    disable  --key-id K                 the key is refused from the next request, for good
    rotate   --key-id K [--grace-seconds S]
                                        print a new key for the same principal; the old one is
                                        disabled at once, or after S seconds
    assign   --key-id K --tenant T      an operator key also reaches tenant T's runs
    unassign --key-id K --tenant T
    audit    [--key-id K] [--limit N] [--json]
                                        who created, disabled, rotated or assigned which key, when
    grant    --tenant T --principal P --workspace W --grant-token G
    revoke   --tenant T --principal P --workspace W

Every key write is audited with ``--actor`` (default: the operating-system user).
Uses ``QIMPL_ADMIN_DATABASE_URL`` (the schema owner), else ``QIMPL_DATABASE_URL``.
Exit codes: 0 done, 1 refused (an unknown key id, a disabled key to rotate, ...), 2
database error, 64 usage error (an empty ``--grant-token`` too) or a missing setting.
"""

from __future__ import annotations

import getpass
import json
import secrets
import sys
from typing import Any

import psycopg

from qimpl.db import admin
from qimpl.db.connect_errors import connect_problem
from qimpl.scripts import UsageParser, piped
from qimpl.settings import (
    MIN_DISTINCT_CHARS,
    AdminSettings,
    key_is_secret,
    load_or_exit,
    tenant_problem,
)
from qimpl.settings import MIN_STATIC_KEY_CHARS as MIN_CHOSEN_KEY_CHARS

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = UsageParser(prog="python -m qimpl.scripts.api_keys")
    parser.add_argument("--actor", default=_os_user(), help="who is acting, for the audit")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("create", "grant", "revoke"):
        p = sub.add_parser(name)
        p.add_argument("--tenant", required=True)
        p.add_argument("--principal", required=True)
        if name == "create":
            p.add_argument("--key", help="use this key instead of a random one (tests only)")
            p.add_argument("--role", choices=("client", "operator"), default="client",
                           help="operator: the journal's reconciliation routes (R-OPS-7)")
        else:
            p.add_argument("--workspace", required=True)
        if name == "grant":
            p.add_argument("--grant-token", required=True)
    p = sub.add_parser("list")
    p.add_argument("--tenant")
    p.add_argument("--principal")
    p.add_argument("--all", action="store_true", help="disabled and expired keys too")
    p.add_argument("--json", action="store_true")
    for name in ("disable", "rotate", "assign", "unassign"):
        p = sub.add_parser(name)
        p.add_argument("--key-id", required=True)
        if name == "rotate":
            p.add_argument("--grace-seconds", type=float, default=0.0,
                           help="keep the old key valid this long (seconds, default 0)")
        if name in ("assign", "unassign"):
            p.add_argument("--tenant", required=True)
    p = sub.add_parser("audit")
    p.add_argument("--key-id")
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "grant" and not args.grant_token.strip():
        parser.error("--grant-token is empty: give the credential the worker hands the provider")
    if args.command in ("create", "grant", "revoke") and (not args.tenant.strip() or not args.principal.strip()):
        parser.error("--tenant and --principal must not be empty")
    if args.command in ("create", "grant", "assign") and (problem := tenant_problem(args.tenant)):
        parser.error(f"--tenant {problem}")
    if args.command == "rotate" and not 0 <= args.grace_seconds <= 30 * 86400:
        parser.error("--grace-seconds must be between 0 and 2592000 (30 days)")
    if args.command == "audit" and not 1 <= args.limit <= 10000:
        parser.error("--limit must be between 1 and 10000")
    if args.command == "create" and args.key is not None and not key_is_secret(args.key):
        parser.error(f"--key needs at least {MIN_CHOSEN_KEY_CHARS} characters, {MIN_DISTINCT_CHARS} of "
                     "them different: a chosen key must still be a secret (omit --key for a random one)")
    dsn = load_or_exit(AdminSettings, "api_keys").admin_database_url
    try:
        conn = psycopg.connect(dsn, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        print(f"api_keys: {connect_problem(exc).summary}", file=sys.stderr)
        return 2
    try:
        with conn:
            return _run(conn, args)
    except psycopg.Error as exc:
        print(f"api_keys: database error: {type(exc).__name__}", file=sys.stderr)
        return 2


#: A tenant not swept for this long (seconds) gets a warning at key creation; a
#: reconciler sweeps every ``QIMPL_RECONCILE_INTERVAL_S`` (5 s by default).
UNSWEPT_WARNING_S = 300.0


def _warn_unswept(conn: psycopg.Connection[Any], tenant: str) -> None:
    """Warn (stderr) when no reconciler swept ``tenant`` lately: the key works, but the
    tenant's orphaned dispatches and overdue runs wait for a worker that lists it."""
    try:
        age = admin.last_sweep_age_s(conn, tenant)
    except psycopg.Error as exc:  # advisory only: the key is created and printed already
        print(f"api_keys: could not check the tenant's reconciler sweeps ({type(exc).__name__})",
              file=sys.stderr)
        return
    if age is not None and age <= UNSWEPT_WARNING_S:
        return
    lately = "ever (on record)" if age is None else f"for {age:.0f} s"
    print(f"api_keys: warning: no reconciler has swept tenant {tenant!r} {lately}: add it to"
          " DURABLE_AGENT_RECONCILE_TENANTS of at least one worker, or its orphaned dispatches"
          " stay accepted and its overdue runs never expire (docs/operations.md, \"Tenant list\")",
          file=sys.stderr)


def _run(conn: psycopg.Connection[Any], args: Any) -> int:
    try:
        if args.command == "create":
            key = args.key or secrets.token_urlsafe(32)
            admin.create_api_key(conn, key=key, tenant_id=args.tenant, principal_id=args.principal,
                                 role=args.role, actor=args.actor)
            print(key)
            print(f"key_id {admin.key_id(key)}", file=sys.stderr)
            _warn_unswept(conn, args.tenant)
        elif args.command == "list":
            rows = admin.list_api_keys(conn, tenant_id=args.tenant, principal_id=args.principal,
                                       include_disabled=args.all)
            _print(rows, args.json, ("key_id", "tenant_id", "principal_id", "role", "state",
                                     "created_at", "expires_at", "revoked_at", "tenants"))
        elif args.command == "disable":
            changed = admin.disable_api_key(conn, key_id=args.key_id, actor=args.actor)
            print(f"disabled {args.key_id}" if changed else f"{args.key_id} was already disabled")
        elif args.command == "rotate":
            key = secrets.token_urlsafe(32)
            new_id = admin.rotate_api_key(conn, key_id=args.key_id, new_key=key, actor=args.actor,
                                          grace_s=args.grace_seconds)
            print(key)
            when = "now" if args.grace_seconds == 0 else f"in {args.grace_seconds:g} s"
            print(f"key_id {new_id}; {args.key_id} stops working {when}", file=sys.stderr)
        elif args.command in ("assign", "unassign"):
            act = admin.assign_tenant if args.command == "assign" else admin.unassign_tenant
            changed = act(conn, key_id=args.key_id, tenant_id=args.tenant, actor=args.actor)
            print(f"{args.command}ed {args.tenant}" if changed else "no change")
        elif args.command == "audit":
            _print(admin.key_audit(conn, key_id=args.key_id, limit=args.limit), args.json,
                   ("at", "key_id", "tenant_id", "principal_id", "action", "actor", "detail"))
        elif args.command == "grant":
            admin.grant_workspace(conn, tenant_id=args.tenant, principal_id=args.principal,
                                  workspace_id=args.workspace, grant_token=args.grant_token)
        else:
            n = admin.revoke_workspace(conn, tenant_id=args.tenant, principal_id=args.principal,
                                       workspace_id=args.workspace)
            print(f"revoked {n}")
            if n == 0:  # idempotent, but a typo must not look like a revocation
                print(f"api_keys: warning: no live grant for tenant {args.tenant!r}, principal"
                      f" {args.principal!r}, workspace {args.workspace!r} (already revoked, or never"
                      " granted: names are case-sensitive)", file=sys.stderr)
    except admin.KeyNotFound as exc:
        print(f"api_keys: no key with key_id {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"api_keys: {exc}", file=sys.stderr)
        return 1
    return 0


def _print(rows: list[dict[str, Any]], as_json: bool, columns: tuple[str, ...]) -> None:
    if as_json:
        print(json.dumps(rows, default=_json_default, indent=1))
        return
    cells = [[_cell(r[c]) for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    for row in [list(columns), *cells]:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def _json_default(value: Any) -> Any:
    """Times as ISO 8601 (``2026-12-03T07:17:52.030000+00:00``)."""
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list | tuple):
        return ",".join(map(str, value)) or "-"
    if isinstance(value, dict):
        return json.dumps(value, default=str, sort_keys=True)
    if hasattr(value, "isoformat"):
        return str(value.isoformat(timespec="seconds"))
    return str(value)


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


if __name__ == "__main__":
    sys.exit(piped(main))
