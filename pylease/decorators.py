"""``@exclusive``: run a function (or a coroutine function) under a lease.

The decorator for work that frameworks schedule (a Celery task, an APScheduler job, a
cron entry point): at most one call at a time across every process that reaches the
same database (with ``max_permits=N``, at most N: a permit of a semaphore). It is
:func:`pylease.run_exclusive` / :func:`pylease.arun_exclusive` around each call (or
their equal for a permit), with the name formatted from the call's arguments.

The lease covers the call, so only callables whose work is done when the call (or its
await) returns are accepted: a generator function's body runs while the caller iterates,
after the call returned, so generator and async generator functions (and objects whose
``__call__`` is one) are refused at decoration, and a plain function that returns a
generator, a coroutine or another awaitable is refused when it does, before that work ran.
An object whose ``__call__`` is a coroutine function is awaited under the lease.
"""

from __future__ import annotations

import functools
import inspect
import string
from collections.abc import AsyncGenerator, Callable, Coroutine, Generator, Iterator, Mapping
from typing import Any, Literal, NoReturn, ParamSpec, Protocol, TypeVar, cast, overload

from pylease import _checks
from pylease._types import AsyncTarget, Duration, Target
from pylease.errors import InvalidArgument
from pylease.leasing import Lease, lease, run_in
from pylease.leasing_async import AsyncLease, alease
from pylease.leasing_async import run_in as arun_in
from pylease.permits import permit
from pylease.permits_async import apermit

P = ParamSpec("P")
R = TypeVar("R")

Busy = Literal["return", "raise"]

# The options of lease()/alease() a decorator passes on (cancel_on_lost: alease only).
LEASE_OPTIONS = frozenset(
    {
        "holder",
        "wait",
        "heartbeat",
        "on_lost",
        "min_hold",
        "heartbeat_target",
        "poll_interval",
        "data",
        "on_release_requested",
    }
)
ASYNC_OPTIONS = LEASE_OPTIONS | {"cancel_on_lost"}
# With max_permits, permit()'s: no min_hold, no data (a lease's), and how many permits
# a call holds.
PERMIT_OPTIONS = (LEASE_OPTIONS - {"min_hold", "data", "on_release_requested"}) | {"permits"}


# A generator function is refused at decoration (see the module's docstring): typed as
# a decorator that never returns.
Refused = Callable[..., Generator[Any, Any, Any] | AsyncGenerator[Any, Any]]


class ExclusiveOrNone(Protocol):
    """What ``exclusive(...)`` returns: a decorator whose functions return None when busy."""

    @overload
    def __call__(self, fn: Refused) -> NoReturn: ...

    @overload
    def __call__(
        self, fn: Callable[P, Coroutine[Any, Any, R]]
    ) -> Callable[P, Coroutine[Any, Any, R | None]]: ...

    @overload
    def __call__(self, fn: Callable[P, R]) -> Callable[P, R | None]: ...


class ExclusiveOrRaise(Protocol):
    """What ``exclusive(..., busy="raise")`` returns: its functions raise LeaseBusy."""

    @overload
    def __call__(self, fn: Refused) -> NoReturn: ...

    @overload
    def __call__(
        self, fn: Callable[P, Coroutine[Any, Any, R]]
    ) -> Callable[P, Coroutine[Any, Any, R]]: ...

    @overload
    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]: ...


@overload
def exclusive(
    target: Target | AsyncTarget,
    name: str,
    ttl: Duration,
    *,
    busy: Literal["return"] = "return",
    max_permits: int | None = None,
    **lease_options: Any,
) -> ExclusiveOrNone: ...


@overload
def exclusive(
    target: Target | AsyncTarget,
    name: str,
    ttl: Duration,
    *,
    busy: Literal["raise"],
    max_permits: int | None = None,
    **lease_options: Any,
) -> ExclusiveOrRaise: ...


