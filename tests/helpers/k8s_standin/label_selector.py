"""Label selectors, as list, watch and delete-collection requests carry them."""
from __future__ import annotations


def parse_selector(text: str | None):
    """A label selector (``a=b,c!=d,e,!f``) as a predicate on a labels dict."""
    terms = []
    for raw in (text or "").split(","):
        term = raw.strip()
        if not term:
            continue
        if "!=" in term:
            key, value = term.split("!=", 1)
            terms.append(lambda labels, k=key.strip(), v=value.strip(): labels.get(k) != v)  # noqa: B008 - binds this term
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            terms.append(lambda labels, k=key.strip(), v=value.strip(): labels.get(k) == v)  # noqa: B008
        elif term.startswith("!"):
            terms.append(lambda labels, k=term[1:].strip(): k not in labels)  # noqa: B008
        else:
            terms.append(lambda labels, k=term: k in labels)
    return lambda labels: all(t(labels or {}) for t in terms)
