"""Operator tool for credentials: ``python -m qimpl.scripts.api_keys COMMAND ...``

    create --tenant T --principal P [--key K] [--role operator]
                                                  print a new API key (stored hashed);
                                                  an operator key reaches /v1/operator/...
    grant  --tenant T --principal P --workspace W --grant-token G
    revoke --tenant T --principal P --workspace W

Uses ``QIMPL_ADMIN_DATABASE_URL`` (the schema owner), else ``QIMPL_DATABASE_URL``.
Exit codes: 0 done, 2 database error, 64 usage error (an empty ``--grant-token`` too) or
a missing setting.
"""

from __future__ import annotations

import secrets
import sys

import psycopg

from qimpl.db import admin
from qimpl.scripts import UsageParser
from qimpl.settings import MIN_DISTINCT_CHARS, AdminSettings, key_is_secret, load_or_exit
from qimpl.settings import MIN_STATIC_KEY_CHARS as MIN_CHOSEN_KEY_CHARS

__all__ = ["main"]




def main(argv: list[str] | None = None) -> int:
    parser = UsageParser(prog="python -m qimpl.scripts.api_keys")
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
    args = parser.parse_args(argv)
    if args.command == "grant" and not args.grant_token.strip():
        parser.error("--grant-token is empty: give the credential the worker hands the provider")
    if not args.tenant.strip() or not args.principal.strip():
        parser.error("--tenant and --principal must not be empty")
    if args.command == "create" and args.key is not None and not key_is_secret(args.key):
        parser.error(f"--key needs at least {MIN_CHOSEN_KEY_CHARS} characters, {MIN_DISTINCT_CHARS} of "
                     "them different: a chosen key must still be a secret (omit --key for a random one)")
    dsn = load_or_exit(AdminSettings, "api_keys").admin_database_url
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
            if args.command == "create":
                key = args.key or secrets.token_urlsafe(32)
                try:
                    admin.create_api_key(conn, key=key, tenant_id=args.tenant,
                                         principal_id=args.principal, role=args.role)
                except ValueError as exc:
                    print(f"api_keys: {exc}", file=sys.stderr)
                    return 1
                print(key)
            elif args.command == "grant":
                admin.grant_workspace(conn, tenant_id=args.tenant, principal_id=args.principal,
                                      workspace_id=args.workspace, grant_token=args.grant_token)
            else:
                n = admin.revoke_workspace(conn, tenant_id=args.tenant, principal_id=args.principal,
                                           workspace_id=args.workspace)
                print(f"revoked {n}")
    except psycopg.Error as exc:
        print(f"api_keys: database error: {type(exc).__name__}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
