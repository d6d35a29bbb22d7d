"""The tests' one reference for tag-scheme validity, written from the schemes' definitions and
independently of nerkit.data.tags (whose rules it checks): the CRF's decoded paths, stitched windows
and the transition table are all held to it."""

from __future__ import annotations


def is_valid_path(tag_set: list[str], path: list[str]) -> bool:
    """Entity state machine from the scheme's definition (not a transition table): BIO allows a new
    entity anywhere and I- only to continue one of its type; BIOES/BMES entities (any E- or S- in the
    tag set) must be opened by B- and closed by E- (or be a lone S-), with nothing else in between."""
    ends_explicit = any(tag[0] in "ES" and tag != "O" for tag in tag_set)
    open_type = None  # type of the entity the previous token belongs to and that may continue
    for tag in path:
        prefix, _, entity_type = tag.partition("-")
        prefix = "I" if prefix == "M" else prefix
        if ends_explicit:
            if prefix in ("O", "S", "B") and open_type is not None:
                return False
            if prefix in ("I", "E") and open_type != entity_type:
                return False
            open_type = entity_type if prefix in ("B", "I") else None
        else:
            if prefix == "I" and open_type != entity_type:
                return False
            open_type = None if prefix == "O" else entity_type
    return not (ends_explicit and open_type is not None)
