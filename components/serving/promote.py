"""Promote a registered version by hand: ``python -m components.serving.promote NAME VERSION``.

The alias alone is anyone's to move, so llmpack's loader trusts ``@champion`` only with the signed
promotion record (:func:`components.serving.signed.champion_tags`) the register step writes. This writes
that record for a version the user chooses (after changing the eval set, say), with the user's key, once
the version's own signature checks out, then moves ``champion`` to it. Bad input (no such version, a
version not signed with this key) is one line, exit 2, and nothing is changed.
"""

from __future__ import annotations

import sys

from components.errors import InputError


def promote(name: str, version: str, *, tracking_uri: str | None = None) -> None:
    """Make ``version`` of ``name`` champion, as the register step would: record signed first, alias after."""
    from components.serving import promotion, registry_store, signed

    if not version.isdigit():
        raise InputError(f"VERSION {version!r}: a registered version number (1, 2, ...)")
    mc = registry_store.client(registry_store.store_uri(tracking_uri))
    try:
        mv = mc.get_model_version(name, version)
    except Exception as exc:  # noqa: BLE001 - MLflow's error for a missing model or version, or no store: one line
        raise registry_store.lookup_error(f"models:/{name}/{version}", exc) from None
    run_id = str(mv.run_id or "")
    signed.verified_version(f"models:/{name}/{version}", name=name, version=version, run_id=run_id,
                            source=str(mv.source or ""), tags=dict(mv.tags or {}))  # only a version this key signed
    for key, value in signed.champion_tags(name, version, run_id).items():
        promotion.set_model_tag(mc, name, key, value)
    mc.set_registered_model_alias(name, promotion.CHAMPION, version)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m components.serving.promote NAME VERSION", file=sys.stderr)
        return 2
    from components.serving.registry_store import bound_retries

    bound_retries()
    try:
        promote(args[0], args[1])
    except InputError as exc:
        from components.redaction import printable

        print(f"llmpack: error: {printable(str(exc), 4000)}", file=sys.stderr)
        return 2
    print(f"models:/{args[0]}@champion -> version {args[1]} (signed with your key)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