def exclusive(
    target: Target | AsyncTarget,
    name: str,
    ttl: Duration,
    *,
    busy: Busy = "return",
    max_permits: int | None = None,
    **lease_options: Any,
) -> ExclusiveOrNone | ExclusiveOrRaise:
    """Run each call of the decorated function under the lease ``name``.

    ::

        @exclusive(DSN, "report-{day}", ttl="10m")
        def report(day: date) -> int: ...

        report(date(2026, 12, 1))   # None if another process is making that report

        @exclusive(DSN, "export-{tenant_id}", ttl="5m", max_permits=2, wait="10m")
        def export(tenant_id: int) -> None: ...   # at most 2 exports per tenant at once

    :param target: as for :func:`pylease.lease` (or :func:`pylease.alease` for a
        coroutine function): a connection, pool, URL, SQLAlchemy engine or Django
        connection. It is used at call time, never at decoration.
    :param name: the lease name, or a template formatted with the call's arguments
        by name, defaults included (``"tenant-{tenant.id}"``); ``{{`` is a literal brace.
    :param ttl: how long the lease outlives its last renewal, as for :func:`pylease.lease`.
    :param busy: ``"return"`` (default): a busy lease returns None without calling the
        function; ``"raise"``: it raises :class:`LeaseBusy`.
    :param max_permits: a concurrency cap instead of one call at a time: each call holds
        a permit of the semaphore ``name`` (:func:`pylease.permit`), at most
        ``max_permits`` of them held at once; a template gives a cap per key.
    :param lease_options: ``holder``, ``wait``, ``heartbeat``, ``on_lost``, ``min_hold``,
        ``heartbeat_target``, ``poll_interval``, ``data`` (published with each call's
        grant), ``on_release_requested``, and ``cancel_on_lost`` for coroutine
        functions, as for :func:`pylease.lease` and :func:`pylease.alease`; with
        ``max_permits``, those of :func:`pylease.permit` (``permits``, no ``min_hold``).
    :raises InvalidArgument: at decoration, a bad ttl, ``busy`` or template, a field
        the function has no parameter for, or a generator function (the lease would end
        before its body runs: hold it inside, ``with lease(...)`` around the ``yield``
        loop); at call time, a field the call cannot fill.
    :raises TypeError: an unknown lease option; at call time, a plain function that
        returned a generator, a coroutine or another awaitable (its work would run
        after the release), which is closed unstarted.
    """
    if busy not in ("return", "raise"):
        raise InvalidArgument('pylease: busy must be "return" or "raise"', parameter="busy")
    _checks.ttl(ttl)
    known = ASYNC_OPTIONS
    if max_permits is not None:
        limit = _checks.max_permits(max_permits)
        if "permits" in lease_options:
            _checks.count("permits", lease_options["permits"], limit, "max_permits")
        known = PERMIT_OPTIONS | {"cancel_on_lost"}
        lease_options = {**lease_options, "max_permits": limit}
    unknown = set(lease_options) - known - {"max_permits"}
    if unknown:
        raise TypeError(f"exclusive() got unexpected lease options: {', '.join(sorted(unknown))}")
    fields = _template_fields(name)
    # What each call holds: a lease, or a permit of a semaphore. The target is either
    # kind (Target or AsyncTarget): the block's own check tells a wrong one.
    block, ablock = (lease, alease) if max_permits is None else (permit, apermit)
    target_: Any = target

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(fn):
            raise InvalidArgument("pylease: exclusive() decorates a callable", parameter="fn")
        kind = _kind(fn)
        if kind in ("generator", "async generator"):
            raise InvalidArgument(
                f"pylease: exclusive() cannot decorate {_qualname(fn)}, a {kind} function:"
                " its body runs while the caller iterates, after the call (and the lease)"
                " ended; hold the lease inside it (`with lease(...)` around the loop that"
                " yields) or decorate the function that consumes it",
                parameter="fn",
            )
        lease_name = _namer(fn, name, fields)
        if kind == "coroutine":

            def aopen(name: str) -> AsyncLease:
                return ablock(target_, name, ttl, **lease_options)

            return _async_wrapper(fn, aopen, lease_name, busy)
        if "cancel_on_lost" in lease_options:
            raise TypeError("exclusive(): cancel_on_lost is for coroutine functions only")

        def open_(name: str) -> Lease:
            return block(target_, name, ttl, **lease_options)

        return _sync_wrapper(fn, open_, lease_name, busy)

    # Typed by its overloads: one that never returns (a generator function is refused).
    return cast(ExclusiveOrNone | ExclusiveOrRaise, decorate)


def _sync_wrapper(
    fn: Callable[..., Any],
    open_block: Callable[[str], Lease],
    lease_name: Callable[[tuple[Any, ...], dict[str, Any]], str],
    busy: Busy,
) -> Callable[..., Any]:
    def call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return _done(fn, fn(*args, **kwargs))

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        cm = open_block(lease_name(args, kwargs))
        if busy == "raise":
            with cm:
                return call(args, kwargs)
        return run_in(cm, lambda: call(args, kwargs)).result

    return wrapper


