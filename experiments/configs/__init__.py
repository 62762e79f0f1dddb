"""Study configs: `get_config(variant)` per file, `--config=<file>.py[:<variant>]`."""

from collections.abc import Iterable


def check_variant(
    name: str, variant: str | None, variants: Iterable[str], *, required: bool = False
) -> None:
    """Refuses a variant that config `name` does not define (and, with `required`, none)."""
    known = list(variants)
    if variant in known or (not required and variant in (None, "")):
        return
    if required:
        raise ValueError(
            f"{name} config {variant!r}: name a variant, one of {', '.join(known)} "
            f"(e.g. --config=...{name}.py:{known[0]})."
        )
    raise ValueError(f"{name} config {variant!r}: known variants: {', '.join(known)}.")
