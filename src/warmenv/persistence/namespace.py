"""Namespaces: where in an environment one cache keeps its entries.

A namespace is the `/`-separated string `<name>/<version>/<path>`. The version
segment is what keeps a new release of an application from reading entries
an older one wrote in another shape; `preflight` reads it back to tell a
user why a bundle would not hit. It is the application's version and always
given: warmenv never substitutes its own, because upgrading warmenv must not
cold-start every application. Prefix filters (import, export, purge) match
whole segments, so `"kernels"` never matches `"kernels2/..."`.
"""

from __future__ import annotations

import attrs

from warmenv._text import is_utf8

__all__ = ["Namespace", "check_version", "matches_prefix"]


def _check_segment(label: str, value: str, *, allow_slash: bool) -> None:
    if not isinstance(value, str):
        raise TypeError(f"namespace {label} must be a str, got {type(value).__name__}")
    if not allow_slash and "/" in value:
        raise ValueError(f"namespace {label} {value!r} must not contain '/'")


def check_version(version: object, what: str = "version") -> str:
    """`version` if it can be a namespace's version segment; else one line saying why.

    The one home of the rule, for every place an application's version is
    given (`Namespace`, `import_bundle`, `warm_up`, `preflight`,
    `export_bundle`, their blocking twins, and `--app-version`): a `str`
    (`TypeError` otherwise: `1.0` the float is not `"1.0"`, and `1.10`
    would be `1.1`), non-empty, without `/` (the segment separator: `"1/2"`
    would be read back as version `1` and a path), and valid UTF-8 (it is
    stored as text). Checked where it is given, so a mistake raises at the
    call rather than in a background task or after a download. `what`
    names it in the message (`--app-version` on the command line).
    """
    if not isinstance(version, str):
        hint = repr(str(version)) if isinstance(version, int | float) else "'1.2'"
        raise TypeError(
            f"{what} must be the application's version as a str, got "
            f"{type(version).__name__} {version!r}; pass text, e.g. {hint}"
        )
    if not version:
        raise ValueError(f"{what} must not be empty: give the application's version, e.g. '1.2'")
    if "/" in version:
        raise ValueError(
            f"{what} must be one namespace segment, without '/' (a namespace is "
            f"name/version/path), got {version!r}; e.g. {version.replace('/', '-')!r}"
        )
    if not is_utf8(version):
        raise ValueError(f"{what} must be valid UTF-8 text, got {version!r}")
    return version


@attrs.frozen(init=False, repr=False)
class Namespace:
    """The location `<name>/<version>/<path>` of one cache inside an environment."""

    name: str
    path: str
    version: str
    full: str = attrs.field(eq=True)

    def __init__(self, name: str, path: str, version: str) -> None:
        if version is None:
            raise TypeError(
                f"Namespace({name!r}, {path!r}) needs a version: pass your application's"
                f' own, e.g. Namespace({name!r}, {path!r}, version="1")'
            )
        _check_segment("name", name, allow_slash=False)
        _check_segment("path", path, allow_slash=True)
        check_version(version, f"the version of namespace {name!r}")
        if not name:
            raise ValueError("a namespace needs a non-empty name")
        full = "/".join(part for part in (name, version, path.strip("/")) if part)
        self.__attrs_init__(name=name, path=path.strip("/"), version=version, full=full)

    @classmethod
    def raw(cls, full: str) -> Namespace:
        """A namespace spelled out in full, taken verbatim (no version added)."""
        if not isinstance(full, str) or not full:
            raise ValueError(f"a namespace must be a non-empty str, got {full!r}")
        name, _, rest = full.partition("/")
        version, _, path = rest.partition("/")
        made = object.__new__(cls)
        made.__attrs_init__(name=name, path=path, version=version, full=full)
        return made

    @classmethod
    def coerce(cls, namespace: Namespace | str) -> Namespace:
        """A `Namespace` as given, or a full string taken verbatim."""
        return namespace if isinstance(namespace, Namespace) else cls.raw(namespace)

    def __str__(self) -> str:
        return self.full

    def __repr__(self) -> str:
        return f"Namespace({self.full!r})"


def matches_prefix(namespace: str, prefix: str) -> bool:
    """Whether `namespace` is `prefix` or lies below it, segment by segment."""
    prefix = prefix.rstrip("/")
    if not prefix:
        return True
    return namespace == prefix or namespace.startswith(prefix + "/")


def matches_any(namespace: str, prefixes: list[str] | None) -> bool:
    """`matches_prefix` against several prefixes; `None` matches everything."""
    return prefixes is None or any(matches_prefix(namespace, p) for p in prefixes)
