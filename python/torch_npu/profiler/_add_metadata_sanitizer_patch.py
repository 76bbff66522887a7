"""Metadata that cannot break ``torch.profiler``'s chrome trace, as in torch_npu.

``torch.profiler.profile.add_metadata(key, value)`` hands ``'"' + value + '"'`` (quotes
escaped, backslashes not) to Kineto, whose trace writer puts keys and values into the JSON
file as they are and turns every backslash into a slash: a value holding a quote, a
backslash or a control character makes the whole trace file unparseable. ``import
torch_npu`` wraps ``add_metadata`` / ``add_metadata_json`` of torch's ``_KinetoProfile`` so
that such characters are replaced first (quote -> apostrophe, backslash -> slash, control
characters -> space), with a ``UserWarning`` naming what was altered; clean keys and values
pass unchanged and silently. (``torch_npu.profiler.profile`` keeps its metadata itself and
writes it escaped: it needs none of this.)
"""
import json
import warnings

__all__ = []

# Characters whose JSON form holds a backslash, with what replaces them and their names.
_REPLACE = {'"': ("'", "double quote"), "\\": ("/", "backslash"), "\n": (" ", "newline"),
            "\r": (" ", "carriage return"), "\t": (" ", "tab"), "\b": (" ", "backspace"),
            "\f": (" ", "form feed")}


def _name(char):
    return _REPLACE[char][1] if char in _REPLACE else f"control character U+{ord(char):04X}"


def _sanitize_value(value):
    """``(safe, notes)``: ``value`` (as str) with every character whose JSON encoding needs a
    backslash replaced, and ``"<count> <character name>"`` per kind replaced ([] if none)."""
    text = value if isinstance(value, str) else str(value)
    counts = {}
    out = []
    for char in text:
        if char in _REPLACE or ord(char) < 0x20:
            counts[char] = counts.get(char, 0) + 1
            out.append(_REPLACE[char][0] if char in _REPLACE else " ")
        else:
            out.append(char)
    return "".join(out), [f"{n} {_name(c)}" for c, n in sorted(counts.items())]


def _sanitize_json_value(value):
    """``(safe, notes)`` for a JSON document: every string in it (keys too) sanitised, the
    document written again without escapes (``ensure_ascii=False``). Text that is not JSON
    is sanitised as a plain value."""
    text = value if isinstance(value, str) else str(value)
    try:
        document = json.loads(text)
    except (TypeError, ValueError):
        return _sanitize_value(text)
    notes = []

    def clean(node):
        if isinstance(node, str):
            safe, changed = _sanitize_value(node)
            notes.extend(changed)
            return safe
        if isinstance(node, list):
            return [clean(item) for item in node]
        if isinstance(node, dict):
            return {clean(k): clean(v) for k, v in node.items()}
        return node

    return json.dumps(clean(document), ensure_ascii=False), notes


def _warn_altered(api, key, notes, what="value"):
    warnings.warn(f"{api}({key!r}): the {what} contained characters that cannot survive the trace writer and "
                  f"was altered ({', '.join(notes)}). Writing it unchanged would produce an unparseable trace "
                  "file.", UserWarning, stacklevel=3)


def _wrap(api, original, sanitize):
    def method(self, key, value):
        safe_key, key_notes = _sanitize_value(key)
        if key_notes:
            _warn_altered(api, key, key_notes, "key")
        safe, notes = sanitize(value)
        if notes:
            _warn_altered(api, key, notes)
        return original(self, safe_key, safe)

    method.__name__ = method.__qualname__ = api
    method.__doc__ = original.__doc__
    return method


def _apply_metadata_sanitizer_patch():
    """Wraps torch.profiler's ``_KinetoProfile.add_metadata`` / ``add_metadata_json`` (once;
    calling again does nothing)."""
    from torch.profiler import profiler as torch_profiler

    target = getattr(torch_profiler, "_KinetoProfile", None)
    if target is None or getattr(target, "_npu_metadata_sanitized", False):
        return
    target.add_metadata = _wrap("add_metadata", target.add_metadata, _sanitize_value)
    target.add_metadata_json = _wrap("add_metadata_json", target.add_metadata_json, _sanitize_json_value)
    target._npu_metadata_sanitized = True