def _async_wrapper(
    fn: Callable[..., Any],
    open_block: Callable[[str], AsyncLease],
    lease_name: Callable[[tuple[Any, ...], dict[str, Any]], str],
    busy: Busy,
) -> Callable[..., Any]:
    # An object whose __call__ is a coroutine function is wrapped as that method is,
    # so the wrapper is a coroutine function with its signature.
    wrapped = fn if inspect.iscoroutinefunction(fn) else getattr(fn, "__call__", fn)  # noqa: B004

    @functools.wraps(wrapped)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        cm = open_block(lease_name(args, kwargs))
        if busy == "raise":
            async with cm:
                return await fn(*args, **kwargs)
        return (await arun_in(cm, lambda: fn(*args, **kwargs))).result

    return wrapper


def _calls(fn: Callable[..., Any]) -> Iterator[Callable[..., Any]]:
    """What a call of ``fn`` runs: ``fn``, and for a callable object its ``__call__``."""
    yield fn
    inner = fn
    while isinstance(inner, functools.partial):
        inner = inner.func
    if not (inspect.isroutine(inner) or inspect.isclass(inner)):
        call = getattr(inner, "__call__", None)  # noqa: B004 (the method itself is wanted)
        if call is not None:
            yield call


def _kind(fn: Callable[..., Any]) -> str:
    """``coroutine``, ``generator``, ``async generator`` or ``plain``: what calling gives."""
    for call in _calls(fn):
        if inspect.isasyncgenfunction(call):
            return "async generator"
        if inspect.isgeneratorfunction(call):
            return "generator"
        if inspect.iscoroutinefunction(call):
            return "coroutine"
    return "plain"


def _qualname(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "__qualname__", None) or type(fn).__qualname__) + "()"


def _done(fn: Callable[..., Any], result: Any) -> Any:
    """``result``, unless it is work still to be done: refused, and closed unstarted."""
    if inspect.isgenerator(result) or inspect.iscoroutine(result):
        result.close()
    elif not (inspect.isasyncgen(result) or inspect.isawaitable(result)):
        return result
    raise TypeError(
        f"pylease: {_qualname(fn)} decorated with exclusive() returned"
        f" {type(result).__name__!r}, whose work would run after the lease is released;"
        " decorate the function that runs it (a coroutine function is awaited under the"
        " lease)"
    )


def _template_fields(template: object) -> list[str]:
    """The root names of a template's fields (``tenant`` for ``{tenant.id}``)."""
    if not isinstance(template, str):
        _checks.key("name", template)  # raises for a non-str
    assert isinstance(template, str)
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise InvalidArgument(
            f"pylease: name {template!r} is not a valid template: {exc}", parameter="name"
        ) from None
    roots = []
    for _text, field, _spec, _conversion in parsed:
        if field is None:
            continue
        root = field.partition(".")[0].partition("[")[0]
        if not root or root.isdigit():
            raise InvalidArgument(
                f"pylease: name {template!r} has a positional field; name the parameter, "
                'as in "report-{day}"',
                parameter="name",
            )
        roots.append(root)
    return roots


def _namer(
    fn: Callable[..., Any], template: str, fields: list[str]
) -> Callable[[tuple[Any, ...], dict[str, Any]], str]:
    """How a call's arguments become its lease name."""
    if not fields:
        constant = _checks.key("name", template.replace("{{", "{").replace("}}", "}"))
        return lambda _args, _kwargs: constant
    signature = inspect.signature(fn)
    params = signature.parameters
    var_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    missing = [f for f in fields if f not in params and not var_keyword]
    if missing:
        raise InvalidArgument(
            f"pylease: name {template!r} uses {', '.join(missing)}, which "
            f"{_qualname(fn)} has no parameter for",
            parameter="name",
        )

    def lease_name(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values: dict[str, Any] = {}
        for param_name, value in bound.arguments.items():
            if params[param_name].kind is inspect.Parameter.VAR_KEYWORD:
                values.update(value)
            else:
                values[param_name] = value
        return _checks.key("name", _format(template, values))

    return lease_name


def _format(template: str, values: Mapping[str, Any]) -> str:
    try:
        return template.format_map(values)
    except KeyError as exc:
        raise InvalidArgument(
            f"pylease: name {template!r}: this call gives no {exc.args[0]}", parameter="name"
        ) from None
    except (AttributeError, IndexError, TypeError, ValueError) as exc:
        raise InvalidArgument(
            f"pylease: name {template!r} cannot be formatted for this call: {exc}",
            parameter="name",
        ) from None
